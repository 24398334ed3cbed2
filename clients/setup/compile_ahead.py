"""Compile, while pip installs them, the Python files a first server start imports, so that the start does not.

    python compile_ahead.py        (the editors' setups run it with the new environment's Python, in the background,
                                    as the pip step that installs speccomplete begins)

The setups install with pip's --no-compile: pip would compile every module of torch and transformers, tens of seconds
on a small CPU. So Python compiles each module a server imports at the first start instead, seconds of that start on
a 2-core machine (docs/cpu.md). This runs beside pip, at a lower priority, on the core pip leaves idle. It compiles
the files that startup-modules.txt lists (tools/startup_modules.py writes it) as pip puts them in place, and stops
once pip has installed speccomplete itself (it goes in last), once all are compiled, when its parent is gone, or
after IDLE_S with no listed file arriving.

A cached module names its source's size and time. A file is compiled only when those stay the same from before its
read to after its bytecode is written (else the bytecode is removed and the file tried again), so the server never
runs bytecode of another version of a file; what this leaves, the server compiles as before. Bytecode that already
matches its file (a repaired environment) is kept as it is.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import py_compile
import sys
import sysconfig
import time
import warnings
from pathlib import Path

LIST = Path(__file__).with_name("startup-modules.txt")
POLL_S = 0.5
SETTLED_S = 1.0  # a file written this recently may still be being written: compiled on a later pass
IDLE_S = 900.0  # no listed file arrived for this long (a pip that failed, or hangs): stop
SPECCOMPLETE = "speccomplete-*.dist-info"  # speccomplete's record of its install, in site-packages


def stamp(source: Path) -> tuple[int, int]:
    """What a cached module is checked against (its file's time and size), to the nanosecond."""
    stat = source.stat()
    return stat.st_mtime_ns, stat.st_size


def compiled_already(source: Path, mtime_ns: int, size: int) -> bool:
    """Whether `source`'s cached bytecode is this Python's and names the file's present time and size."""
    try:
        with open(importlib.util.cache_from_source(str(source)), "rb") as cached:
            header = cached.read(16)
    except OSError:
        return False
    return (
        header[:4] == importlib.util.MAGIC_NUMBER
        and int.from_bytes(header[4:8], "little") == 0  # checked by time and size, as imports write it
        and int.from_bytes(header[8:12], "little") == (mtime_ns // 1_000_000_000) & 0xFFFFFFFF
        and int.from_bytes(header[12:16], "little") == size & 0xFFFFFFFF
    )


class CompileAhead:
    """The listed files not yet compiled, and the passes over them."""

    def __init__(self, site: Path, listed: list[str]):
        self.site = site
        self.pending = listed
        self.failed: dict[str, tuple[int, int]] = {}  # a file that did not compile, and its stamp then
        self.compiled = 0  # files whose bytecode matches them: compiled here, or before this ran

    def compile_present(self, final: bool) -> None:
        """Compile the pending files that are in place and settled; on the `final` pass every file in place is
        tried, however new, and those that fail are given up."""
        left = []
        settled_ns = time.time_ns() - int(SETTLED_S * 1e9)
        for relative in self.pending:
            source = self.site / relative
            try:
                before = stamp(source)
            except OSError:
                left.append(relative)  # not installed yet
                continue
            if compiled_already(source, *before):
                self.compiled += 1
                continue
            if (not final and before[0] > settled_ns) or self.failed.get(relative) == before:
                left.append(relative)  # maybe still being written; or failed as it is now
                continue
            if self.compile(source, before):
                self.compiled += 1
                self.failed.pop(relative, None)
            elif not final:
                self.failed[relative] = before
                left.append(relative)
        self.pending = left

    @staticmethod
    def compile(source: Path, before: tuple[int, int]) -> bool:
        """Compile `source`; False where it did not compile, or changed meanwhile (its bytecode then removed)."""
        try:
            cached = py_compile.compile(
                str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP
            )
            if stamp(source) == before:
                return True
            if cached is not None:
                os.remove(cached)  # read from one version of the file, stamped with another's time and size
        except (py_compile.PyCompileError, OSError):
            pass
        return False


def speccomplete_installed(site: Path, since: float) -> bool:
    """Whether pip has installed speccomplete since `since`: its record is written once its files are in."""
    return any(record.stat().st_mtime >= since for record in site.glob(f"{SPECCOMPLETE}/RECORD"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", type=Path, default=Path(sysconfig.get_paths()["purelib"]), help="site-packages")
    parser.add_argument("--list", type=Path, default=LIST, help="the files to compile, relative to --site")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # a module's SyntaxWarnings: its import says them, not this
    if hasattr(os, "nice"):
        os.nice(10)
    began = time.time()
    parent = os.getppid()
    if os.name == "nt" and any(args.site.glob(SPECCOMPLETE)):
        # pip replaces an installed speccomplete's files, and Windows refuses that while a file is open here
        print("left to the server: an environment with speccomplete installed, on Windows")
        return 0
    listed = args.list.read_text().split()
    ahead = CompileAhead(args.site, listed)
    last_progress, waiting = began, len(listed)
    while ahead.pending:
        final = speccomplete_installed(args.site, began)
        ahead.compile_present(final)
        if final or os.getppid() != parent:
            break
        if len(ahead.pending) < waiting:
            last_progress, waiting = time.time(), len(ahead.pending)
        elif time.time() - last_progress > IDLE_S:
            break
        time.sleep(POLL_S)
    missing = sum(not (args.site / relative).exists() for relative in ahead.pending)
    print(
        f"compiled {ahead.compiled} of the {len(listed)} files a server start imports in {time.time() - began:.1f} s; "
        f"{missing} of them are not installed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
