"""Eagle3Drafter: an EAGLE-3 draft fed by the target states the verify pass keeps.

Greedy output must be the target's own, token for token, whatever the draft proposes; the states
the target's steps keep must be those a fresh pass computes, through every rollback; and the
draft's own cache must equal its rows built afresh in one pass (the cache-equals-fresh-prefill
rule of tests/decoder/test_kv_cache.py). Sampled output is checked in
tests/decoder/test_sampling_lossless.py. All of it holds for a draft in int8 beside an int8 target,
as the loader quantizes them on the CPU (decoder/kernels.py).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers.decoding import generate, random_prompts
from helpers.eagle3 import make_draft
from helpers.tiny_models import TEST_DEVICE

import speccomplete.decoder.sampling as sampling
from speccomplete.decoder.drafts import Eagle3Drafter, HybridDrafter, build_drafter, parse_draft_spec
from speccomplete.decoder.drafts.eagle3.model import (
    KVCache,
    save_eagle3,
    speculators_config,
)
from speccomplete.decoder.drafts.spec import Eagle3Draft, HybridDraft
from speccomplete.decoder.engine import SpeculativeDecoder, round_rows
from speccomplete.decoder.gamma import HeuristicGamma
from speccomplete.decoder.kernels import Int8Linear, PackedGatedMLP, PackedLinear, PackedProjections
from speccomplete.decoder.loader import use_cpu_kernels
from speccomplete.decoder.sampling import SamplingParams
from speccomplete.decoder.target_steps import EagerTarget, FixedShapeTarget

PROMPTS = random_prompts(6, seed=7)
MAX_NEW = 24


@pytest.mark.parametrize("steps_kind", ["eager", "fixed"])
@pytest.mark.parametrize("lookup", [False, True], ids=["eagle3", "ngram+eagle3"])
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_eagle3_draft_is_ar_token_for_token(name, lookup, steps_kind, request, tokenizer):
    model = request.getfixturevalue(name)
    reference = SpeculativeDecoder(model, tokenizer)
    draft = make_draft(model, "half" if name == "llama" else "whole")
    drafter = Eagle3Drafter(draft, model)
    drafter = HybridDrafter(drafter, lookup_tokens=6) if lookup else drafter
    policy = HeuristicGamma(max_gamma=6)
    taps = drafter.target_taps
    steps = (
        EagerTarget(model, taps)
        if steps_kind == "eager"
        else FixedShapeTarget(model, 256, round_rows(policy, drafter), taps=taps)
    )
    spec = SpeculativeDecoder(model, tokenizer, drafter, policy, steps=steps)
    drafted = 0
    for prompt in PROMPTS:
        want = generate(reference, prompt, max_new_tokens=MAX_NEW).token_ids
        got = generate(spec, prompt, max_new_tokens=MAX_NEW)
        assert got.token_ids == want, prompt
        drafted += got.stats.drafted - got.stats.lookup_drafted
    assert drafted > 0  # the EAGLE draft itself proposed, not only the lookup


@pytest.mark.parametrize("steps_kind", ["eager", "fixed"])
def test_kept_states_are_a_fresh_pass_s_after_rollbacks(steps_kind, llama, tokenizer):
    draft = make_draft(llama)
    drafter = Eagle3Drafter(draft, llama)
    policy = HeuristicGamma(max_gamma=6)
    steps = (
        EagerTarget(llama, drafter.target_taps)
        if steps_kind == "eager"
        else FixedShapeTarget(llama, 256, round_rows(policy, drafter), taps=drafter.target_taps)
    )
    spec = SpeculativeDecoder(llama, tokenizer, drafter, policy, steps=steps)
    for prompt in PROMPTS[:3]:  # later prompts reuse part of the cache and its states
        gen = generate(spec, prompt, max_new_tokens=MAX_NEW)
        assert gen.stats.drafted > gen.stats.accepted  # rollbacks happened
        held = steps.tokens
        with torch.inference_mode():
            out = llama(input_ids=torch.tensor([held], device=llama.device), output_hidden_states=True)
        want = torch.cat([out.hidden_states[k][0] for k in drafter.target_taps], dim=-1)
        assert steps.features is not None and steps.features.length == len(held)
        torch.testing.assert_close(steps.features.rows(0, len(held)), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("steps_kind", ["eager", "fixed"])
def test_a_self_draft_on_the_same_steps_keeps_the_states_aligned(steps_kind, llama, tokenizer):
    """The bench runs every drafter on one target's steps: a SelfDrafter's hidden-state feeds must
    keep the EAGLE-3 draft's states too, or later rounds would read another position's."""
    from speccomplete.decoder.drafts import SelfDrafter

    policy = HeuristicGamma(max_gamma=6)
    eagle = Eagle3Drafter(make_draft(llama), llama)
    self_draft = SelfDrafter(llama, torch.arange(llama.get_output_embeddings().out_features))
    steps = (
        EagerTarget(llama)
        if steps_kind == "eager"
        else FixedShapeTarget(llama, 256, round_rows(policy, eagle), taps=eagle.target_taps)
    )
    spec_eagle = SpeculativeDecoder(llama, tokenizer, eagle, policy, steps=steps)
    spec_self = SpeculativeDecoder(llama, tokenizer, self_draft, HeuristicGamma(max_gamma=6), steps=steps)
    reference = SpeculativeDecoder(llama, tokenizer)
    for prompt in PROMPTS[:3]:
        want = generate(reference, prompt, max_new_tokens=MAX_NEW).token_ids
        assert generate(spec_self, prompt, max_new_tokens=MAX_NEW).token_ids == want
        assert steps.features is not None and steps.features.length == len(steps.tokens)
        assert generate(spec_eagle, prompt, max_new_tokens=MAX_NEW).token_ids == want
        with torch.inference_mode():
            out = llama(input_ids=torch.tensor([steps.tokens], device=llama.device), output_hidden_states=True)
        kept = torch.cat([out.hidden_states[k][0] for k in eagle.target_taps], dim=-1)
        torch.testing.assert_close(steps.features.rows(0, len(steps.tokens)), kept, rtol=1e-4, atol=1e-4)


def test_draft_cache_equals_its_rows_built_afresh(llama, tokenizer):
    draft = make_draft(llama)
    drafter = Eagle3Drafter(draft, llama)
    spec = SpeculativeDecoder(llama, tokenizer, drafter, HeuristicGamma(max_gamma=6))
    for prompt in PROMPTS[:3]:
        generate(spec, prompt, max_new_tokens=MAX_NEW)
        rows = drafter.rows
        assert rows > 0 and drafter.cache.length == rows  # chained rows were dropped
        tokens = spec.steps.tokens
        fresh = KVCache()
        with torch.inference_mode():
            draft.step(
                F.embedding(torch.tensor(tokens[1 : rows + 1]), drafter.embeddings),
                draft.fuse(spec.steps.features.rows(0, rows)),
                torch.arange(1, rows + 1),
                fresh,
            )
        torch.testing.assert_close(drafter.cache.keys, fresh.keys, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(drafter.cache.values, fresh.values, rtol=1e-4, atol=1e-5)


def test_attaching_makes_plain_steps_keep_the_draft_s_states(llama, tokenizer):
    """A decoder sharing steps built without taps (the bench's AR and compared drafts do) still works."""
    steps = EagerTarget(llama)
    ar = SpeculativeDecoder(llama, tokenizer, steps=steps)
    want = generate(ar, PROMPTS[0], max_new_tokens=MAX_NEW).token_ids
    drafter = Eagle3Drafter(make_draft(llama), llama)
    spec = SpeculativeDecoder(llama, tokenizer, drafter, HeuristicGamma(max_gamma=6), steps=steps)
    assert steps.features is not None and steps.features.taps == drafter.target_taps and not steps.tokens
    assert generate(spec, PROMPTS[0], max_new_tokens=MAX_NEW).token_ids == want
    assert generate(ar, PROMPTS[1], max_new_tokens=MAX_NEW).stats.new_tokens == MAX_NEW  # AR keeps states too
    assert steps.features.length == len(steps.tokens)


def test_specs_name_eagle3_drafts(llama, tokenizer, tmp_path):
    draft = make_draft(llama)
    folder = tmp_path / "eagle"
    save_eagle3(draft, folder, speculators_config(draft.shape, ["LlamaForCausalLM"], None, 3, head_from_target=True))
    assert parse_draft_spec("eagle3") == Eagle3Draft()
    assert parse_draft_spec(str(folder)) == Eagle3Draft(folder)
    assert parse_draft_spec(f"ngram+{folder}") == HybridDraft(Eagle3Draft(folder))
    drafter, model = build_drafter(f"ngram+{folder}", llama, tokenizer)
    assert isinstance(drafter, HybridDrafter) and isinstance(drafter.model, Eagle3Drafter) and model is None
    assert drafter.target_taps == draft.shape.aux_layers
    # the loaded draft (bf16 on disk) drafts what the saved one does, the head rebuilt from the target
    loaded = drafter.model.draft
    torch.testing.assert_close(loaded.lm_head.weight, draft.lm_head.weight)
    torch.testing.assert_close(loaded.fc.weight, draft.fc.weight, rtol=1e-2, atol=1e-2)


cpu_kernels_only = pytest.mark.skipif(
    TEST_DEVICE.type != "cpu" or not hasattr(torch, "_int_mm"), reason="packed and int8 linears run on the CPU"
)


def cpu_kernels_eagle3(model, vocab: str, int8: bool = True):
    """A copy of `model` on the CPU kernels (int8, or packed fp32) and an EAGLE-3 drafter on it, its draft
    packed in the same call as the target, as the loader does."""
    target = copy.deepcopy(model)
    drafter = Eagle3Drafter(make_draft(target, vocab), target)
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, *drafter.own_modules, int8=int8)
    return target, drafter


