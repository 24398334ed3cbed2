"""An install without the trained drafts' weights (the VS Code extension's: tools/lean_wheel.py): the default draft
still cuts the target's head to the shipped vocabulary, `auto` drafts with the target's first layers, and a draft
that needs weights says why it has none."""

from __future__ import annotations

import pytest
import torch
from helpers.tiny_models import tiny_llama

from speccomplete.decoder.drafts import (
    DraftLoadError,
    HybridDrafter,
    ModelDrafter,
    SelfDrafter,
    build,
    build_drafter,
    trained,
)
from speccomplete.decoder.drafts.spec import LayersDraft
from speccomplete.decoder.drafts.trained import (
    VOCABULARY,
    WEIGHTS,
    DraftMeta,
    draft_vocabulary,
    draft_with_own_layers,
    save_draft,
    target_signature,
    write_vocabulary,
)


@pytest.fixture
def target():
    return tiny_llama(seed=3, layers=3)


@pytest.fixture
def lean_shipped(tmp_path, monkeypatch, target):
    """A shipped trained draft for `target`, its weights left out as a lean install leaves them."""
    shipped = tmp_path / "weights"
    vocab_ids = torch.arange(3, 131)
    draft = draft_with_own_layers(target, [0], vocab_ids)
    folder = save_draft(draft, shipped / "tiny-code", DraftMeta(target_config=target_signature(target), layers=[0]))
    assert (folder / VOCABULARY).exists()
    (folder / WEIGHTS).unlink()
    for module in (trained, build):
        monkeypatch.setattr(module, "SHIPPED_DRAFTS", shipped)
    return folder, vocab_ids


def test_the_default_draft_needs_only_the_vocabulary(lean_shipped, target, tokenizer):
    _, vocab_ids = lean_shipped
    drafter, _ = build_drafter("ngram+self", target, tokenizer)
    assert isinstance(drafter, HybridDrafter) and isinstance(drafter.model, SelfDrafter)
    assert torch.equal(drafter.model.vocab_ids, vocab_ids)


def test_the_self_drafts_head_is_cut_to_the_most_frequent_ids_where_they_are_counted(
    lean_shipped, target, tokenizer, monkeypatch
):
    folder, vocab_ids = lean_shipped
    counts = (vocab_ids * 7919) % 101  # an order of its own, not the ids'
    write_vocabulary(folder, vocab_ids, counts)
    most = vocab_ids[counts.argsort(descending=True, stable=True)[:16]].sort().values
    assert torch.equal(draft_vocabulary(folder, target, rows=16), most)
    assert torch.equal(draft_vocabulary(folder, target), vocab_ids)  # the whole vocabulary unless asked
    monkeypatch.setattr(SelfDrafter, "head_size", 16)
    drafter, _ = build_drafter("ngram+self", target, tokenizer)
    assert torch.equal(drafter.model.vocab_ids, most) and drafter.model.head.out_features == 16
    with pytest.raises(ValueError, match="128 vocabulary ids but 3 counts"):
        write_vocabulary(folder, vocab_ids, counts[:3])
    write_vocabulary(folder, vocab_ids)  # uncounted: the head keeps every id
    drafter, _ = build_drafter("ngram+self", target, tokenizer)
    assert torch.equal(drafter.model.vocab_ids, vocab_ids)


def test_auto_drafts_with_the_targets_layers_and_a_named_draft_says_why_not(lean_shipped, target, tokenizer):
    folder, _ = lean_shipped
    assert build.default_draft_for(target) == LayersDraft((0, 1))
    drafter, _ = build_drafter("auto", target, tokenizer)
    assert isinstance(drafter, ModelDrafter)
    with pytest.raises(DraftLoadError, match="leaves the trained drafts' weights out"):
        build_drafter(str(folder), target, tokenizer)
