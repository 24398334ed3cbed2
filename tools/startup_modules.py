"""List the Python files a first server start imports, for the editors' setups to compile ahead
(clients/setup/compile_ahead.py): clients/setup/startup-modules.txt, one path under site-packages a line, in the
order the start imported them.

    python -m tools.startup_modules

It converts the default model as a first start does (into a scratch folder), then starts `specdec serve`, both with
Python's import profile on (PYTHONPROFILEIMPORTTIME); the server loads the default model and answers the first
bundled case. It keeps each imported module that is a source file in speccomplete (as a wheel installs it) or in a
distribution that speccomplete requires, directly or not (not the test and analysis extras of this environment).
Run it again when the dependencies or the server's imports change: a stale list only means that less is compiled
ahead.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
from collections import deque
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pygls.lsp.client import LanguageClient

from speccomplete.decoder.packaged import DEFAULT_TARGET, PACKAGED, shipped_meta
from speccomplete.harness.eval import run_case
from speccomplete.harness.lib.cases import read_cases
from speccomplete.harness.lib.session import Session, connect, server_command, stop_session

REPO = Path(__file__).resolve().parent.parent
LIST = REPO / "clients" / "setup" / "startup-modules.txt"
CASES = REPO / "docs" / "examples" / "cases.jsonl"
# what a new venv holds already: pip may uninstall and replace it while the list is compiled, so it is left out
IN_A_NEW_VENV = {"pip", "setuptools"}


def profiled_names(stderr_lines) -> list[str]:
    """The modules named in Python's import profile, in the order their imports ended."""
    names = []
    for line in stderr_lines:
        if line.startswith("import time:") and "|" in line:
            name = line.rsplit("|", 1)[1].strip()
            if name != "imported package":
                names.append(name)
    return names


def conversion_names() -> list[str]:
    """The modules that a first start's conversion of the default model (packaged.convert_ahead) imports."""
    gguf, meta = PACKAGED[DEFAULT_TARGET].gguf_path(), shipped_meta(DEFAULT_TARGET)
    if meta is None:
        raise RuntimeError(f"{DEFAULT_TARGET} has no shipped meta: its first start converts through transformers")
    with tempfile.TemporaryDirectory(prefix="specdec-startup-modules-") as scratch:
        command = [sys.executable, "-X", "importtime", "-m", "speccomplete.decoder.gguf_safetensors"]
        converted = subprocess.run(
            [*command, str(gguf), str(meta), str(Path(scratch) / "model")], capture_output=True, text=True, check=True
        )
    return profiled_names(converted.stderr.splitlines())


def required_distributions(root: str = "speccomplete") -> set[str]:
    """The distributions `root` requires, directly or not, on this Python and without extras (normalized names)."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requirements = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requirements:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


async def server_names() -> list[str]:
    """The modules a server start and its first answer import, in the order their imports ended."""
    session = Session(LanguageClient("specdec-startup-modules", "0.1.0"), stderr=deque())
    env = os.environ | {"PYTHONPROFILEIMPORTTIME": "1"}
    try:
        status = await connect(session, server_command(), {}, 900, env=env)
        if status["state"] != "ready":
            raise RuntimeError(f"the server could not load its models: {status.get('message')}")
        answer = await run_case(session, 0, read_cases(CASES)[0], 300)
        if answer.status != "ok":
            raise RuntimeError(f"the server did not answer the first case: {answer.status} {answer.detail}")
    finally:
        await stop_session(session)
    return profiled_names(session.stderr)


def installed_path(name: str, site: Path) -> str | None:
    """Where a wheel puts module `name`'s source, relative to site-packages; None for what is no source file
    there (the standard library, an extension module, a module made at run time)."""
    relative = Path(*name.split("."))
    if name.startswith("__editable__"):  # this checkout's editable install: a wheel has none
        return None
    if name.split(".")[0] == "speccomplete":  # this checkout's files, installed under speccomplete/
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        origin = spec.origin if spec else None
        if not origin or not origin.endswith(".py"):
            return None
        return (relative / "__init__.py" if origin.endswith("__init__.py") else relative.with_suffix(".py")).as_posix()
    for candidate in (relative.with_suffix(".py"), relative / "__init__.py"):
        if (site / candidate).is_file():
            return candidate.as_posix()
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=LIST)
    args = parser.parse_args(argv)
    site = Path(sysconfig.get_paths()["purelib"])
    names = list(dict.fromkeys(conversion_names() + asyncio.run(server_names())))
    required = required_distributions()
    providers = importlib.metadata.packages_distributions()  # a top-level name -> the distributions that ship it

    def required_path(path: str) -> bool:
        top = path.split("/")[0].removesuffix(".py")
        shipped_by = {canonicalize_name(d) for d in providers.get(top, [])}
        return top == "speccomplete" or bool(shipped_by & required and not shipped_by & IN_A_NEW_VENV)

    paths = [path for path in (installed_path(name, site) for name in names) if path and required_path(path)]
    args.out.write_text("".join(f"{path}\n" for path in paths))
    print(f"{args.out}: {len(paths)} files of {len(names)} modules imported", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
