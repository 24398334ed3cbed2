"""Compile, while pip installs them, the Python files a first server start imports, so that the start does not.

    python compile_ahead.py        (the editors' setups run it with the new environment's Python, after torch)

The setups install with pip's --no-compile: pip would compile every module of torch and transformers, minutes on a
small CPU. So Python compiles each module a server imports at the first start instead, seconds of that start on a
2-core machine (docs/cpu.md). This runs beside pip, at a lower priority, on the core pip leaves idle. It compiles
the files that startup-modules.txt lists (tools/startup_modules.py writes it) as pip puts them in place, and
stops once pip has installed speccomplete itself (it goes in last), once all are compiled, or after DEADLINE_S.

A cached module names its source's size and time, so a file compiled while pip was still writing it is compiled
again at its import, as is one this never reached: the start is never worse than without this.
"""

from __future__ import annotations

import argparse
import os
import py_compile
import sys
import sysconfig
import time
from pathlib import Path

LIST = Path(__file__).with_name("startup-modules.txt")
POLL_S = 0.5
SETTLED_S = 1.0  # a file written this recently may still be being written: compiled on a later pass
DEADLINE_S = 900.0  # a pip that failed or hangs: stop anyway


def compile_present(site: Path, pending: list[str], final: bool) -> tuple[list[str], int]:
    """Compile the pending files that are in place; returns those still pending and how many were compiled.
    On the `final` pass every file in place is tried once, however new."""
    left, compiled = [], 0
    settled = time.time() - SETTLED_S
    for relative in pending:
        source = site / relative
        try:
            if not final and source.stat().st_mtime > settled:
                left.append(relative)
                continue
            py_compile.compile(str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
            compiled += 1
        except FileNotFoundError:
            left.append(relative)
        except (py_compile.PyCompileError, OSError):
            if not final:  # maybe read half-written: tried again
                left.append(relative)
    return left, compiled


def speccomplete_installed(site: Path, since: float) -> bool:
    """Whether pip has installed speccomplete since `since`: its record is written once its files are in."""
    return any(record.stat().st_mtime >= since for record in site.glob("speccomplete-*.dist-info/RECORD"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path(sysconfig.get_paths()["purelib"]), help="site-packages")
    parser.add_argument("--list", type=Path, default=LIST, help="the files to compile, relative to --site")
    args = parser.parse_args(argv)
    if hasattr(os, "nice"):
        os.nice(10)
    began = time.time()
    listed = args.list.read_text().split()
    pending, compiled = listed, 0
    while pending and time.time() - began < DEADLINE_S:
        final = speccomplete_installed(args.site, began)
        pending, now = compile_present(args.site, pending, final)
        compiled += now
        if final:
            break
        time.sleep(POLL_S)
    print(
        f"compiled {compiled} of the {len(listed)} files a server start imports in {time.time() - began:.1f} s; "
        f"{sum(not (args.site / relative).is_file() for relative in pending)} of them are not installed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
