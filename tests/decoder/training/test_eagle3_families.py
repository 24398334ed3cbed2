"""The EAGLE-3 trainer on a target of each decoder family: the tapped layers follow the target's depth, the
features it trains on are the states the decoder taps while drafting, and a training step's loss and gradients
are finite."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import FAMILY_BUILDERS, tiny_llama

from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, default_aux_layers, init_from_target
from speccomplete.decoder.kv_cache import forward_tapped, new_cache
from speccomplete.decoder.training.eagle3 import target_states, trainable_parameters, ttt_loss

BUILDERS = {**FAMILY_BUILDERS, "llama": lambda seed=0, **kw: tiny_llama(seed=seed, layers=kw["num_hidden_layers"])}
LAYERS = 8  # deep enough for the default low, middle and high taps (2, n // 2, n - 3) to be distinct


def test_the_default_taps_follow_the_depth():
    # speculators' and vLLM's ids for real depths: Qwen2.5-Coder-0.5B (24 layers), 1.5B (28), 7B (28), 3B (36)
    assert default_aux_layers(24) == (2, 12, 21)
    assert default_aux_layers(28) == (2, 14, 25)
    assert default_aux_layers(36) == (2, 18, 33)
    for depth in range(1, 40):
        taps = default_aux_layers(depth)
        assert all(0 <= t <= depth for t in taps) and list(taps) == sorted(set(taps)), depth


@pytest.mark.parametrize("family", list(BUILDERS))
def test_the_trainer_taps_what_the_decoder_taps(family):
    target = BUILDERS[family](seed=0, num_hidden_layers=LAYERS)
    vocab_ids = torch.arange(64)
    shape = Eagle3Shape.for_target(target, draft_vocab=len(vocab_ids))
    assert shape.aux_layers == default_aux_layers(LAYERS) == (2, 4, 5)
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        features, final = target_states(target, ids, list(shape.aux_layers))
        _, tapped = forward_tapped(target, new_cache(), ids[0], keep=1, taps=shape.aux_layers)
    assert features.shape == (1, 12, 3 * target.config.hidden_size)
    torch.testing.assert_close(features[0], tapped.reshape(12, -1).to(features.dtype), atol=1e-4, rtol=1e-4)

    draft = init_from_target(shape, target, vocab_ids, seed=0).float().train()
    loss, _ = ttt_loss(draft, target.get_input_embeddings().weight, ids, features, final, steps=2)
    loss.backward()
    grads = [p.grad for p in trainable_parameters(draft).values() if p.grad is not None]
    assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads)
