"""What every kind of target steps shares (target_steps.py, graph_target.py): the row counts a short feed
is padded to, the tapped states kept beside the cache, and a greedy round decided from logits."""

from __future__ import annotations

import torch

from .sampling import accept_greedy, greedy_verdict_on_host, verdict


def row_buckets(max_rows: int) -> tuple[int, ...]:
    """The row counts a forward is padded to: one row (AR and draft steps) and max_rows (a verify).

    Two, not the powers of two between: on an H200 each captured graph cost ~24 s of compiling on a
    cold start (12 graphs for γ ≤ 16 took ~5 minutes), while a step of Gemma-3-270M there is launch
    overhead, not rows (our AR step took 2 ms, 12x the bandwidth bound), so padding a verify to 17
    rows should cost little; not yet timed (docs/gpu.md)."""
    return (1,) if max_rows == 1 else (1, max_rows)


class TappedStates:
    """The tapped states [tokens, len(taps) * hidden] of every token a target's cache holds, in a
    buffer that doubles when full, so appending a round's rows copies only them."""

    def __init__(self, taps: tuple[int, ...]):
        self.taps = taps
        self.length = 0
        self._buffer: torch.Tensor | None = None

    def append(self, rows: torch.Tensor) -> None:
        end = self.length + rows.shape[0]
        if self._buffer is None or end > self._buffer.shape[0]:
            bigger = rows.new_empty(
                max(end, 2 * (0 if self._buffer is None else self._buffer.shape[0]), 512), rows.shape[1]
            )
            if self._buffer is not None:
                bigger[: self.length] = self._buffer[: self.length]
            self._buffer = bigger
        self._buffer[self.length : end] = rows
        self.length = end

    def rows(self, start: int, end: int) -> torch.Tensor:
        if not 0 <= start <= end <= self.length or self._buffer is None:
            raise IndexError(f"tapped states [{start}, {end}) asked of {self.length} held")
        return self._buffer[start:end]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, max(0, length))

    def keep_rows(self, start: int, rows: torch.Tensor) -> None:
        """Hold the first `start` tokens' states and then those at `start + rows` (kv_cache.keep_rows)."""
        if self._buffer is not None and rows.numel():
            end = start + rows.numel()
            self._buffer[start:end] = self._buffer.index_select(0, start + rows.to(self._buffer.device))
            self.length = end
        else:
            self.truncate(start)


def verify_by_logits(steps, ids: list[int]) -> list[float]:
    """Append `ids` (the last committed token and the drafts after it) and decide the round greedily:
    sampling.verdict's values, [n, token, log-probabilities...]; on a GPU read back once, on the CPU as they go
    (sampling.greedy_verdict_on_host: no log-normalizer for the rows past the first miss)."""
    logits = steps.forward(ids, keep=len(ids))
    drafts = torch.tensor(ids[1:], dtype=torch.long, device=logits.device)
    if logits.device.type == "cpu":
        return greedy_verdict_on_host(logits, drafts)
    return verdict(logits, drafts, accept_greedy(logits, drafts)).tolist()  # one read back
