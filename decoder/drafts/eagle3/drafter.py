"""An EAGLE-3 draft at decode time: it drafts from the target's own states, which the verify pass
already computed (model.py has the model and its format)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ...sampling import draw_draft
from ...tree import DraftTree
from ..base import Drafter, Proposal, tree_proposal
from .chain import GreedyChains
from .compiled import CompiledDraftStep
from .model import Eagle3, KVCache

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ...target_steps import Steps

# Tokens each path of a draft tree offers at the next depth, and the paths that go on at each depth: the tree's
# width (docs/cpu.md, "Draft trees").
TREE_WIDTH = 3

# Rows the draft cache reserves for the captured chain beside target steps of no fixed capacity
# (EagerTarget); beyond them the cache grows and the chains are recorded again.
DEFAULT_CHAIN_ROWS = 4096


class Eagle3Drafter(Drafter):
    """Row t of the draft's cache is built from the target's states at position t and the token
    after it, x_{t+1}, so a row can be added once the target has fed x_t and x_{t+1} is committed.
    Each round adds the rows that became possible (the last committed token's predecessor is the
    newest), then chains from the newest row's output: draft a token, feed it back with that output
    state, up to γ tokens or a line end. The chained rows are dropped after the round; the rows from
    real target states stay, so a round costs its new rows plus one draft step per token.

    The target's steps keep its states for every token they hold (decoder/target_steps.py, `taps`),
    from the same forward passes that verify: drafting asks nothing more of the target.

    Drafting greedily with no confidence floor, the chain runs as one captured graph (chain.py):
    on CUDA by default, wherever `graph_chain` is True (the CPU tests run it eagerly). The cache then
    reserves `chain_capacity` rows (by default the target steps' capacity plus a round's rows), which the
    graphs read in place. A round whose chain would not fit them runs the loop, which grows the cache; the
    chains are then recorded again on the grown buffers.
    """

    def __init__(
        self,
        draft: Eagle3,
        target,
        line_ends: set[int] | frozenset[int] = frozenset(),
        graph_chain: bool | None = None,
        chain_capacity: int | None = None,
    ):
        self.draft = draft
        self.embeddings = target.get_input_embeddings().weight  # shared rows, unscaled, as vLLM's draft reads them
        self.vocab_ids = draft.target_ids()
        self.target_vocab = draft.shape.target_vocab
        self.target_taps = tuple(draft.shape.aux_layers)
        self.line_ends = line_ends
        self.cache = KVCache()
        self.rows = 0  # rows from real target states in the cache: positions 0..rows-1
        self.steps: Steps | None = None
        self.graph_chain = draft.device.type == "cuda" if graph_chain is None else graph_chain
        self.chain_capacity = chain_capacity
        self.chains: GreedyChains | None = None
        self.graph_rounds = self.loop_rounds = 0  # rounds drafted by the captured chain, by the loop

    @property
    def own_modules(self) -> tuple[torch.nn.Module, ...]:
        return (self.draft,)

    def attach(self, steps: Steps) -> None:
        steps.keep_states(self.target_taps)
        self.steps = steps

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        # Row t depends on tokens 0..t+1, all shared with the last request while t + 1 < reused.
        self._keep(min(self.rows, max(0, reused - 1)))

    def _keep(self, rows: int) -> None:
        self.rows = rows
        self.cache.truncate(rows)

    def _newest_state(self, committed: list[int]) -> torch.Tensor | None:
        """Add the rows that became possible since the last round; returns the newest row's output state
        [1, h] (what the round drafts from), None where there is no row to draft from."""
        steps = self.steps
        assert steps is not None and steps.features is not None, "the decoder attaches the target's steps first"
        end = min(steps.features.length, len(committed) - 1)  # rows possible now: the state at t and the token t + 1
        if end <= 0:
            return None
        if end < self.rows:  # the target was cut back past rows built earlier
            self._keep(end)
        if end == self.rows:  # nothing new to start from: rebuild the newest row
            self._keep(end - 1)
        start = self.rows
        device = self.embeddings.device
        next_tokens = torch.tensor(committed[start + 1 : end + 1], device=device)
        out = self._step(
            F.embedding(next_tokens, self.embeddings),
            self.draft.fuse(steps.features.rows(start, end)),
            torch.arange(start + 1, end + 1, device=device),
        )
        self.rows = end
        return out[-1:]

    def _step(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Eagle3.step's rows onto the cache: on the draft's compiled step where the target's steps carry one
        for this draft (installed with theirs, between two requests) and it covers them, else eagerly."""
        compiled = getattr(getattr(self.steps, "compiled", None), "draft_step", None)
        if isinstance(compiled, CompiledDraftStep) and compiled.draft is self.draft:
            compiled.reserve(self.cache)
            if compiled.covers(len(embeds), self.cache):
                return compiled.step(embeds, hidden, self.cache)
        return self.draft.step(embeds, hidden, positions, self.cache)

    @torch.inference_mode()
    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0, lookup=None) -> Proposal:
        if gamma == 0:
            return Proposal([], None)
        # reserved before the rows are added, so that they go straight into the buffers the graphs read
        chains = self._greedy_chains() if self.graph_chain and params.greedy and not min_confidence else None
        state = self._newest_state(committed)
        if state is None:
            return Proposal([], None)
        draft = self.draft
        device = self.embeddings.device
        end = self.rows
        if chains is not None and chains.fits(end, gamma):
            self.graph_rounds += 1
            return Proposal(self._through_line_end(chains.run(state, end, gamma)), None)
        self.loop_rounds += 1
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
                state = self._step(F.embedding(token.view(1), self.embeddings), state, position)
        finally:
            self.cache.truncate(self.rows)  # chained rows came from the draft's own states: never kept
        return Proposal(tokens, torch.stack(qs) if qs else None)

    @torch.inference_mode()
    def propose_tree(self, committed, gamma, nodes, params, generator) -> Proposal | None:
        """EAGLE-2's tree on the draft: at each depth the `TREE_WIDTH` likeliest paths so far (by the draft's
        own log-probabilities, summed) are fed at once, each attending to the cache and its own path, and each
        offers its `TREE_WIDTH` likeliest next tokens; then the `nodes` likeliest of all offered stay. A path
        ends at a line end. Decided ahead, not drawn: sampled acceptance stays lossless (decoder/tree.py)."""
        if self.graph_chain or gamma == 0 or nodes < 2:  # on CUDA the chain's recorded graphs draft
            return None
        state = self._newest_state(committed)
        if state is None:
            return Proposal([], None)
        draft, device = self.draft, self.embeddings.device
        width = min(TREE_WIDTH, nodes)
        tokens: list[int] = []
        parents: list[int] = []
        scores: list[float] = []
        fed: dict[int, int] = {}  # node -> its row among this round's rows in the draft cache
        frontier = [-1]  # the nodes whose next tokens this depth offers (-1: the root)
        frontier_scores = torch.zeros(1, device=device)
        try:
            deepest = min(gamma, nodes)  # no path of `nodes` nodes goes deeper
            for depth in range(1, deepest + 1):
                offered = torch.log_softmax(draft.logits(state).float(), -1).topk(width, dim=-1)
                totals = (frontier_scores[:, None] + offered.values).flatten()  # node first + i: row i // width
                ids = self.vocab_ids[offered.indices.flatten()].tolist()
                first = len(tokens)
                for index, (token, total) in enumerate(zip(ids, totals.tolist())):
                    tokens.append(token)
                    parents.append(frontier[index // width])
                    scores.append(total)
                if depth == deepest:
                    break
                # the likeliest of them go on, but not past a line end
                ranked = sorted(range(first, len(tokens)), key=lambda node: -scores[node])
                going_on = [node for node in ranked if tokens[node] not in self.line_ends][:width]
                if not going_on:
                    break
                offered_by = torch.tensor([(node - first) // width for node in going_on], device=device)
                state = self._feed_tree_rows(going_on, tokens, parents, fed, state[offered_by], depth)
                frontier = going_on
                frontier_scores = torch.tensor([scores[node] for node in frontier], device=device)
        finally:
            self.cache.truncate(self.rows)  # this round's rows came from the draft's own states: never kept
        return tree_proposal(_likeliest(tokens, parents, scores, nodes))

    def _feed_tree_rows(self, frontier: list[int], tokens, parents, fed: dict[int, int], hidden, depth: int):
        """Feed the `frontier` nodes, whose previous states are `hidden` [F, h], at `depth`, as rows of the draft
        cache after the real rows and this round's earlier ones; each attends to the real rows, its ancestors'
        rows and itself. Returns their output states [F, h]."""
        device = self.embeddings.device
        before = self.cache.length
        mask = torch.zeros(len(frontier), before + len(frontier), dtype=torch.bool)
        mask[:, : self.rows] = True
        for index, node in enumerate(frontier):
            mask[index, before + index] = True
            ancestor = parents[node]
            while ancestor != -1:
                mask[index, self.rows + fed[ancestor]] = True
                ancestor = parents[ancestor]
        for index, node in enumerate(frontier):
            fed[node] = before - self.rows + index
        return self.draft.step(
            F.embedding(torch.tensor([tokens[node] for node in frontier], device=device), self.embeddings),
            hidden,
            torch.full((len(frontier),), self.rows + depth, device=device),
            self.cache,
            mask=mask.to(device),
        )

    def _through_line_end(self, tokens: list[int]) -> list[int]:
        """The chain cut after its first line end, where the loop stops drafting."""
        for i, token in enumerate(tokens):
            if token in self.line_ends:
                return tokens[: i + 1]
        return tokens

    def _greedy_chains(self) -> GreedyChains:
        if self.chains is None:
            shape = self.draft.shape
            capacity = self.chain_capacity or self._default_chain_capacity()
            self.cache.reserve(capacity, shape.num_kv_heads, shape.head_dim, self.draft.dtype, self.draft.device)
            self.chains = GreedyChains(self.draft, self.embeddings, self.vocab_ids, self.cache)
        return self.chains

    def _default_chain_capacity(self) -> int:
        # Rows from real states stop at the target's capacity; a round's chain writes up to its rows past them.
        capacity, buckets = getattr(self.steps, "capacity", None), getattr(self.steps, "buckets", None)
        if capacity is None:
            return DEFAULT_CHAIN_ROWS
        return capacity + (max(buckets) if buckets else 1)

    @torch.inference_mode()
    def warm_up(self, max_gamma: int) -> None:
        """Record the chains of 1..max_gamma tokens now (on CUDA), so that no round waits for one; after
        `attach`, whose steps size the reserved rows. Recording runs each a few times, writing only rows
        past those held. Chains that fail to record leave drafting to the loop, with a warning."""
        if not self.graph_chain:
            return
        try:
            chains = self._greedy_chains()
            chains.position.fill_(self.rows)
            for length in range(1, max_gamma + 1):
                if chains.fits(self.rows, length):
                    chains.graph(length)
        except Exception:
            log.warning("the EAGLE-3 chain's graphs failed to record; the draft runs its loop", exc_info=True)
            self.graph_chain, self.chains = False, None

    def rollback(self, valid: int) -> None:
        # Rows from real states are built only up to the last committed token, which stays committed.
        if self.rows > valid:
            self._keep(valid)


def _likeliest(tokens: list[int], parents: list[int], scores: list[float], nodes: int) -> DraftTree:
    """The tree of the `nodes` likeliest offered nodes, with their ancestors (a path's score only falls as it
    grows, so they are among them but for ties), in the order they were offered: parents first."""
    kept: set[int] = set()
    for node in sorted(range(len(tokens)), key=lambda node: -scores[node]):
        path = []
        while node != -1 and node not in kept:
            path.append(node)
            node = parents[node]
        if len(kept) + len(path) > nodes:
            continue
        kept.update(path)
        if len(kept) == nodes:
            break
    order = sorted(kept)
    index = {node: i for i, node in enumerate(order)}
    return DraftTree(tuple(tokens[node] for node in order), tuple(index.get(parents[node], -1) for node in order))
