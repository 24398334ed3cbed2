"""An EAGLE-3 draft at decode time: it drafts from the target's own states, which the verify pass
already computed (drafts/eagle3.py has the model and its format)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..sampling import draw_draft
from .base import Drafter, Proposal
from .eagle3 import Eagle3, KVCache

if TYPE_CHECKING:
    from ..target_steps import EagerTarget, FixedShapeTarget


class Eagle3Drafter(Drafter):
    """Row t of the draft's cache is built from the target's states at position t and the token
    after it, x_{t+1}, so a row can be added once the target has fed x_t and x_{t+1} is committed.
    Each round adds the rows that became possible (the last committed token's predecessor is the
    newest), then chains from the newest row's output: draft a token, feed it back with that output
    state, up to γ tokens or a line end. The chained rows are dropped after the round; the rows from
    real target states stay, so a round costs its new rows plus one draft step per token.

    The target's steps keep its states for every token they hold (decoder/target_steps.py, `taps`),
    from the same forward passes that verify: drafting asks nothing more of the target.
    """

    def __init__(self, draft: Eagle3, target, line_ends: set[int] | frozenset[int] = frozenset()):
        self.draft = draft
        self.embeddings = target.get_input_embeddings().weight  # shared rows, unscaled, as vLLM's draft reads them
        self.vocab_ids = draft.target_ids()
        self.target_vocab = draft.shape.target_vocab
        self.target_taps = tuple(draft.shape.aux_layers)
        self.line_ends = line_ends
        self.cache = KVCache()
        self.rows = 0  # rows from real target states in the cache: positions 0..rows-1
        self.steps: EagerTarget | FixedShapeTarget | None = None

    @property
    def own_modules(self) -> tuple[torch.nn.Module, ...]:
        return (self.draft,)

    def attach(self, steps: EagerTarget | FixedShapeTarget) -> None:
        steps.keep_states(self.target_taps)
        self.steps = steps

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        # Row t depends on tokens 0..t+1, all shared with the last request while t + 1 < reused.
        self._keep(min(self.rows, max(0, reused - 1)))

    def _keep(self, rows: int) -> None:
        self.rows = rows
        self.cache.truncate(rows)

    @torch.inference_mode()
    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0) -> Proposal:
        steps = self.steps
        assert steps is not None and steps.features is not None, "the decoder attaches the target's steps first"
        held = steps.features.length
        end = min(held, len(committed) - 1)  # rows possible now: the state at t and the token t + 1
        if gamma == 0 or end <= 0:
            return Proposal([], None)
        if end < self.rows:  # the target was cut back past rows built earlier
            self._keep(end)
        if end == self.rows:  # nothing new to start from: rebuild the newest row
            self._keep(end - 1)
        start = self.rows
        draft = self.draft
        device = self.embeddings.device
        next_tokens = torch.tensor(committed[start + 1 : end + 1], device=device)
        hidden = draft.fuse(steps.features.rows(start, end))
        out = draft.step(
            F.embedding(next_tokens, self.embeddings),
            hidden,
            torch.arange(start + 1, end + 1, device=device),
            self.cache,
        )
        self.rows = end
        state = out[-1:]
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        try:
            while True:
                drawn = draw_draft(draft.logits(state), params, generator, min_confidence)
                if drawn is None:
                    break
                index, probs = drawn
                if probs is not None:
                    qs.append(probs.new_zeros(self.target_vocab).scatter_(0, self.vocab_ids, probs[0]))
                token = self.vocab_ids[index]
                tokens.append(int(token))
                if len(tokens) >= gamma or tokens[-1] in self.line_ends:
                    break
                position = torch.tensor([end + len(tokens)], device=device)
                state = draft.step(F.embedding(token.view(1), self.embeddings), state, position, self.cache)
        finally:
            self.cache.truncate(self.rows)  # chained rows came from the draft's own states: never kept
        return Proposal(tokens, torch.stack(qs) if qs else None)

    def rollback(self, valid: int) -> None:
        # Rows from real states are built only up to the last committed token, which stays committed.
        if self.rows > valid:
            self._keep(valid)
