"""Prompt lookup: a model-free draft that copies what followed the last occurrence of the current
suffix, which is cheap and good at the identifiers code repeats."""

from __future__ import annotations

import torch

from .base import Drafter, Proposal


class NgramDrafter(Drafter):
    """Find the latest earlier occurrence of the last n tokens and propose what followed."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        pass

    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0) -> Proposal:
        if gamma == 0:
            return Proposal([], None)
        seq = torch.tensor(committed)
        for n in range(min(self.max_ngram, len(committed) - 1), self.min_ngram - 1, -1):
            windows = seq.unfold(0, n, 1)[:-1]  # every earlier n-gram, excluding the suffix itself
            hits = (windows == seq[-n:]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n
                return Proposal(committed[start : start + gamma], None)
        return Proposal([], None)

    def rollback(self, valid: int) -> None:
        pass
