"""SelfDrafter: the target drafts for itself through its own layers and a head cut to a sub-vocabulary.

Drafts run the target's own steps, so the verify is only the full head over rows already fed:
greedy output must still be the target's own, token for token, and no position may go through
the layers twice. Sampled output is checked against the target's distribution in
tests/decoder/test_sampling_lossless.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers.decoding import generate, random_prompts
from helpers.tiny_models import tiny_llama

from speccomplete.decoder.drafts import DraftLoadError, HybridDrafter, ModelDrafter, SelfDrafter, build_drafter
from speccomplete.decoder.engine import SpeculativeDecoder, round_rows
from speccomplete.decoder.gamma import FixedGamma, HeuristicGamma
from speccomplete.decoder.kernels import PackedLinear, pack_linear_weights
from speccomplete.decoder.sampling import SamplingParams
from speccomplete.decoder.target_steps import EagerTarget, FixedShapeTarget

PROMPTS = random_prompts(6, seed=5)  # a third of them repetitive: the lookup's copies end some rounds
MAX_NEW = 24


def half_vocabulary(model, seed: int = 0) -> torch.Tensor:
    """Half the ids, at random: the target's top token is often outside, so drafts are also rejected."""
    rows = model.get_output_embeddings().out_features
    return torch.randperm(rows, generator=torch.Generator().manual_seed(seed))[: rows // 2]


def whole_vocabulary(model) -> torch.Tensor:
    return torch.arange(model.get_output_embeddings().out_features)


@pytest.mark.parametrize("steps_kind", ["eager", "fixed"])
@pytest.mark.parametrize("lookup", [False, True], ids=["self", "ngram+self"])
@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_self_draft_is_ar_token_for_token(name, lookup, steps_kind, request, tokenizer):
    model = request.getfixturevalue(name)
    reference = SpeculativeDecoder(model, tokenizer)
    drafter = SelfDrafter(model, half_vocabulary(model))
    drafter = HybridDrafter(drafter, lookup_tokens=6) if lookup else drafter
    policy = HeuristicGamma(max_gamma=6)
    steps = EagerTarget(model) if steps_kind == "eager" else FixedShapeTarget(model, 256, round_rows(policy, drafter))
    spec = SpeculativeDecoder(model, tokenizer, drafter, policy, steps=steps)
    drafted = accepted = 0  # by the target itself, not copied at a round's start
    for prompt in PROMPTS:
        want = generate(reference, prompt, max_new_tokens=MAX_NEW).token_ids
        got = generate(spec, prompt, max_new_tokens=MAX_NEW)
        assert got.token_ids == want, prompt
        drafted += got.stats.drafted - got.stats.lookup_drafted
        accepted += got.stats.accepted - got.stats.lookup_accepted
    assert 0 < accepted < drafted  # the target's own drafts were both kept and refused


def test_no_position_goes_through_the_layers_twice(llama, tokenizer):
    """With the whole vocabulary every draft is accepted: the layers see each token once, as in AR."""
    spec = SpeculativeDecoder(llama, tokenizer, SelfDrafter(llama, whole_vocabulary(llama)), FixedGamma(4))
    rows = []
    hook = llama.base_model.register_forward_hook(
        lambda module, args, kwargs, out: rows.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        gen = generate(spec, "def f(x):", max_new_tokens=MAX_NEW)
    finally:
        hook.remove()
    assert gen.stats.accepted == gen.stats.drafted > 0
    assert gen.stats.rounds < MAX_NEW
    assert sum(rows) == gen.stats.prompt_tokens + MAX_NEW - 1  # the last token is never fed
    assert (
        gen.token_ids == generate(SpeculativeDecoder(llama, tokenizer), "def f(x):", max_new_tokens=MAX_NEW).token_ids
    )


def test_a_round_drafts_no_more_than_is_still_wanted(llama, tokenizer):
    """A draft step past the last wanted token would be wasted. 5 tokens wanted, γ = 8, every draft
    accepted: a model draft drafts 4 after the prefill and the target adds the fifth; the self draft
    starts a round later (the prefill's logits give the first token), then drafts 3."""
    for drafter, gammas in ((ModelDrafter(llama), [4]), (SelfDrafter(llama, whole_vocabulary(llama)), [0, 3])):
        gen = generate(SpeculativeDecoder(llama, tokenizer, drafter, FixedGamma(8)), "abc", max_new_tokens=5)
        assert gen.stats.gammas == gammas and gen.stats.accepted == sum(gammas) and len(gen.token_ids) == 5


def test_drafting_stops_after_a_line_end(llama, tokenizer):
    """Editor completions end at line ends: a round's self drafts stop after one (here every id)."""
    every = whole_vocabulary(llama)
    spec = SpeculativeDecoder(llama, tokenizer, SelfDrafter(llama, every, line_ends=set(every.tolist())), FixedGamma(4))
    gen = generate(spec, "def f(x):", max_new_tokens=MAX_NEW)
    assert set(gen.stats.gammas) == {0, 1} and gen.stats.accepted == gen.stats.drafted
    assert (
        gen.token_ids == generate(SpeculativeDecoder(llama, tokenizer), "def f(x):", max_new_tokens=MAX_NEW).token_ids
    )


@torch.inference_mode()
def test_a_copy_ends_the_round_with_one_hot_draft_probabilities(llama):
    """In sampling, the copied tokens are deterministic drafts: q is one-hot at each of them."""
    drafter = SelfDrafter(llama, half_vocabulary(llama))
    steps = EagerTarget(llama)
    drafter.attach(steps)
    committed = [1, 40, 41, 42, 43]
    steps.forward(committed[:-1], keep=1)
    asked = []

    def lookup(drafts):
        asked.append(list(drafts))
        return [50, 51] if len(drafts) == 2 else []

    proposal = drafter.propose(
        committed, 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0), lookup=lookup
    )
    assert len(asked) == 2 and len(proposal.tokens) == 4 and proposal.tokens[2:] == [50, 51]
    assert proposal.hidden.shape[0] == 5 and steps.tokens == committed + proposal.tokens
    vocab = llama.get_output_embeddings().out_features
    assert proposal.q.shape == (4, vocab)
    assert torch.equal(proposal.q[2:], torch.nn.functional.one_hot(torch.tensor([50, 51]), vocab).float())
    assert set(proposal.q[0].nonzero().flatten().tolist()) <= set(drafter.vocab_ids.tolist())
    assert torch.isclose(proposal.q[:2].sum(-1), torch.ones(2)).all()


def test_the_cut_head_is_packed_when_the_target_is(tokenizer):
    model = tiny_llama(seed=3, layers=2)  # its own: packing changes the model
    reference = [generate(SpeculativeDecoder(model, tokenizer), p, max_new_tokens=12).token_ids for p in PROMPTS]
    drafter = SelfDrafter(model, half_vocabulary(model))  # built from plain weights, as load_decoder does
    pack_linear_weights(model)
    spec = SpeculativeDecoder(model, tokenizer, HybridDrafter(drafter), HeuristicGamma())
    assert [generate(spec, p, max_new_tokens=12).token_ids for p in PROMPTS] == reference
    assert isinstance(drafter.head, PackedLinear)


def test_self_refuses_a_model_whose_logits_are_not_its_head():
    """Llama's forward ignores a soft cap in its config; the head alone (with the cap) would not be its logits."""
    model = tiny_llama(seed=4, layers=1)
    SelfDrafter(model, whole_vocabulary(model))
    model.config.final_logit_softcapping = 0.05
    with pytest.raises(ValueError, match="otherwise than by its head"):
        SelfDrafter(model, whole_vocabulary(model))


def test_self_probes_a_model_of_no_known_family(monkeypatch):
    """A family's record says how its logits are made; a model of any other family is probed with a forward."""
    from speccomplete.decoder.drafts import self_draft

    monkeypatch.setattr(self_draft, "BY_MODEL", {})
    model = tiny_llama(seed=4, layers=1)
    SelfDrafter(model, whole_vocabulary(model))
    model.config.final_logit_softcapping = 0.05
    with pytest.raises(ValueError, match="makes its logits otherwise than by its head"):
        SelfDrafter(model, whole_vocabulary(model))


def test_self_needs_a_reduced_vocabulary(llama, tokenizer):
    with pytest.raises(DraftLoadError, match="no trained draft ships for this target"):
        build_drafter("self", llama, tokenizer)
    with pytest.raises(DraftLoadError, match="not a trained draft folder"):
        build_drafter("self:/nonexistent/draft", llama, tokenizer)
    # the default, ngram+self, stays usable with any target: the lookup alone
    drafter, draft_model = build_drafter("ngram+self", llama, tokenizer)
    assert isinstance(drafter, HybridDrafter) and drafter.model is None and draft_model is None
