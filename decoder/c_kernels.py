"""Our C kernels (int8_rows.c, attend_rows.c) and their torch operators (torch_ops.cpp): built with the system's
compiler at first use and kept under the model cache, keyed by the source, the flags, the compiler, torch and the
OpenMP runtime.

Each C kernel links to the GNU OpenMP library torch has loaded, named by its path, so its threads are torch's and
`torch.set_num_threads` sizes them too. A build goes to a side folder that is renamed into place, so a library
in the cache is whole; two processes building at once both succeed.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from .models import cache_root


def cpu_flags() -> set[str]:
    """The CPU's feature flags, as /proc/cpuinfo lists them (none where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


@functools.cache  # the process keeps the runtime it loaded, and reading the maps of a large one is slow
def openmp_runtime() -> str | None:
    """The GNU OpenMP library this process (torch) has loaded: the kernels link to it, sharing its threads."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    paths = {line.split()[-1] for line in maps.splitlines() if "libgomp" in line and line.split()[-1].startswith("/")}
    return min(paths) if paths else None


def compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "")) or shutil.which("gcc")


def cxx_compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "")) or shutil.which("g++")


def missing() -> str:
    """What building any kernel here lacks; "" where nothing does."""
    if openmp_runtime() is None:
        return "torch does not run on GNU OpenMP here"
    if compiler() is None:
        return "no C compiler (gcc, or $CC)"
    return ""


def built(source: Path, flags: tuple[str, ...], libraries: tuple[str, ...] = ()) -> Path:
    """`source` built as a shared library with `flags`, from the cache or now: C on torch's OpenMP runtime, or C++
    (a .cpp) with the flags and libraries it names. Raises CalledProcessError (the compiler's complaint in its
    stderr) where the build fails."""
    cxx = source.suffix == ".cpp"
    cc, runtime = (cxx_compiler(), "") if cxx else (compiler(), openmp_runtime())
    assert cc is not None and runtime is not None, missing()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, check=True).stdout
    facts = (source.read_bytes(), flags, libraries, version, runtime, torch.__version__)
    key = hashlib.blake2b(repr(facts).encode(), digest_size=8)
    folder = cache_root() / "kernels" / key.hexdigest()
    library = folder / f"{source.stem}.so"
    if library.exists():
        return library
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as side:
        command = [cc, *flags, "-shared", "-fPIC", str(source), "-o", f"{side}/{library.name}", *libraries]
        if not cxx:  # -nodefaultlibs: libgomp is torch's own, named by its path, not the system's
            command += ["-nodefaultlibs", "-lc", runtime, f"-Wl,-rpath,{Path(runtime).parent}"]
        subprocess.run(command, capture_output=True, text=True, check=True)
        try:
            os.rename(side, folder)
        except OSError:  # another process built it first
            pass
    return library


def missing_on_avx2() -> str:
    """What building an AVX2 and FMA kernel here lacks; "" where nothing does."""
    if not {"avx2", "fma"} <= cpu_flags():
        return "no AVX2 and FMA on this CPU"
    return missing()


def short(error: Exception) -> str:
    """An error in a line: a compiler's last line of complaint, or the error itself."""
    lines = (getattr(error, "stderr", None) or "").strip().splitlines()
    return lines[-1] if lines else str(error)


def load(
    source: Path,
    flags: tuple[str, ...],
    *,
    libraries: tuple[str, ...] = (),
    missing: str,
    fallback: str,
    declare: Callable[[ctypes.CDLL], None],
    check: Callable[[ctypes.CDLL], bool],
    log: logging.Logger,
) -> ctypes.CDLL | None:
    """`source`'s library, built or from the cache, its functions declared and checked against torch; None where
    it cannot run, with one log line saying why. `missing`: what this machine lacks for it ("" where nothing);
    `fallback`: what runs instead, as the log line says."""
    if missing:
        log.info("%s: %s", fallback, missing)
        return None
    try:
        library = ctypes.CDLL(str(built(source, flags, libraries)))
    except (OSError, subprocess.CalledProcessError) as e:
        log.warning("%s: building %s failed: %s", fallback, source.name, short(e))
        return None
    declare(library)
    if not check(library):
        log.warning("%s: the built %s gave other results than torch", fallback, source.name)
        return None
    return library
