"""The lean forward (decoder/lean_forward.py) computes what HF's forward computes, step for step as
decoding feeds it."""

from __future__ import annotations

import copy
import gc
import weakref

import pytest
import torch
from helpers.steps import forward_hidden, rollback_feeds
from helpers.tiny_models import tiny_gemma3, tiny_llama
from transformers import DynamicCache

from speccomplete.decoder import lean_forward
from speccomplete.decoder.drafts import derive_draft
from speccomplete.decoder.kernels import pack_linear_weights
from speccomplete.decoder.kv_cache import forward_logits, new_cache


def _uneven_norms(model):
    """Norm weights away from their init (zeros for Gemma's 1 + w, ones for Llama's w), so a norm
    applied the other family's way shows."""
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return model


@pytest.mark.parametrize("family", ["gemma3", "llama"])
@pytest.mark.parametrize("packed", [False, True])
def test_same_logits_as_hf_through_steps_verifies_and_rollbacks(family, packed, monkeypatch):
    # a window of 8 (Gemma-3's sliding layers) is passed many times over, by one row and by many
    model = _uneven_norms(tiny_gemma3(sliding_window=8) if family == "gemma3" else tiny_llama())
    if packed:
        pack_linear_weights(model)
    assert lean_forward.supports(model)
    runs = []
    lean_hidden = lean_forward.lean_hidden
    monkeypatch.setattr(lean_forward, "lean_hidden", lambda *args: runs.append(1) or lean_hidden(*args))
    ids = torch.randint(3, 250, (70,), generator=torch.Generator().manual_seed(0)).tolist()
    ours, hfs = new_cache(), DynamicCache()  # the lean forward runs on ours only
    with torch.inference_mode():
        for feed, crop in rollback_feeds(ids):
            got = forward_logits(model, ours, feed, keep=len(feed))
            want = model(input_ids=torch.tensor([feed]), past_key_values=hfs, use_cache=True).logits[0]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
            if crop:
                ours.crop(crop)
                hfs.crop(crop)
            assert ours.get_seq_length() == hfs.get_seq_length()
    assert len(runs) == len(rollback_feeds(ids))  # every forward on our cache ran the lean way


def test_same_hidden_states_as_hf_for_a_derived_draft(gemma3):
    # a derived draft keeps the target's layer numbers (0 and 3 here) as its cache indices
    draft = derive_draft(_uneven_norms(gemma3), [0, 3])
    ids = torch.randint(3, 250, (30,), generator=torch.Generator().manual_seed(1)).tolist()
    ours, hfs = new_cache(), DynamicCache()
    with torch.inference_mode():
        for feed in (ids[:20], ids[20:21], ids[21:25]):
            got = forward_hidden(draft, ours, feed)
            want = draft.base_model(
                input_ids=torch.tensor([feed]), past_key_values=hfs, use_cache=True
            ).last_hidden_state[0]
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_other_models_keep_hf_forward(gpt2, gemma3):
    assert not lean_forward.supports(gpt2)  # another family
    assert not lean_forward.supports(copy.deepcopy(gemma3).to(torch.bfloat16))  # not fp32
    capped = copy.deepcopy(gemma3)
    capped.config.attn_logit_softcapping = 50.0
    assert not lean_forward.supports(capped)
    for hooked_part in ("", "model.layers.1", "model.layers.2.self_attn.k_norm"):
        hooked = copy.deepcopy(gemma3)
        hooked.get_submodule(hooked_part).register_forward_hook(lambda module, args, out: out)
        assert not lean_forward.supports(hooked)  # whatever the hook does, HF's forward runs it
    chosen = copy.deepcopy(gemma3)
    lean_forward.keep_hf_forward(chosen)
    assert not lean_forward.supports(chosen) and lean_forward.supports(gemma3)
    hooked = copy.deepcopy(gemma3)
    hooked.get_submodule("model.layers.1.mlp").register_forward_hook(lambda module, args, out: out)
    assert lean_forward.supports(hooked)  # the lean forward calls the MLP as a module: its hooks run
    recorded = copy.deepcopy(gemma3)
    with torch.inference_mode():  # transformers installs its output-recording hooks and leaves them
        recorded(input_ids=torch.tensor([[1, 2, 3]], device=recorded.device), output_hidden_states=True)
    assert any(m._forward_hooks for m in recorded.modules()) and lean_forward.supports(recorded)


def test_a_model_the_forward_has_looked_at_is_freed_once_dropped():
    """`supports` keeps what it learnt of a model by a weak key: a server's reload drops the old models for good."""
    model = tiny_llama(seed=5)
    assert lean_forward.supports(model)
    dropped = weakref.ref(model)
    del model
    gc.collect()
    assert dropped() is None
