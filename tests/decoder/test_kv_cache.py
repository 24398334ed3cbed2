"""The preallocated KV cache behaves as HF's DynamicCache: same logits through growth and crops."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from speccomplete.decoder.kv_cache import PreallocatedLayer, forward_logits, new_cache


def test_growth_and_crops_match_dynamic_cache(gemma3):
    ids = torch.randint(3, 250, (700,), generator=torch.Generator().manual_seed(0)).tolist()
    ours, theirs = new_cache(), DynamicCache()
    with torch.inference_mode():
        # prefill past the first capacity (512), then decode, verify and roll back as the engine does
        steps = [
            (ids[:300], 0),
            (ids[300:600], 0),
            (ids[600:605], -3),
            (ids[603:604], 0),
            (ids[604:640], -20),
            (ids[620:700], 0),
        ]
        for feed, crop in steps:
            got = forward_logits(gemma3, ours, feed, keep=len(feed))
            want = forward_logits(gemma3, theirs, feed, keep=len(feed))
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            if crop:
                ours.crop(crop)
                theirs.crop(crop)
            assert ours.get_seq_length() == theirs.get_seq_length()
    layer = ours.layers[0]
    assert isinstance(layer, PreallocatedLayer) and layer._key_buffer.shape[-2] >= 700
    assert (
        layer.keys.shape[-2] == ours.get_seq_length() > 512 and layer.keys.data_ptr() == layer._key_buffer.data_ptr()
    )  # a view


def test_crop_takes_a_negative_count(gemma3):
    cache = new_cache()
    with torch.inference_mode():
        forward_logits(gemma3, cache, [5, 6, 7, 8], keep=1)
    cache.crop(-4)
    assert cache.get_seq_length() == 0
    try:
        cache.layers[0].crop(2)
    except ValueError as e:
        assert "negative" in str(e)
    else:
        raise AssertionError("a positive crop must be refused")
