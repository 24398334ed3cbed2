"""A greedy round's decision on the CPU (greedy_rows.c): each logits row's first maximum, and the log-normalizer
of the rows committed.

Over a 262k vocabulary torch's argmax and logsumexp each take about a tenth of a millisecond a row on these CPUs
(one thread for one row), and every round of every decode pays them (docs/cpu.md, "A round's decision"). The
kernel reads each row in one piece per thread; its maxima are torch's argmax exactly (the first of equal values),
its log-normalizers torch's to float32 rounding (its check allows 1e-5).

Built with the system's C compiler at first use and kept under the model cache (c_kernels.py), on torch's own
OpenMP threads. Where it cannot run (no AVX2 and FMA, no compiler, torch not on GNU OpenMP, or a build that fails
its check) `available()` is False with one log line, and rounds are decided with torch as before. NaN logits (a
broken model) are where the two differ: the kernel's argmax passes a NaN by where torch's takes it; its
log-normalizer is NaN as torch's is.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from pathlib import Path

import torch

from . import c_kernels

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("greedy_rows.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp")

# False: decide with torch whatever is available (an A/B in one process: docs/benchmarks/scripts/greedy_rows.py)
enabled = True


def available() -> bool:
    return _library() is not None


def usable(logits: torch.Tensor) -> bool:
    """Whether these logits ([rows, vocab], float32 on the CPU, rows contiguous) go to the kernel here."""
    return (
        enabled
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.dim() == 2
        and logits.stride(-1) == 1
        and logits.shape[-1] < 2**31
        and available()
    )


def first_maxima(logits: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Each row's argmax (the first of equal maxima), and the maxima themselves (for log_normalizers)."""
    library = _library()
    if library is None:
        raise RuntimeError("the greedy rows kernel is not available here (greedy_rows.usable())")
    rows, vocab = logits.shape
    index = torch.empty(rows, dtype=torch.int64)
    maximum = torch.empty(rows, dtype=torch.float32)
    library.row_first_maxima(logits.data_ptr(), rows, vocab, logits.stride(0), index.data_ptr(), maximum.data_ptr())
    return index.tolist(), maximum


def log_normalizers(logits: torch.Tensor, maximum: torch.Tensor) -> list[float]:
    """log(sum(exp(row))) of each row of `logits`, given the row's maximum (first_maxima's)."""
    library = _library()
    if library is None:
        raise RuntimeError("the greedy rows kernel is not available here (greedy_rows.usable())")
    rows, vocab = logits.shape
    maximum = maximum[:rows].contiguous()
    out = torch.empty(rows, dtype=torch.float32)
    library.row_log_normalizers(logits.data_ptr(), rows, vocab, logits.stride(0), maximum.data_ptr(), out.data_ptr())
    return out.tolist()


def log_probabilities(logits: torch.Tensor, taken: list[int], maximum: torch.Tensor) -> list[float]:
    """The log-probability of `taken[i]` under row i of `logits`, for its first len(taken) rows, given the rows'
    maxima (first_maxima's): a round's committed tokens."""
    rows = logits[: len(taken)]
    chosen = rows.gather(-1, torch.tensor(taken).view(-1, 1)).squeeze(-1).tolist()
    return [logit - normalizer for logit, normalizer in zip(chosen, log_normalizers(rows, maximum))]


@functools.cache
def _library() -> ctypes.CDLL | None:
    return c_kernels.load(
        SOURCE, FLAGS, libraries=("-lm",), missing=c_kernels.missing_on_avx2(),
        fallback="greedy rounds decided by torch", declare=_declare, check=_checks, log=log,
    )  # fmt: skip


def _declare(library: ctypes.CDLL) -> None:
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    library.row_first_maxima.argtypes = [pointer, size, size, size, pointer, pointer]
    library.row_first_maxima.restype = None
    library.row_log_normalizers.argtypes = [pointer, size, size, size, pointer, pointer]
    library.row_log_normalizers.restype = None


def _checks(library) -> bool:
    """Whether the library decides as torch does: the same argmax (ties, a maximum in the tail, rows of one
    value) and log-normalizers equal to float32 rounding, on vocabularies cut in pieces or not."""
    generator = torch.Generator().manual_seed(0)
    for rows, vocab in ((1, 262_144), (5, 49_152), (3, 1_000), (2, 37)):
        logits = torch.randn(rows, vocab, generator=generator) * 4
        logits[0, vocab // 3] = logits[0, 2 * vocab // 3] = logits[0].max() + 1  # a tie: the first wins
        if rows > 1:
            logits[1, -1] = logits[1].max() + 1  # in the tail
        if rows > 2:
            logits[2] = 0.5  # all equal: the first
        index = torch.empty(rows, dtype=torch.int64)
        maximum = torch.empty(rows)
        library.row_first_maxima(logits.data_ptr(), rows, vocab, vocab, index.data_ptr(), maximum.data_ptr())
        out = torch.empty(rows)
        library.row_log_normalizers(logits.data_ptr(), rows, vocab, vocab, maximum.data_ptr(), out.data_ptr())
        if not torch.equal(index, logits.argmax(-1)) or not torch.allclose(
            out, torch.logsumexp(logits, -1), atol=1e-5, rtol=1e-6
        ):
            return False
    return True
