"""Feeds that exercise a target's cache the way decoding does, shared by the forward and int8 tests, and the
forward without the head."""

from __future__ import annotations

import torch

from speccomplete.decoder.kv_cache import Cache, forward_hidden_tapped
from speccomplete.decoder.target_steps import EagerTarget


def forward_hidden(model, cache: Cache, ids: list[int] | torch.Tensor) -> torch.Tensor:
    """forward_logits without the head: the final hidden states of `ids`, [len(ids), hidden]."""
    return forward_hidden_tapped(model, cache, ids, ())[0]


def rollback_feeds(ids: list[int]) -> list[tuple[list[int], int]]:
    """A prefill, one-token steps, verifies of several tokens, and rollbacks: (feed, tokens to crop after);
    past a window of 8 many times over, by one row and by many."""
    return [
        (ids[:40], 0),
        (ids[40:41], 0),
        (ids[41:46], -3),
        (ids[43:44], 0),
        (ids[44:53], -9),
        (ids[44:45], 0),
        (ids[45:70], 0),
    ]


def verify_and_steps(target, ids: list[int], prefix: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of ids[prefix:] fed as one verify, and fed one token a step, each after a prefill of
    ids[:prefix] on fresh steps: an int8 target must give the same, bit for bit."""
    rows = len(ids) - prefix
    with torch.inference_mode():
        batched = EagerTarget(target)
        batched.forward(ids[:prefix], keep=1)
        together = batched.forward(ids[prefix:], keep=rows)
        stepped = EagerTarget(target)
        stepped.forward(ids[:prefix], keep=1)
        alone = torch.cat([stepped.forward([token], keep=1) for token in ids[prefix:]])
    return together, alone