@cpu_kernels_only
@pytest.mark.parametrize("weights", ["int8", "packed"])
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_eagle3_draft_on_cpu_kernels_is_its_target_s_ar_token_for_token(name, weights, request, tokenizer):
    """The draft's linears become the target's kind (int8, or packed fp32 where int8 is slow), q, k and v
    one product and gate and up another; greedy output stays the target's own."""
    model = request.getfixturevalue(name)
    target, drafter = cpu_kernels_eagle3(model, "half" if name == "llama" else "whole", int8=weights == "int8")
    draft, linear = drafter.draft, Int8Linear if weights == "int8" else PackedLinear
    assert not any(isinstance(m, torch.nn.Linear) for m in draft.modules())
    assert isinstance(draft.lm_head, linear) and isinstance(draft.fc, linear)
    attention, mlp = draft.layer.self_attn, draft.layer.mlp
    assert isinstance(attention.projections, PackedProjections) and isinstance(attention.projections.product, linear)
    assert isinstance(mlp, PackedGatedMLP) and isinstance(mlp.gate_up, linear)
    ar = SpeculativeDecoder(target, tokenizer)
    lookup = HybridDrafter(drafter, lookup_tokens=6)  # accepted drafts too, from the repetitive prompts
    spec = SpeculativeDecoder(
        target, tokenizer, lookup, HeuristicGamma(max_gamma=6), steps=EagerTarget(target, drafter.target_taps)
    )
    drafted = accepted = 0
    for prompt in PROMPTS:
        want = generate(ar, prompt, max_new_tokens=MAX_NEW).token_ids
        got = generate(spec, prompt, max_new_tokens=MAX_NEW)
        assert got.token_ids == want, prompt
        drafted += got.stats.drafted - got.stats.lookup_drafted
        accepted += got.stats.accepted
    assert drafted > 0 and accepted > 0


