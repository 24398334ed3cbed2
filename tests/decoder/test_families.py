"""The lean forward (decoder/lean_forward.py) and int8 (decoder/kernels.py) for Qwen2, Qwen3, Mistral, Gemma,
Gemma 2 and StarCoder2 (issue 41): the lean forward's logits equal HF's, and greedy speculative output equals
the family's own AR, in fp32 and in int8. Tiny random models from tests/helpers/tiny_models.py."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from helpers.decoding import assert_greedy_matches, generate, random_prompts
from helpers.steps import rollback_feeds, verify_and_steps
from helpers.tiny_models import (
    FAMILY_BUILDERS,
    TEST_DEVICE,
    tiny_gemma,
    tiny_gemma2,
    tiny_gemma3,
    tiny_llama,
    tiny_mistral,
    tiny_qwen2,
    tiny_qwen3,
    tiny_starcoder2,
)
from transformers import DynamicCache

from speccomplete.decoder import kernels, lean_forward
from speccomplete.decoder.drafts import ModelDrafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.families import BY_MODEL
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.kernels import Int8Linear, PackedProjections, pack_linear_weights
from speccomplete.decoder.kv_cache import forward_logits, new_cache
from speccomplete.decoder.loader import use_cpu_kernels

# each family as built, and the configs that exercise more of it: sliding windows (per layer in Qwen2, over
# all layers in Mistral and StarCoder2), Qwen3 with biases, Gemma 2 with caps low enough to bend its logits
VARIANTS = {
    "qwen2": (tiny_qwen2, {}),
    "qwen2-window": (tiny_qwen2, {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
    "qwen3": (tiny_qwen3, {}),
    "qwen3-bias": (tiny_qwen3, {"attention_bias": True}),
    "mistral": (tiny_mistral, {}),
    "mistral-window": (tiny_mistral, {"sliding_window": 8}),
    "gemma": (tiny_gemma, {}),
    "gemma2": (tiny_gemma2, {}),
    "gemma2-low-caps": (tiny_gemma2, {"attn_logit_softcapping": 0.5, "final_logit_softcapping": 2.0}),
    "starcoder2": (tiny_starcoder2, {}),
    "starcoder2-window": (tiny_starcoder2, {"sliding_window": 8}),
}


# int8 linears run on the CPU only (decoder/kernels.py, can_int8)
INT8_RUNS = TEST_DEVICE.type == "cpu" and hasattr(torch, "_int_mm")
needs_int8 = pytest.mark.skipif(not INT8_RUNS, reason="int8 linears run on the CPU, with torch._int_mm")


def _variant(name: str):
    builder, overrides = VARIANTS[name]
    return builder(**overrides)


def _logits_through_feeds(model, lean: bool) -> list[torch.Tensor]:
    """Logits of every row of every feed, on the lean forward (our cache) or on HF's (HF's cache)."""
    ids = torch.randint(3, 250, (70,), generator=torch.Generator().manual_seed(0)).tolist()
    cache = new_cache() if lean else DynamicCache()
    out = []
    with torch.inference_mode():
        for feed, crop in rollback_feeds(ids):
            if lean:
                out.append(forward_logits(model, cache, feed, keep=len(feed)))
            else:
                input_ids = torch.tensor([feed], device=model.device)
                out.append(model(input_ids=input_ids, cache=cache, use_cache=True).logits[0])
            if crop:
                cache.crop(crop)
    return out


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_same_logits_as_hf_through_steps_verifies_and_rollbacks(variant, packed, monkeypatch):
    model = _variant(variant)
    if packed:
        pack_linear_weights(model)
    assert lean_forward.supports(model)
    runs = []
    lean_hidden = lean_forward.lean_hidden
    monkeypatch.setattr(lean_forward, "lean_hidden", lambda *args: runs.append(1) or lean_hidden(*args))
    got = _logits_through_feeds(model, lean=True)
    assert len(runs) == len(got)  # every forward on our cache ran the lean way
    want = _logits_through_feeds(model, lean=False)
    for ours, hfs in zip(got, want, strict=True):
        torch.testing.assert_close(ours, hfs, rtol=1e-5, atol=1e-5)
        assert torch.equal(ours.argmax(-1), hfs.argmax(-1))


def test_the_low_caps_bend_gemma2s_logits():
    """The low-caps variant above checks the soft-capped attention only if its caps change the logits."""
    capped = _variant("gemma2-low-caps")
    uncapped = copy.deepcopy(capped)
    uncapped.config.final_logit_softcapping = None
    for layer in uncapped.model.layers:
        layer.self_attn.attn_logit_softcapping = None
    with_caps, without = _logits_through_feeds(capped, lean=False), _logits_through_feeds(uncapped, lean=False)
    assert all((a - b).abs().max() > 1e-2 for a, b in zip(with_caps, without, strict=True))


def test_lean_ar_writes_what_hfs_ar_writes(tokenizer):
    """Greedy AR on the lean forward writes, token for token, what AR on HF's own forward writes."""
    for name in VARIANTS:
        model = _variant(name)
        on_hf = copy.deepcopy(model)
        lean_forward.keep_hf_forward(on_hf)
        for prompt in random_prompts(3, seed=5):
            want = generate(SpeculativeDecoder(on_hf, tokenizer), prompt, max_new_tokens=16)
            got = generate(SpeculativeDecoder(model, tokenizer), prompt, max_new_tokens=16)
            assert got.token_ids == want.token_ids, (name, prompt)


