"""Attention for the rows of a decode step or a verify, float32 on the CPU (attend_rows.c).

A step's one row, a verify's rows and a draft tree's rows each attend over the cache and then their own path.
For one query row SDPA's setting up costs more than reading the keys and values, and a verify called it once per
row, through Python (docs/cpu.md, "Attention for a step's rows"). This kernel takes every row of every head in one
call, each row alone and in one order, so a verify row is the one-row step at its position bit for bit, as the
int8 verify needs (lean_forward.attend_row_by_row).

Built with the system's C compiler at first use and kept under the model cache (c_kernels.py), on torch's own
OpenMP threads. Where it cannot run (no AVX2 and FMA, no compiler, torch not on GNU OpenMP, or a build that fails
its check) `available()` is False with one log line, and the lean forward attends with SDPA as before.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import logging
import math
from pathlib import Path

import torch

from . import c_kernels
from .tree import paths_of

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("attend_rows.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")


# False: the lean forward attends on SDPA whatever is available (an A/B in one process:
# docs/benchmarks/scripts/attend_rows.py)
enabled = True


def available() -> bool:
    return _library() is not None


def usable(queries: torch.Tensor, keys: torch.Tensor) -> bool:
    """Whether these tensors (float32 on the CPU, their last dimension contiguous) go to the kernel here."""
    return (
        enabled
        and queries.device.type == "cpu"
        and queries.dtype == keys.dtype == torch.float32
        and keys.stride(-1) == queries.stride(-1) == 1
        and available()
    )


def attend(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    start: int,
    parents: list[int],
    window: int | None,
    scale: float,
    cap: float | None,
) -> torch.Tensor:
    """queries [1, heads, rows, dim]; keys and values [1, kv_heads, positions, dim], holding the `start` cached
    tokens and then the rows'; parents[row] the row before it on its path, -1 for none (a chain: row - 1).
    Returns [1, heads, rows, dim], contiguous: each row over the last `window` (None: all) of the cache's first
    `start` keys and its path's, its logits soft-capped by `cap` where set."""
    library = _library()
    if library is None:
        raise RuntimeError("the attention rows kernel is not available here (attend_rows.available())")
    return _attend(library, queries, keys, values, start, _paths(tuple(parents)), window, scale, cap)


@functools.lru_cache(maxsize=256)
def _paths(parents: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's path as the kernel reads it: where each begins in the second, and all of them one after another."""
    paths = paths_of(list(parents))
    starts = torch.tensor([0, *itertools.accumulate(len(path) for path in paths)], dtype=torch.int64)
    return starts, torch.tensor([row for path in paths for row in path], dtype=torch.int64)


def _attend(library, queries, keys, values, start, paths, window, scale, cap) -> torch.Tensor:
    _, heads, rows, dim = queries.shape
    kv_heads = keys.shape[1]
    if heads % kv_heads or keys.stride() != values.stride() or keys.stride(-1) != 1 or queries.stride(-1) != 1:
        raise ValueError(f"attend_rows: heads {heads} over {kv_heads}, strides {keys.stride()} {values.stride()}")
    if keys.shape[2] < start + rows:
        raise ValueError(f"attend_rows: {keys.shape[2]} positions hold fewer than {start} cached and {rows} rows")
    starts, flat = paths
    out = torch.empty(1, heads, rows, dim)
    failed = library.attend_rows(
        queries.data_ptr(), queries.stride(1), queries.stride(2), keys.data_ptr(), values.data_ptr(),
        keys.stride(1), keys.stride(2), rows, heads, kv_heads, dim, start, starts.data_ptr(), flat.data_ptr(),
        window or 0, scale, cap or 0.0, out.data_ptr(),
    )  # fmt: skip
    if failed:
        raise MemoryError("attend_rows: no memory for the scores")
    return out


@functools.cache
def _library() -> ctypes.CDLL | None:
    return c_kernels.load(
        SOURCE, FLAGS, libraries=("-lm",), missing=c_kernels.missing_on_avx2(),
        fallback="attention on SDPA", declare=_declare, check=_checks, log=log,
    )  # fmt: skip


def _declare(library: ctypes.CDLL) -> None:
    library.attend_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    library.attend_rows.argtypes += [ctypes.c_int64] * 7 + [ctypes.c_void_p, ctypes.c_void_p]
    library.attend_rows.argtypes += [ctypes.c_int64, ctypes.c_float, ctypes.c_float, ctypes.c_void_p]
    library.attend_rows.restype = ctypes.c_int


def reference(queries, keys, values, start, parents, window, scale, cap) -> torch.Tensor:
    """What `attend` computes, in torch (another order of sums: equal to about 1e-6)."""
    _, heads, rows, _ = queries.shape
    group = heads // keys.shape[1]
    out = torch.empty(queries.shape)
    for row, path in enumerate(paths_of(list(parents))):
        at = [*range(start), *(start + p for p in path)]
        at = at[-window:] if window else at
        k, v = keys[0][:, at].repeat_interleave(group, 0), values[0][:, at].repeat_interleave(group, 0)
        logits = (queries[0][:, row : row + 1] @ k.transpose(1, 2)) * scale
        logits = torch.tanh(logits / cap) * cap if cap else logits
        out[0, :, row : row + 1] = logits.softmax(-1) @ v
    return out


def _checks(library) -> bool:
    """Whether the library attends as torch does (to float32 rounding), on a step, a chain, a tree, a window, a
    soft cap and grouped heads."""
    generator = torch.Generator().manual_seed(0)
    for heads, kv_heads, dim, start, parents, window, cap in (
        (4, 1, 64, 9, [-1], None, None),
        (4, 2, 32, 7, [-1, 0, 1, 2], 5, None),
        (2, 2, 16, 5, [-1, 0, 0, 1, 2], None, 2.0),
        (8, 8, 48, 0, [-1, 0], 3, None),
    ):
        rows = len(parents)
        queries = torch.randn(1, heads, rows, dim, generator=generator)
        keys, values = (torch.randn(1, kv_heads, start + rows + 3, dim, generator=generator) for _ in range(2))
        scale = 1 / math.sqrt(dim)
        got = _attend(library, queries, keys, values, start, _paths(tuple(parents)), window, scale, cap)
        want = reference(queries, keys, values, start, parents, window, scale, cap)
        if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
            return False
    return True
