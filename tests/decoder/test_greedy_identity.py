"""Greedy speculative decoding must reproduce the target's own greedy output token for token.

The reference is the same engine with no drafter (plain autoregressive decoding, γ = 0), which
is itself checked against HF `generate(do_sample=False)` and against a cache-free recompute.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.decoding import check_stats, generate, random_prompts
from helpers.tokenizers import EOS

from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, NgramDrafter, build_drafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma, HeuristicGamma

PROMPTS = random_prompts(50, seed=2024)
MAX_NEW = 12
FEW = PROMPTS[::2]  # 25 prompts for the secondary variants
GAMMAS = [1, 2, 4, 8]


@pytest.fixture(scope="module")
def targets(llama, gpt2, llama_other, gpt2_other):
    return {"llama": (llama, llama_other), "gpt2": (gpt2, gpt2_other)}


@pytest.fixture(scope="module")
def reference(targets, tokenizer):
    """AR greedy output for every prompt, per target (computed once)."""
    out = {}
    for name, (model, _) in targets.items():
        ar = SpeculativeDecoder(model, tokenizer)  # no drafter: γ = 0, plain AR
        out[name] = [generate(ar, p, max_new_tokens=MAX_NEW) for p in PROMPTS]
    return out


def _assert_same(spec_gens, ref_gens, prompts=PROMPTS):
    assert len(spec_gens) == len(ref_gens) == len(prompts)
    for prompt, got, want in zip(prompts, spec_gens, ref_gens):
        assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason), prompt
        assert got.text == want.text, prompt


def _make_drafter(kind, model, other):
    if kind == "derived":
        return ModelDrafter(derive_draft(model, [0]))
    if kind == "independent":
        return ModelDrafter(other)
    if kind == "ngram":
        return NgramDrafter()
    raise AssertionError(kind)


def test_reference_is_plain_ar(reference):
    for gens in reference.values():
        for g in gens:
            assert g.stats.drafted == 0 and g.stats.accepted == 0
            assert g.stats.rounds == len(g.token_ids) == MAX_NEW
            assert g.finish_reason == "length"


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("kind", ["derived", "independent"])
@pytest.mark.parametrize("target", ["llama", "gpt2"])
def test_fixed_gamma_matches_ar(targets, reference, tokenizer, target, kind, gamma):
    model, other = targets[target]
    decoder = SpeculativeDecoder(model, tokenizer, _make_drafter(kind, model, other), FixedGamma(gamma))
    gens = [generate(decoder, p, max_new_tokens=MAX_NEW) for p in PROMPTS]
    _assert_same(gens, reference[target])
    drafted = sum(g.stats.drafted for g in gens)
    accepted = sum(g.stats.accepted for g in gens)
    rejected = sum(g.stats.rejected_rounds for g in gens)
    # the comparison only means something if drafts were both accepted and rejected
    assert drafted > 0 and accepted > 0 and rejected > 0
    for g in gens:
        # a model drafter fills γ, but for a round's last token drafts no more than are still wanted
        # (each round commits one at least, so that is at most the last γ rounds)
        assert all(k == gamma for k in g.stats.gammas[:-gamma]) and max(g.stats.gammas) == gamma
        assert len(g.stats.accepted_histogram) <= gamma + 1


@pytest.mark.parametrize("target", ["llama", "gpt2"])
@pytest.mark.parametrize("kind", ["derived", "independent", "ngram"])
def test_heuristic_gamma_matches_ar(targets, reference, tokenizer, target, kind):
    model, other = targets[target]
    policy = HeuristicGamma(start=4, max_gamma=8, first_probe_after=2)
    decoder = SpeculativeDecoder(model, tokenizer, _make_drafter(kind, model, other), policy)
    gens = [generate(decoder, p, max_new_tokens=MAX_NEW) for p in FEW]  # policy state carries over
    _assert_same(gens, reference[target][::2], FEW)
    if kind != "ngram":  # (lookup that finds nothing counts as a miss, so γ soon sits at 0 for n-grams here)
        assert sum(g.stats.accepted for g in gens) > 0
    assert any(k > 0 for g in gens for k in g.stats.gammas)
    assert all(0 <= k <= 8 for g in gens for k in g.stats.gammas)


@pytest.mark.parametrize("gamma", [1, 3, 8])
@pytest.mark.parametrize("target", ["llama", "gpt2"])
def test_ngram_drafter_matches_ar(targets, reference, tokenizer, target, gamma):
    model, _ = targets[target]
    decoder = SpeculativeDecoder(model, tokenizer, NgramDrafter(), FixedGamma(gamma))
    gens = [generate(decoder, p, max_new_tokens=MAX_NEW) for p in FEW]
    _assert_same(gens, reference[target][::2], FEW)
    assert sum(g.stats.accepted for g in gens) > 0
    assert sum(g.stats.rejected_rounds for g in gens) > 0
    # lookup may find nothing or fewer than γ tokens: it never proposes more than γ
    assert all(k <= gamma for g in gens for k in g.stats.gammas)


def test_draft_with_skipped_layers_and_confidence_cutoff(llama, tokenizer, reference):
    """A derived draft from non-contiguous layers [0, 2], drafting only while its confidence is high."""
    draft_model = derive_draft(llama, [0, 2])
    with torch.inference_mode():  # a threshold at the median of the draft's top probabilities
        inputs = [torch.tensor([tokenizer(p)["input_ids"]], device=llama.device) for p in PROMPTS[:20]]
        tops = torch.cat([torch.softmax(draft_model(x, use_cache=False).logits[0], -1).max(-1).values for x in inputs])
    threshold = float(tops.median())
    decoder = SpeculativeDecoder(llama, tokenizer, ModelDrafter(draft_model), FixedGamma(6), draft_confidence=threshold)
    gens = [generate(decoder, p, max_new_tokens=MAX_NEW) for p in FEW]
    _assert_same(gens, reference["llama"][::2], FEW)
    gammas = [k for g in gens for k in g.stats.gammas]
    assert any(k < 6 for k in gammas) and any(k == 6 for k in gammas)  # the cutoff did stop some rounds early


def test_ar_matches_hf_generate(targets, reference, tokenizer):
    for name, (model, _) in targets.items():
        for i in range(0, len(PROMPTS), 10):
            ids = tokenizer(PROMPTS[i])["input_ids"]
            x = torch.tensor([ids], device=model.device)
            out = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=MAX_NEW,
                eos_token_id=None,
                pad_token_id=0,
            )
            assert out[0, len(ids) :].tolist() == reference[name][i].token_ids, (name, PROMPTS[i])


def test_eos_finish_matches_ar(llama, llama_other, tokenizer, reference, monkeypatch):
    """With a token the model does emit made an EOS id, speculative and AR stop at the same place."""
    counts: dict[int, int] = {}
    for g in reference["llama"]:
        for t in set(g.token_ids[1:]):
            counts[t] = counts.get(t, 0) + 1
    stop_token = max(counts, key=counts.get)
    monkeypatch.setattr(llama.generation_config, "eos_token_id", [EOS, stop_token])
    ar = SpeculativeDecoder(llama, tokenizer)
    assert ar.eos == {EOS, stop_token}
    want = [generate(ar, p, max_new_tokens=MAX_NEW) for p in PROMPTS]
    for w, r in zip(want, reference["llama"]):  # AR with EOS = AR without it, cut before the first EOS
        if stop_token in r.token_ids:
            assert w.finish_reason == "eos"
            assert w.token_ids == r.token_ids[: r.token_ids.index(stop_token)]
        else:
            assert w.finish_reason == "length" and w.token_ids == r.token_ids
    reasons = {w.finish_reason for w in want}
    assert reasons == {"eos", "length"}
    for drafter, policy in [
        (ModelDrafter(derive_draft(llama, [0])), FixedGamma(4)),
        (ModelDrafter(llama_other), FixedGamma(2)),
        (NgramDrafter(), HeuristicGamma()),
    ]:
        spec = SpeculativeDecoder(llama, tokenizer, drafter, policy)
        for p, w in zip(FEW, want[::2]):
            got = generate(spec, p, max_new_tokens=MAX_NEW)
            assert (got.token_ids, got.finish_reason, got.text) == (w.token_ids, w.finish_reason, w.text), p


@pytest.mark.parametrize("target", ["llama", "gpt2"])
def test_hybrid_drafter_matches_ar(targets, reference, tokenizer, target):
    model, _ = targets[target]
    decoder = SpeculativeDecoder(
        model, tokenizer, HybridDrafter(ModelDrafter(derive_draft(model, [0]))), HeuristicGamma(start=2, max_gamma=6)
    )
    gens = [generate(decoder, p, max_new_tokens=MAX_NEW) for p in PROMPTS]
    _assert_same(gens, reference[target])
    lookup = sum(g.stats.lookup_drafted for g in gens)
    model_drafted = sum(g.stats.drafted for g in gens) - lookup
    # both halves ran: lookups where the prompt repeats itself, the model elsewhere
    assert lookup > 0 and model_drafted > 0
    assert 0 < sum(g.stats.lookup_accepted for g in gens) <= lookup
    assert all(k <= max(6, decoder.drafter.lookup_tokens) for g in gens for k in g.stats.gammas)


def test_lookup_only_hybrid_matches_ar(llama, reference, tokenizer):
    """`ngram+none`: the hybrid's adaptive lookup with no model behind it; no match is a plain step."""
    drafter, draft = build_drafter("ngram+none", llama, tokenizer)
    assert isinstance(drafter, HybridDrafter) and drafter.model is None and draft is None
    decoder = SpeculativeDecoder(llama, tokenizer, drafter, HeuristicGamma())
    gens = [generate(decoder, p, max_new_tokens=MAX_NEW) for p in PROMPTS]
    _assert_same(gens, reference["llama"])
    assert sum(g.stats.lookup_drafted for g in gens) == sum(g.stats.drafted for g in gens) > 0
    assert any(0 in g.stats.gammas for g in gens)  # rounds without a match: plain target steps


