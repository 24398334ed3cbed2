"""The EAGLE-3 draft's greedy chain as one captured graph (decoder/drafts/eagle3/chain.py), run eagerly on
the CPU: the same function on the same buffers that CUDA records.

Every round of a real decode, with rollbacks, γ changing from round to round and line ends cutting
proposals, the chain proposes exactly what the drafter's loop proposes from the same draft and the same
target states, token for token, and the decoder still writes the target's own greedy output. A chain
that would not fit the reserved rows falls back to the loop, and the graphs follow the grown buffers.
"""

from __future__ import annotations

import pytest
import torch
from helpers.decoding import generate, random_prompts

from speccomplete.decoder.drafts import Eagle3Drafter
from speccomplete.decoder.drafts.base import Drafter, Proposal
from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, init_from_target
from speccomplete.decoder.engine import SpeculativeDecoder, round_rows
from speccomplete.decoder.sampling import SamplingParams
from speccomplete.decoder.target_steps import EagerTarget, FixedShapeTarget

PROMPTS = random_prompts(4, seed=11)
MAX_NEW = 24
GAMMAS = (1, 5, 3, 6, 2, 4)


def make_draft(target, seed: int = 0):
    """A tiny EAGLE-3 draft over half the target's vocabulary, as tests/decoder/drafts/test_eagle3_drafter.py
    builds it: weights scaled up so that its drafts differ from step to step."""
    rows = target.get_output_embeddings().out_features
    ids = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))[: rows // 2].sort().values
    draft = init_from_target(Eagle3Shape.for_target(target, draft_vocab=len(ids)), target, ids, seed=seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.requires_grad and p.dim() == 2:
                p.mul_(10)
    return draft.eval().requires_grad_(False)


class CycledGamma:
    """γ from a fixed cycle, whatever the rounds accept: short and long chains in turn."""

    def __init__(self, cycle: tuple[int, ...]):
        self.cycle, self.max_gamma, self.rounds = cycle, max(cycle), 0

    def next_gamma(self) -> int:
        self.rounds += 1
        return self.cycle[(self.rounds - 1) % len(self.cycle)]

    def update(self, requested: int, drafted: int, accepted: int) -> None:
        pass


class Twins(Drafter):
    """The chain's drafter and the loop's, one draft on the same target steps: both propose every round,
    the decoder verifies the chain's; each round's γ, both proposals and the path the chain took are kept."""

    def __init__(self, chain: Eagle3Drafter, loop: Eagle3Drafter):
        self.chain, self.loop = chain, loop
        self.target_taps = chain.target_taps
        self.rounds: list[tuple[int, list[int], list[int], bool]] = []  # γ, chain's, loop's, by the graph?

    @property
    def own_modules(self) -> tuple[torch.nn.Module, ...]:
        return self.chain.own_modules

    def attach(self, steps) -> None:
        self.chain.attach(steps)
        self.loop.attach(steps)

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        self.chain.reset(prompt, reused)
        self.loop.reset(prompt, reused)

    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0) -> Proposal:
        graph_rounds = self.chain.graph_rounds
        got = self.chain.propose(committed, gamma, params, generator, min_confidence)
        want = self.loop.propose(committed, gamma, params, generator, min_confidence)
        self.rounds.append((gamma, got.tokens, want.tokens, self.chain.graph_rounds > graph_rounds))
        return got

    def rollback(self, valid: int) -> None:
        self.chain.rollback(valid)
        self.loop.rollback(valid)


def twins_decoder(model, tokenizer, steps_kind: str = "eager", line_ends=frozenset(), chain_capacity=None):
    draft = make_draft(model)
    chain = Eagle3Drafter(draft, model, line_ends, graph_chain=True, chain_capacity=chain_capacity)
    twins = Twins(chain, Eagle3Drafter(draft, model, line_ends, graph_chain=False))
    policy = CycledGamma(GAMMAS)
    taps = chain.target_taps
    steps = (
        EagerTarget(model, taps)
        if steps_kind == "eager"
        else FixedShapeTarget(model, 256, round_rows(policy, twins), taps=taps)
    )
    return SpeculativeDecoder(model, tokenizer, twins, policy, steps=steps), twins


def assert_chain_is_the_loop(twins: Twins) -> None:
    for gamma, got, want, _ in twins.rounds:
        assert got == want, f"γ={gamma}"
    chain, loop = twins.chain, twins.loop
    assert chain.cache.length == chain.rows == loop.rows  # the chain's rows were not kept
    assert torch.equal(chain.cache.keys, loop.cache.keys) and torch.equal(chain.cache.values, loop.cache.values)


@pytest.mark.parametrize(
    "name, steps_kind", [("llama", "eager"), ("llama", "fixed"), ("gemma3", "eager")], ids=lambda v: v
)
def test_the_chain_proposes_what_the_loop_does_every_round(name, steps_kind, request, tokenizer):
    model = request.getfixturevalue(name)
    reference = SpeculativeDecoder(model, tokenizer)
    spec, twins = twins_decoder(model, tokenizer, steps_kind)
    rolled_back = 0
    for prompt in PROMPTS:  # later prompts reuse part of the last one's rows
        want = generate(reference, prompt, max_new_tokens=MAX_NEW).token_ids
        got = generate(spec, prompt, max_new_tokens=MAX_NEW)
        assert got.token_ids == want, prompt
        rolled_back += got.stats.drafted - got.stats.accepted
        assert_chain_is_the_loop(twins)
    assert rolled_back > 0 and sum(len(t) for _, t, _, _ in twins.rounds) > 0
    assert all(by_graph for gamma, _, _, by_graph in twins.rounds if gamma) and twins.chain.loop_rounds == 0
    assert twins.loop.graph_rounds == 0
    assert {gamma for gamma, *_ in twins.rounds} >= set(GAMMAS)
    assert all(len(tokens) == gamma for gamma, tokens, _, _ in twins.rounds if tokens)  # no line ends: never cut
    if steps_kind == "fixed":  # rows for every token the target holds, and a round's chain past them
        assert twins.chain.cache.capacity == 256 + max(spec.steps.buckets)


def test_line_ends_cut_the_chain_where_the_loop_stops(llama, tokenizer):
    line_ends = frozenset(range(0, llama.get_output_embeddings().out_features, 3))
    reference = SpeculativeDecoder(llama, tokenizer)
    spec, twins = twins_decoder(llama, tokenizer, line_ends=line_ends)
    for prompt in PROMPTS[:2]:
        assert (
            generate(spec, prompt, max_new_tokens=MAX_NEW).token_ids
            == generate(reference, prompt, max_new_tokens=MAX_NEW).token_ids
        )
        assert_chain_is_the_loop(twins)
    cut = [tokens for gamma, tokens, _, _ in twins.rounds if 0 < len(tokens) < gamma]
    assert cut and all(tokens[-1] in line_ends for tokens in cut)
    assert all(not line_ends & set(tokens[:-1]) for _, tokens, _, _ in twins.rounds)


def test_a_chain_past_the_reserved_rows_runs_the_loop_then_the_graphs_follow_the_grown_cache(llama, tokenizer):
    capacity = 16
    reference = SpeculativeDecoder(llama, tokenizer)
    spec, twins = twins_decoder(llama, tokenizer, chain_capacity=capacity)
    prompt = "def f(x):"  # 10 tokens with BOS: the rows cross the capacity while decoding
    assert (
        generate(spec, prompt, max_new_tokens=MAX_NEW).token_ids
        == generate(reference, prompt, max_new_tokens=MAX_NEW).token_ids
    )
    assert_chain_is_the_loop(twins)
    paths = [by_graph for gamma, _, _, by_graph in twins.rounds if gamma]  # γ = 0 drafts nothing, by neither
    assert not all(paths) and paths.index(False) < len(paths) - 1 - paths[::-1].index(True)  # graphs after the loop
    chain = twins.chain
    assert chain.loop_rounds == paths.count(False) and chain.cache.capacity > capacity
    assert chain.chains is not None and chain.cache.buffers is not None
    assert chain.chains._recorded_on is chain.cache.buffers[0]  # the graphs read the grown buffers


def test_sampling_and_a_confidence_floor_keep_the_loop(llama, tokenizer):
    draft = make_draft(llama)
    chain = Eagle3Drafter(draft, llama, graph_chain=True)
    loop = Eagle3Drafter(draft, llama, graph_chain=False)
    steps = EagerTarget(llama)
    chain.attach(steps)
    loop.attach(steps)
    prompt = tokenizer(PROMPTS[1])["input_ids"]
    with torch.inference_mode():
        steps.forward(prompt, keep=1)
    committed = prompt + [65]
    cases = [(SamplingParams(temperature=0.8, top_k=40), 0.0), (SamplingParams(), 0.05)]
    for params, floor in cases:
        got = chain.propose(committed, 5, params, torch.Generator(llama.device).manual_seed(3), floor)
        want = loop.propose(committed, 5, params, torch.Generator(llama.device).manual_seed(3), floor)
        assert got.tokens == want.tokens and len(got.tokens) > 0
        assert (got.q is None) == params.greedy
    assert chain.graph_rounds == 0 and chain.loop_rounds == len(cases)
    assert chain.propose(committed, 5, SamplingParams(), None).tokens  # greedy, no floor: the graph
    assert chain.graph_rounds == 1


def test_warm_up_makes_every_length_s_graph_once_and_keeps_the_rows(llama, tokenizer):
    spec, twins = twins_decoder(llama, tokenizer)
    generate(spec, PROMPTS[0], max_new_tokens=MAX_NEW)
    chain = twins.chain
    keys, values = chain.cache.keys.clone(), chain.cache.values.clone()
    chain.warm_up(max(GAMMAS))
    assert chain.chains is not None and sorted(chain.chains.graphs) == list(range(1, max(GAMMAS) + 1))
    assert torch.equal(chain.cache.keys, keys) and torch.equal(chain.cache.values, values)
    graphs = dict(chain.chains.graphs)
    generate(spec, PROMPTS[1], max_new_tokens=MAX_NEW)
    assert_chain_is_the_loop(twins)
    assert chain.chains.graphs == graphs and all(chain.chains.graphs[n] is graphs[n] for n in graphs)


def test_chains_that_fail_to_record_leave_drafting_to_the_loop(llama, tokenizer, monkeypatch, caplog):
    from speccomplete.decoder.drafts.eagle3.chain import GreedyChains

    def refuses(self, length):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(GreedyChains, "graph", refuses)
    drafter = Eagle3Drafter(make_draft(llama), llama, graph_chain=True)
    steps = EagerTarget(llama, drafter.target_taps)
    drafter.attach(steps)
    drafter.warm_up(4)
    assert not drafter.graph_chain and "failed to record" in caplog.text
    spec = SpeculativeDecoder(llama, tokenizer, drafter, CycledGamma((3,)), steps=steps)
    reference = SpeculativeDecoder(llama, tokenizer)
    got = generate(spec, PROMPTS[0], max_new_tokens=MAX_NEW)
    assert got.token_ids == generate(reference, PROMPTS[0], max_new_tokens=MAX_NEW).token_ids
    assert got.stats.drafted > 0 and drafter.graph_rounds == 0 and drafter.loop_rounds > 0
