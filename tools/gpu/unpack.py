"""The Python that gpu/unpack.sh runs on the machine, one subcommand a step (docs/gpu.md):

    python tools/gpu/unpack.py stage-map PYPROJECT          # "SUBPACKAGE FOLDER" per line: the package's links
    python tools/gpu/unpack.py load-info LOAD.JSON          # "PACK LOAD LOADS MODEL-NAME GGUF-FILE" of one load
    python tools/gpu/unpack.py convert GGUF OUT             # the GGUF through transformers (decoder/models.py)
    python tools/gpu/unpack.py facts PKG [WHEEL...]         # the package imports from PKG with the carried wheels

unpack.sh runs it by its path with PYTHONSAFEPATH set, so the repo root, whose speccomplete/ lacks the mapped
subpackages, stays off the path: this file imports nothing of the repo at its top, only the standard library.
`convert` and `facts` import our package from the staged pkg/ that unpack.sh puts on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path


def stage_map(pyproject: Path) -> list[tuple[str, str]]:
    """(subpackage, folder) of pyproject.toml's package-dir: pkg/speccomplete/SUBPACKAGE links to the repo's FOLDER."""
    with open(pyproject, "rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return [(package.split(".", 1)[1], folder) for package, folder in package_dir.items()]


def load_info(load_json: Path) -> tuple[str, int, int, str, str]:
    """What unpack.sh needs of a load's load.json (tools/gpu/pack.py writes it)."""
    load = json.loads(load_json.read_text())
    return load["pack"], load["load"], load["loads"], load["model"]["name"], load["model"]["file"]


def convert(gguf: str, out: str) -> None:
    """The GGUF into a safetensors folder through transformers: where no meta was carried, or it failed."""
    from speccomplete.decoder.models import convert_gguf

    convert_gguf(gguf, out)


def facts(pkg: str, wheels: list[str]) -> list[str]:
    """After the last load: our package, and everything its commands import at load time, imports from `pkg` with
    the carried wheels; the versions and the device, as lines for the report. Raises where it comes from elsewhere."""
    import importlib.metadata as metadata

    import torch
    import transformers

    import speccomplete.cli  # noqa: F401  our package, and everything its commands import at load time
    import speccomplete.decoder

    lines = [f"package: {speccomplete.decoder.__file__}"]
    if not speccomplete.decoder.__file__ or not speccomplete.decoder.__file__.startswith(pkg):
        raise RuntimeError(f"our package comes from elsewhere: {speccomplete.decoder.__file__}, not {pkg}")
    lines.append(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
    lines += [f"wheel {name} {metadata.version(name)}" for name in wheels]
    lines.append(f"device: {torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/gpu/unpack.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("stage-map").add_argument("pyproject", type=Path)
    sub.add_parser("load-info").add_argument("load_json", type=Path)
    p = sub.add_parser("convert")
    p.add_argument("gguf")
    p.add_argument("out")
    p = sub.add_parser("facts")
    p.add_argument("pkg")
    p.add_argument("wheels", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "stage-map":
        for sub_package, folder in stage_map(args.pyproject):
            print(sub_package, folder)
    elif args.command == "load-info":
        print(*load_info(args.load_json))
    elif args.command == "convert":
        convert(args.gguf, args.out)
    else:
        print("\n".join(facts(args.pkg, args.wheels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
