"""An exact int8 product for the few rows decoding feeds, on CPUs with AVX-512 VNNI (int8_rows.c).

`torch._int_mm` slows from two rows on, and oneDNN's blocked int8 matmul pays a call's overhead on the layers'
small weights; this one streams each weight row once, near the read bandwidth (docs/cpu.md, "Number formats").
It sums the same integers exactly in int32 and converts them to float32 as torch does, so Int8Linear's results
do not change, bit for bit.

The C source is built with the system's C compiler at first use (well under a second) and kept under the model
cache (c_kernels.py). It runs its threads on torch's own OpenMP runtime, so `torch.set_num_threads` sizes them
too. Where it cannot run (no VNNI, ATen capped below AVX-512, no compiler, torch not on GNU OpenMP, or a build
that fails its check) `available()` is False, with one log line saying why, and Int8Linear keeps torch's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from . import c_kernels

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int8_rows.c")
FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-fopenmp")
_CPU_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_vnni")
PROFILED_AS = "specdec::int8_rows"


def available() -> bool:
    return _library() is not None


def products(x: torch.Tensor, weight: torch.Tensor, weight_sums: torch.Tensor) -> torch.Tensor:
    """x @ weight.T, its exact int32 sums converted to float32 (as oneDNN's int8 matmul gives them, and as
    `_int_mm`'s become in Int8Linear's scaling): x [rows, in] float32 holding integers in [-127, 127], weight
    [out, in] int8 (contiguous), weight_sums [out] int32, the sums of weight's rows."""
    library = _library()
    if library is None:
        raise RuntimeError("the int8 rows kernel is not available on this machine (int8_rows.available())")
    if torch.autograd.profiler._is_profiler_enabled:  # named in a profile (`specdec stepcost --profile`), as ops are
        with torch.profiler.record_function(PROFILED_AS):
            return _multiply(library, x, weight, weight_sums)
    return _multiply(library, x, weight, weight_sums)


def _multiply(library: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, weight_sums: torch.Tensor) -> torch.Tensor:
    """`products` on `library`."""
    x = x.contiguous()
    rows, width = x.shape
    out = torch.empty(rows, weight.shape[0], dtype=torch.float32)
    shifted = torch.empty(rows * width, dtype=torch.uint8)
    library.int8_rows(
        x.data_ptr(), rows, width, weight.data_ptr(), weight_sums.data_ptr(), weight.shape[0], out.data_ptr(),
        shifted.data_ptr(),
    )  # fmt: skip
    return out


@functools.cache
def _library() -> ctypes.CDLL | None:
    return c_kernels.load(
        SOURCE, FLAGS, missing=_why_not(), fallback="int8 products on torch's kernels", declare=_declare, check=_checks,
        log=log,
    )  # fmt: skip


def _declare(library: ctypes.CDLL) -> None:
    library.int8_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    library.int8_rows.argtypes += [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    library.int8_rows.restype = None


def _why_not() -> str:
    """Why the kernel cannot run here; "" where it can."""
    if not all(flag in c_kernels.cpu_flags() for flag in _CPU_FLAGS):
        return "no AVX-512 VNNI on this CPU"
    if torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AMX"):
        return f"ATen runs at {torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY)"
    return c_kernels.missing()


def _checks(library: ctypes.CDLL) -> bool:
    """Whether the library's sums are torch's on both of its paths (few rows and many) and ragged shapes."""
    generator = torch.Generator().manual_seed(0)
    for rows, width, outputs in ((1, 200, 7), (5, 640, 64), (9, 130, 13), (17, 64, 40)):
        x = torch.randint(-127, 128, (rows, width), generator=generator).float()
        weight = torch.randint(-127, 128, (outputs, width), dtype=torch.int8, generator=generator)
        out = _multiply(library, x, weight, weight.sum(1, dtype=torch.int32))
        if not torch.equal(out, (x.long() @ weight.t().long()).float()):
            return False
    return True