def _extensions(prompts):
    """Request sequences an editor makes: the same file grown, edited mid-way, and a different one."""
    for p in prompts:
        yield [p, p + "xy", p + "xy z", p[: len(p) // 2] + "Q" + p[len(p) // 2 :], p[::-1]]


@pytest.mark.parametrize("kind", ["none", "derived"])
def test_prefix_reuse_between_requests_matches_fresh(llama, tokenizer, kind):
    """A decoder kept across requests gives what a fresh one gives, prefilling only what changed."""

    def fresh():
        drafter = ModelDrafter(derive_draft(llama, [0])) if kind == "derived" else None
        return SpeculativeDecoder(llama, tokenizer, drafter, FixedGamma(3) if drafter else None)

    kept = fresh()
    reused = []
    for requests in _extensions(PROMPTS[:6]):
        for i, p in enumerate(requests):
            got = generate(kept, p, max_new_tokens=MAX_NEW)
            want = generate(fresh(), p, max_new_tokens=MAX_NEW)
            assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason), p
            assert want.stats.prompt_reused_tokens == 0
            reused.append((i, got.stats.prompt_reused_tokens, got.stats.prompt_tokens))
    # a grown prompt reuses all but its new tail; the reversed file only its BOS
    grown = [r for i, r, n in reused if i in (1, 2)]
    assert all(r >= len(tokenizer(p)["input_ids"]) - 1 for r, p in zip(grown[::2], PROMPTS[:6]))
    assert all(r < n for _, r, n in reused)


# ----------------------------------------------------------------------------- Gemma 3: sliding window

GEMMA_PROMPTS = random_prompts(14, seed=99) + ["a" * 30, "def f(x):\n    return x * 2\n" * 2]
GEMMA_NEW = 16


def _greedy_no_cache(model, ids, n):
    """The ground truth: recompute the whole sequence every step, no KV cache involved."""
    ids = list(ids)
    out = []
    with torch.inference_mode():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([ids], device=model.device), use_cache=False).logits[0, -1]
            out.append(int(logits.argmax()))
            ids.append(out[-1])
    return out


