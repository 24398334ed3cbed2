"""oneDNN-packed linears: same numbers as nn.Linear, and the speculative loop stays lossless on them."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from helpers.decoding import assert_greedy_matches, random_prompts

from speccomplete.decoder.drafts import ModelDrafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.kernels import PackedGatedMLP, PackedLinear, can_pack, pack_linear_weights
from speccomplete.decoder.loader import use_cpu_kernels

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")


@pytest.fixture()
def packed_pair(llama):
    plain = copy.deepcopy(llama)
    packed = copy.deepcopy(llama)
    draft = derive_draft(packed, [0])
    linears = sum(isinstance(m, torch.nn.Linear) for m in packed.modules())
    assert pack_linear_weights(packed, draft) == linears  # the draft's shared linears were packed once
    return plain, packed, draft


def test_every_linear_is_swapped_and_shared_modules_stay_shared(packed_pair):
    _, packed, draft = packed_pair
    assert not any(isinstance(m, torch.nn.Linear) for m in list(packed.modules()) + list(draft.modules()))
    assert draft.lm_head is packed.lm_head and isinstance(packed.lm_head, PackedLinear)
    assert draft.model.layers[0] is packed.model.layers[0]
    mlp = packed.model.layers[0].mlp
    assert isinstance(mlp, PackedGatedMLP) and mlp.gate_up.out_features == 2 * mlp.down_proj.in_features


@pytest.mark.parametrize("rows", [1, 2, 5, 9])
def test_packed_logits_equal_plain(packed_pair, rows):
    plain, packed, _ = packed_pair
    ids = torch.randint(3, 200, (1, 20))
    with torch.inference_mode():
        want = plain(ids).logits[0, -rows:]
        got = packed(ids).logits[0, -rows:]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_packed_gemma3_logits_equal_plain(gemma3):
    """Gemma-3's gated MLP (tanh GELU) fused, and its sliding-window layers, on packed weights."""
    plain, packed = copy.deepcopy(gemma3), copy.deepcopy(gemma3)
    pack_linear_weights(packed)
    assert all(isinstance(layer.mlp, PackedGatedMLP) for layer in packed.model.layers)
    ids = torch.randint(3, 200, (1, 24))
    with torch.inference_mode():
        torch.testing.assert_close(packed(ids).logits, plain(ids).logits, rtol=1e-4, atol=1e-4)


def test_speculative_on_packed_weights_matches_ar(packed_pair, tokenizer):
    _, packed, draft = packed_pair
    ar = SpeculativeDecoder(packed, tokenizer)
    spec = SpeculativeDecoder(packed, tokenizer, ModelDrafter(draft), FixedGamma(4))
    assert_greedy_matches(ar, spec, random_prompts(20, seed=5), max_new_tokens=12)


def test_only_cpu_float32_is_packed(llama):
    half = copy.deepcopy(llama).to(torch.bfloat16)
    assert not can_pack(half)
    assert pack_linear_weights(half, None) == 0
    assert any(isinstance(m, torch.nn.Linear) for m in half.modules())


def test_compiled_steps_keep_the_stock_linears(llama):
    """torch.compile packs weights itself: compiled steps get the stock linears."""
    model = copy.deepcopy(llama)
    use_cpu_kernels(SimpleNamespace(records_graphs=True), model)
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    use_cpu_kernels(SimpleNamespace(records_graphs=False), model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