@cpu_kernels_only
def test_int8_eagle3_draft_s_q_is_the_distribution_it_sampled_from(llama, tokenizer, monkeypatch):
    """Sampling is lossless only if each q row is what its token was drawn from: here the int8 head's
    (the chi-square test of tests/decoder/test_sampling_lossless.py runs an int8 draft too)."""
    target, drafter = cpu_kernels_eagle3(llama, "half")
    draws: list[tuple[torch.Tensor, torch.Tensor]] = []
    sample = sampling.sample

    def recorded_sample(probs, generator):
        index = sample(probs, generator)
        draws.append((probs.clone(), index))
        return index

    monkeypatch.setattr(sampling, "sample", recorded_sample)
    steps = EagerTarget(target)
    drafter.attach(steps)
    prompt = tokenizer(PROMPTS[1])["input_ids"]
    with torch.inference_mode():
        steps.forward(prompt, keep=1)
    params = SamplingParams(temperature=0.8, top_k=40)
    proposal = drafter.propose(prompt + [65], 5, params, torch.Generator().manual_seed(3))
    assert len(proposal.tokens) == len(draws) > 0 and proposal.q is not None
    vocab_ids = drafter.vocab_ids
    outside = torch.ones(drafter.target_vocab, dtype=torch.bool)
    outside[vocab_ids] = False
    for token, q, (probs, index) in zip(proposal.tokens, proposal.q, draws):
        assert token == int(vocab_ids[index])
        assert torch.equal(q[vocab_ids], probs[0]) and not q[outside].any()