@pytest.fixture(scope="module")
def gemma_reference(gemma3, tokenizer):
    ar = SpeculativeDecoder(gemma3, tokenizer)
    return [generate(ar, p, max_new_tokens=GEMMA_NEW) for p in GEMMA_PROMPTS]


def test_gemma_config_really_slides(gemma3, tokenizer, gemma_reference):
    assert gemma3.config.sliding_window == 8
    assert set(gemma3.config.layer_types) == {"sliding_attention", "full_attention"}
    assert all(len(tokenizer(p)["input_ids"]) + GEMMA_NEW > 8 for p in GEMMA_PROMPTS)
    # the window changes the output, so a cache that mishandled it would be caught
    config = copy.deepcopy(gemma3.config)
    config.sliding_window = 4096
    wide = type(gemma3)(config).to(gemma3.device).eval()
    wide.load_state_dict(gemma3.state_dict())
    wide_ar = SpeculativeDecoder(wide, tokenizer)
    differs = sum(
        generate(wide_ar, p, max_new_tokens=GEMMA_NEW).token_ids != r.token_ids
        for p, r in zip(GEMMA_PROMPTS, gemma_reference)
    )
    assert differs >= len(GEMMA_PROMPTS) // 2


def test_gemma_ar_matches_cache_free_and_hf(gemma3, tokenizer, gemma_reference):
    for i, (p, r) in enumerate(zip(GEMMA_PROMPTS, gemma_reference)):
        ids = tokenizer(p)["input_ids"]
        assert r.token_ids == _greedy_no_cache(gemma3, ids, GEMMA_NEW), p
        if i % 4 == 0:
            x = torch.tensor([ids], device=gemma3.device)
            out = gemma3.generate(
                x,
                attention_mask=torch.ones_like(x),
                do_sample=False,
                max_new_tokens=GEMMA_NEW,
                eos_token_id=None,
                pad_token_id=0,
            )
            assert out[0, len(ids) :].tolist() == r.token_ids, p