# Gemma's scaled embeddings outweigh its layers at the builder's init: its one-layer draft was never rejected
SPECULATIVE_OVERRIDES = {"gemma": {"initializer_range": 0.2}}


def _target_and_draft(family: str, int8: bool):
    """The family's tiny model on the CPU kernels (packed fp32, or int8) with a one-layer draft derived from
    it, as the loader sets them up."""
    builder, overrides = VARIANTS[family]
    target = builder(**{**overrides, **SPECULATIVE_OVERRIDES.get(family, {})})
    draft = derive_draft(target, [0])
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, draft, int8=int8)
    return target, draft


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral-window", "gemma", "gemma2", "starcoder2"])
def test_speculative_matches_its_ar(family, int8, tokenizer):
    if int8 and not INT8_RUNS:
        pytest.skip("int8 linears run on the CPU, with torch._int_mm")
    target, draft = _target_and_draft(family, int8)
    assert lean_forward.supports(target) and lean_forward.supports(draft)
    ar = SpeculativeDecoder(target, tokenizer)
    spec = SpeculativeDecoder(target, tokenizer, ModelDrafter(draft), FixedGamma(4))
    assert_greedy_matches(ar, spec, random_prompts(10, seed=9), max_new_tokens=24)


@needs_int8
@pytest.mark.parametrize("family", list(FAMILY_BUILDERS))
def test_int8_replaces_every_linear_fuses_qkv_and_keeps_biases(family):
    target, _ = _target_and_draft(family, int8=True)
    assert not any(isinstance(m, torch.nn.Linear) for m in target.modules())
    attention = target.model.layers[0].self_attn
    assert isinstance(attention.projections, PackedProjections) and not hasattr(attention, "q_proj")
    plain = FAMILY_BUILDERS[family]()
    plain_attention = plain.model.layers[0].self_attn
    has_bias = plain_attention.q_proj.bias is not None
    assert (attention.projections.product.bias is not None) == has_bias
    if has_bias:  # q, k and v's biases, concatenated as their outputs are
        want = torch.cat([getattr(plain_attention, name).bias for name in ("q_proj", "k_proj", "v_proj")])
        assert torch.equal(attention.projections.product.bias, want)
    if family == "starcoder2":  # its plain MLP: two int8 linears, each with its bias
        mlp, plain_mlp = target.model.layers[0].mlp, plain.model.layers[0].mlp
        assert isinstance(mlp.c_fc, Int8Linear) and torch.equal(mlp.c_fc.bias, plain_mlp.c_fc.bias)
        assert isinstance(mlp.c_proj, Int8Linear) and torch.equal(mlp.c_proj.bias, plain_mlp.c_proj.bias)


