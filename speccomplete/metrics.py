"""The numbers every layer reports, defined once: per-token acceptance α̂, mean accepted length τ,
speed-up over AR and latency percentiles. A leaf module: it imports nothing of this project, so the
decoder, the telemetry and the harnesses can all use it (docs/speculative-decoding.md has the arithmetic).
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def acceptance_rate(accepted: float, rejected_rounds: float) -> float | None:
    """α̂ = accepted / (accepted + rounds that ended in a rejection); None when nothing was drafted.

    accepted / drafted is not α: a round stops at its first rejection, so the drafts after it
    were never judged.
    """
    seen = accepted + rejected_rounds
    return accepted / seen if seen else None


def mean_accepted_length(accepted: float, drafting_rounds: float) -> float | None:
    """τ = accepted drafts per round that drafted anything; None when no round drafted."""
    return accepted / drafting_rounds if drafting_rounds else None


def speedup(spec_tokens: float, spec_ms: float, ar_tokens: float, ar_ms: float) -> float | None:
    """Speculative tokens/s ÷ AR tokens/s over the same cases; None when a side took no time or AR wrote nothing.

    A ratio of pooled sums: the caller sums each side's tokens and time over the cases both ran.
    """
    if not spec_ms or not ar_ms or not ar_tokens:
        return None
    return (spec_tokens / spec_ms) / (ar_tokens / ar_ms)


def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between ranks (numpy's and DuckDB's
    quantile_cont default); None for no values. Any iterable of numbers (a list, a numpy array)."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * (q / 100)  # q as a fraction first, as DuckDB and numpy do: same rounding
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
