"""Every drafter offers each member of the Drafter protocol the decoder uses (decoder/drafts/base.py)."""

from __future__ import annotations

import torch
from helpers.tiny_models import tiny_llama

from speccomplete.decoder.drafts import Drafter, HybridDrafter, ModelDrafter, NgramDrafter, SelfDrafter, derive_draft
from speccomplete.decoder.engine import round_rows
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.target_steps import EagerTarget


def test_every_drafter_declares_the_protocol():
    target = tiny_llama(seed=0, layers=2)
    self_draft = SelfDrafter(target, torch.arange(0, 258, 2))
    drafters = {
        "ngram": (NgramDrafter(), 0, False),
        "model": (ModelDrafter(derive_draft(target, [0])), 0, False),
        "self": (self_draft, 0, True),
        "ngram+none": (HybridDrafter(None, lookup_tokens=6), 6, False),
        "ngram+self": (HybridDrafter(self_draft, lookup_tokens=6), 6, True),
    }
    steps = EagerTarget(target)
    for name, (drafter, lookup_tokens, on_the_target) in drafters.items():
        assert Drafter in type(drafter).__mro__, name
        assert drafter.lookup_tokens == lookup_tokens, name
        assert drafter.drafts_on_the_target is on_the_target, name
        assert round_rows(FixedGamma(3), drafter) == max(3, lookup_tokens) + 1, name
        drafter.attach(steps)
    assert self_draft.steps is steps  # attached through the hybrid too