@needs_int8
@pytest.mark.parametrize("family", ["qwen2-window", "gemma2", "starcoder2-window"])
def test_int8_verify_rows_equal_one_row_steps_bit_for_bit(family):
    """Past the windows (8 tokens) and through Gemma 2's soft-capped attention too."""
    target, _ = _target_and_draft(family, int8=True)
    ids = torch.randint(3, 200, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    together, alone = verify_and_steps(target, ids)
    assert torch.equal(together, alone)


def test_supports_what_was_checked_and_nothing_else():
    assert all(lean_forward.supports(_variant(name)) for name in VARIANTS)
    dynamic_rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    refused = {
        "rope scaled by the length": tiny_qwen2(rope_parameters=dynamic_rope),
        "bidirectional attention": tiny_gemma(use_bidirectional_attention=True),
        "not fp32": tiny_mistral().to(torch.bfloat16),
    }
    hooked = tiny_qwen3()
    hooked.model.layers[1].self_attn.q_norm.register_forward_hook(lambda module, args, out: out)
    refused["a hook on a q norm it recomputes"] = hooked
    for reason, model in refused.items():
        assert not lean_forward.supports(model), reason
    assert not lean_forward.supports(torch.nn.Linear(4, 4))  # not a causal LM at all


@needs_int8
def test_int8_keeps_qkv_apart_where_hfs_forward_runs():
    """A model the lean forward refuses (a draft beside an int8 target) keeps q, k and v as HF's forward
    reads them, and that forward still runs."""
    model = tiny_qwen2(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    ids = torch.tensor([[5, 6, 7]])
    want = model(input_ids=ids).logits
    pack_linear_weights(model, int8=True)
    attention = model.model.layers[0].self_attn
    assert not hasattr(attention, "projections") and isinstance(attention.q_proj, Int8Linear)
    got = model(input_ids=ids).logits
    assert ((got - want).norm() / want.norm()).item() < 0.05


def test_every_family_in_the_table_runs_lean_and_int8():
    """decoder/families.py and the tests' tiny builders name the same families, and each record's modules are
    the ones its model has: a record without a builder, or a builder without a record, fails here."""
    builders = {**FAMILY_BUILDERS, "llama": tiny_llama, "gemma3": tiny_gemma3}
    built = {name: build() for name, build in builders.items()}
    assert {type(model.base_model).__name__ for model in built.values()} == set(BY_MODEL)
    for name, model in built.items():
        family = BY_MODEL[type(model.base_model).__name__]
        layer = model.model.layers[0]
        assert type(layer.self_attn).__name__ == family.attention, name
        assert kernels._is_gated_mlp(layer.mlp) == (family.gated_mlp is not None), name
        assert lean_forward.supports(model), name
        if INT8_RUNS:
            use_cpu_kernels(SimpleNamespace(records_graphs=False), model, None, int8=True)
            assert not any(isinstance(m, torch.nn.Linear) for m in model.modules()), name


def test_every_family_record_says_how_its_logits_are_made():
    """The self draft trusts a record's `logit_softcap` instead of probing (drafts/self_draft.py): with a soft cap in
    its config, each family's probe agrees with what its record says."""
    from speccomplete.decoder.drafts import self_draft

    builders = {**FAMILY_BUILDERS, "llama": tiny_llama, "gemma3": tiny_gemma3}
    for name, build in builders.items():
        model = build()
        model.config.get_text_config().final_logit_softcapping = 0.05  # small: tiny logits are far below a real cap
        family = BY_MODEL[type(model.base_model).__name__]
        try:
            self_draft._probe_logits_are_the_head(model)
            probed = True
        except ValueError:
            probed = False
        assert probed == family.logit_softcap, name