@pytest.mark.parametrize(("layers", "gamma"), [([0, 1], 1), ([0, 1], 2), ([0, 1], 4), ([0, 1], 8), ([0], 3)])
def test_gemma_rollback_across_sliding_window(gemma3, tokenizer, gemma_reference, layers, gamma):
    decoder = SpeculativeDecoder(gemma3, tokenizer, ModelDrafter(derive_draft(gemma3, layers)), FixedGamma(gamma))
    gens = [generate(decoder, p, max_new_tokens=GEMMA_NEW) for p in GEMMA_PROMPTS]
    for p, got, want in zip(GEMMA_PROMPTS, gens, gemma_reference):
        assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason), p
    assert sum(g.stats.accepted for g in gens) > 0
    assert sum(g.stats.rejected_rounds for g in gens) > 0


def test_gemma_ngram_and_heuristic(gemma3, tokenizer, gemma_reference):
    for drafter in (NgramDrafter(), ModelDrafter(derive_draft(gemma3, [0, 1]))):
        decoder = SpeculativeDecoder(gemma3, tokenizer, drafter, HeuristicGamma(start=2, max_gamma=8))
        for p, want in zip(GEMMA_PROMPTS, gemma_reference):
            got = generate(decoder, p, max_new_tokens=GEMMA_NEW)
            assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason), p


def test_gemma_prefix_reuse_across_sliding_window(gemma3, tokenizer):
    """Reused caches hold the full history, so a sliding window after reuse still matches."""
    decoder = SpeculativeDecoder(gemma3, tokenizer, ModelDrafter(derive_draft(gemma3, [0, 1])), FixedGamma(3))
    for p in GEMMA_PROMPTS:
        first = generate(decoder, p, max_new_tokens=GEMMA_NEW)
        accepted = tokenizer(p)["input_ids"] + first.token_ids  # the user took the completion and asks again
        got = generate(decoder, accepted, max_new_tokens=GEMMA_NEW)
        want = generate(SpeculativeDecoder(gemma3, tokenizer), accepted, max_new_tokens=GEMMA_NEW)
        assert got.stats.prompt_reused_tokens > 8 + GEMMA_NEW // 2  # more than a window came from the cache
        assert (got.token_ids, got.finish_reason) == (want.token_ids, want.finish_reason), p


def test_stats_invariants_on_a_mixed_run(llama, tokenizer):
    decoder = SpeculativeDecoder(llama, tokenizer, ModelDrafter(derive_draft(llama, [0])), HeuristicGamma())
    for p in PROMPTS[:10]:
        g = decoder.generate(p)
        check_stats(g)
        s = g.stats
        assert s.prompt_tokens == len(tokenizer(p)["input_ids"])
        assert s.rounds == len(s.gammas)
        assert s.accepted <= s.drafted
        assert sum(s.accepted_histogram) == sum(1 for k in s.gammas if k)
        assert s.new_tokens == len(g.token_ids)
        # each round commits its accepted drafts plus exactly one target token
        assert len(g.token_ids) <= s.accepted + s.rounds
