"""An EAGLE-3 draft's greedy chain as one captured graph: n draft tokens for one launch and one read.

Drafting greedily, each chained token is a function of the device alone: logits over the draft's
vocabulary, argmax, its target id, that id's embedding, one draft step at the next position. So the
chain of n tokens runs as one `cuda_graphs.Captured` (eager on the CPU, the same function on the same
buffers), and the host reads the n tokens back in one transfer, where the loop of drafter.py
reads each token back before it can feed it.

Its inputs are static buffers the drafter fills each round: the newest row's output state and its
position. The chain writes its rows into the draft cache's reserved buffers (`KVCache.reserve`) at
rows from the newest position on, past the cache's length: rows the next round overwrites, as the
loop's chained rows are dropped. One graph per chain length, so a round of γ tokens runs γ steps; the
graphs read the buffers where they were when recorded, so they are recorded again if the buffers grow.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...cuda_graphs import Captured
from .model import Eagle3, KVCache


class GreedyChains:
    """The greedy chains of one draft over one cache, a recorded graph per length."""

    def __init__(self, draft: Eagle3, embeddings: torch.Tensor, vocab_ids: torch.Tensor, cache: KVCache):
        self.draft = draft
        self.embeddings = embeddings
        self.vocab_ids = vocab_ids
        self.cache = cache
        self.device = draft.device
        self.state = torch.zeros(1, draft.shape.hidden_size, dtype=draft.dtype, device=self.device)
        self.position = torch.zeros(1, dtype=torch.long, device=self.device)  # the newest row's
        self.graphs: dict[int, Captured] = {}  # chain length -> its graph
        self._recorded_on: torch.Tensor | None = None  # the key buffer the graphs read

    def fits(self, newest: int, length: int) -> bool:
        """Whether a chain of `length` from the row at position `newest` stays inside the buffers: its
        last step writes row newest + length - 2 (row t is at position t + 1)."""
        return newest + length - 1 <= self.cache.capacity

    def run(self, state: torch.Tensor, newest: int, length: int) -> list[int]:
        """`length` greedy tokens (target ids) after the newest row, whose output state is `state` [1, h]
        and whose position is `newest`."""
        assert self.fits(newest, length), "the caller checks `fits` first"
        self.state.copy_(state)
        self.position.fill_(newest)
        return self.graph(length)().tolist()

    def graph(self, length: int) -> Captured:
        """The chain of `length`, recorded now if it is not yet. Recording runs it (on CUDA), writing
        rows from the position `position` holds on: set it first, to a row past those kept."""
        buffers = self.cache.buffers
        assert buffers is not None, "reserve the cache's buffers first"
        if self._recorded_on is not buffers[0]:  # the buffers grew: graphs recorded on the old ones are stale
            self.graphs.clear()
            self._recorded_on = buffers[0]
        graph = self.graphs.get(length)
        if graph is None:
            graph = self.graphs[length] = Captured(lambda: self._chain(length), self.device)
        return graph

    def _chain(self, length: int) -> torch.Tensor:
        draft = self.draft
        state, position = self.state, self.position
        tokens = []
        for drawn in range(length):
            token = self.vocab_ids.index_select(0, draft.logits(state).argmax(-1))  # [1]
            tokens.append(token)
            if drawn + 1 < length:
                position = position + 1
                embeds = F.embedding(token, self.embeddings)
                state = draft.step_at(embeds, state, position, position - 1, self.cache)
        return torch.cat(tokens)
