"""An exact int8 product for the few rows decoding feeds (int8_rows.c with AVX-512 VNNI, int8_rows_avx2.c with
AVX2 alone).

`torch._int_mm` slows from two rows on, and oneDNN's blocked int8 matmul pays a call's overhead on the layers'
small weights; this one streams each weight row once, near the read bandwidth (docs/cpu.md, "Number formats").
It sums the same integers exactly in int32 and converts them to float32 as torch does, so Int8Linear's results
do not change, bit for bit. Its AVX2 variant multiplies full-range weights exactly, where oneDNN's AVX2 products
saturate, so on such CPUs it is what makes int8 weights usable at 8 bits. Each variant reads the weights in its own
layout (`laid_out`: the VNNI one as they lie, the AVX2 one in tiles of four rows, so that each input chunk it loads
serves four products while the tile streams as one run).

The C source is built with the system's C compiler at first use (well under a second) and kept under the model
cache (c_kernels.py). It runs its threads on torch's own OpenMP runtime, so `torch.set_num_threads` sizes them
too. Where it cannot run (no AVX2, ATen capped below it, no compiler, torch not on GNU OpenMP, or a build that
fails its check) `available()` is False, with one log line saying why, and Int8Linear keeps torch's kernels.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from . import c_kernels

log = logging.getLogger(__name__)

PROFILED_AS = "specdec::int8_rows"


@dataclass(frozen=True)
class Variant:
    """One build of the kernel: its source, its compiler flags, the CPU flags it needs and the ATen capabilities
    it runs under (ATEN_CPU_CAPABILITY caps torch's; capped, the kernel keeps to the same instruction set)."""

    name: str
    source: Path
    flags: tuple[str, ...]
    cpu_flags: tuple[str, ...]
    capabilities: tuple[str, ...]


_HERE = Path(__file__).parent
VARIANTS = (  # best first
    Variant(
        "avx512-vnni", _HERE / "int8_rows.c",
        ("-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-fopenmp"),
        ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"), ("AVX512", "AMX"),
    ),
    Variant(
        "avx2", _HERE / "int8_rows_avx2.c", ("-O3", "-mavx2", "-mfma", "-fopenmp"), ("avx2", "fma"),
        ("AVX2", "AVX512", "AMX"),
    ),
)  # fmt: skip


def variant() -> Variant | None:
    """The best variant this CPU and ATen's capability run; None where none does."""
    flags, capability = c_kernels.cpu_flags(), torch.backends.cpu.get_cpu_capability()
    return next((v for v in VARIANTS if set(v.cpu_flags) <= flags and capability in v.capabilities), None)


def available() -> bool:
    return _library() is not None


def in_use() -> str:
    """The name of the variant products() runs here, or "none"."""
    chosen = variant()
    return chosen.name if chosen is not None and available() else "none"


def laid_out(weight: torch.Tensor, library: ctypes.CDLL | None = None) -> torch.Tensor:
    """`weight` [out, in] int8 as `library`'s kernel (by default the one in use) reads it (`int8_rows_layout`):
    [tiles, chunks, tile, chunk], zero-padded to whole tiles and chunks, each tile's chunks interleaved so that
    a tile streams as one run. With tiles of one row and chunks of one byte (the VNNI variant) that is the
    weight as it lies. Four dimensions, so that a weight as it lies is never taken for one laid out."""
    library = library or _library()
    if library is None:
        raise RuntimeError("the int8 rows kernel is not available on this machine (int8_rows.available())")
    if weight.dim() != 2 or weight.dtype != torch.int8:
        raise ValueError(f"laid_out takes an [out, in] int8 weight, not {weight.dtype} {tuple(weight.shape)}")
    out, width = weight.shape
    tiles, chunks, tile, chunk = layout_shape(library, out, width)
    padded = weight
    if (tiles * tile, chunks * chunk) != (out, width):
        padded = weight.new_zeros(tiles * tile, chunks * chunk)
        padded[:out, :width] = weight
    return padded.reshape(tiles, tile, chunks, chunk).transpose(1, 2).contiguous()


def layout_shape(library: ctypes.CDLL, out: int, width: int) -> tuple[int, int, int, int]:
    """The shape of an [out, width] weight laid out for `library`."""
    tile, chunk = _layout(library)
    return -(-out // tile), -(-width // chunk), tile, chunk


@functools.cache  # products() asks at each call
def _layout(library: ctypes.CDLL) -> tuple[int, int]:
    """(rows a tile, bytes a chunk) of the weight layout `library` reads; (1, 1): rows as they lie."""
    tile, chunk = ctypes.c_int64(), ctypes.c_int64()
    library.int8_rows_layout(ctypes.byref(tile), ctypes.byref(chunk))
    return tile.value, chunk.value


def products(x: torch.Tensor, weight: torch.Tensor, weight_sums: torch.Tensor) -> torch.Tensor:
    """x @ W.T, its exact int32 sums converted to float32 (as oneDNN's int8 matmul gives them, and as
    `_int_mm`'s become in Int8Linear's scaling): x [rows, in] float32 holding integers in [-127, 127], weight
    W [out, in] int8 as `laid_out` gives it, weight_sums [out] int32, the sums of W's rows (the VNNI variant's
    correction for its shifted x)."""
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
    want = layout_shape(library, weight_sums.shape[0], width)
    if weight.shape != want or weight.dtype != torch.int8 or not weight.is_contiguous():
        raise ValueError(f"the weight is {tuple(weight.shape)}, not {want} as int8_rows.laid_out gives it")
    out = torch.empty(rows, weight_sums.shape[0], dtype=torch.float32)
    scratch = torch.empty(rows * want[1] * want[3], dtype=torch.uint8)  # x as bytes, as wide as the layout's rows
    library.int8_rows(
        x.data_ptr(), rows, width, weight.data_ptr(), weight_sums.data_ptr(), weight_sums.shape[0], out.data_ptr(),
        scratch.data_ptr(),
    )  # fmt: skip
    return out


@functools.cache  # products() asks at each call
def _library() -> ctypes.CDLL | None:
    return load(variant())


@functools.cache
def load(chosen: Variant | None) -> ctypes.CDLL | None:
    """`chosen`'s library, built or from the cache and checked; None, with a log line saying why, where it cannot
    run (for None nothing is built)."""
    build = chosen or VARIANTS[-1]
    return c_kernels.load(
        build.source, build.flags, missing=_why_not(chosen), fallback="int8 products on torch's kernels",
        declare=_declare, check=_checks, log=log,
    )  # fmt: skip


def _declare(library: ctypes.CDLL) -> None:
    library.int8_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    library.int8_rows.argtypes += [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    library.int8_rows.restype = None
    library.int8_rows_layout.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    library.int8_rows_layout.restype = None


def _why_not(chosen: Variant | None) -> str:
    """Why `chosen` cannot be built here; "" where it can."""
    if chosen is not None:
        return c_kernels.missing()
    if not set(VARIANTS[-1].cpu_flags) <= c_kernels.cpu_flags():
        return "no AVX2 and FMA on this CPU"
    return f"ATen runs at {torch.backends.cpu.get_cpu_capability()} (ATEN_CPU_CAPABILITY)"


def _checks(library: ctypes.CDLL) -> bool:
    """Whether the library's sums are exact, for one row and many, on ragged shapes and weights of -128."""
    generator = torch.Generator().manual_seed(0)
    for rows, width, outputs in ((1, 200, 7), (5, 640, 64), (9, 130, 13), (17, 64, 40)):
        x = torch.randint(-127, 128, (rows, width), generator=generator).float()
        weight = torch.randint(-128, 128, (outputs, width), dtype=torch.int8, generator=generator)
        out = _multiply(library, x, laid_out(weight, library), weight.sum(1, dtype=torch.int32))
        if not torch.equal(out, (x.long() @ weight.t().long()).float()):
            return False
    return True
