"""Draft specs are parsed once into typed specs (decoder/drafts/spec.py), with clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.tiny_models import tiny_llama

from speccomplete.decoder.drafts import DraftLoadError, draft_label, parse_draft_spec
from speccomplete.decoder.drafts.spec import (
    AutoDraft,
    HybridDraft,
    LayersDraft,
    ModelDraft,
    NgramDraft,
    NoDraft,
    SelfDraft,
    TrainedDraft,
)


@pytest.fixture
def trained_folder(tmp_path) -> Path:
    folder = tmp_path / "my-draft"
    folder.mkdir()
    (folder / "draft.json").write_text(json.dumps({"layers": [0], "target_config": {}}))
    return folder


@pytest.mark.parametrize(
    "text, spec",
    [
        ("auto", AutoDraft()),
        ("none", NoDraft()),
        ("ngram", NgramDraft()),
        ("self", SelfDraft()),
        ("layers:0,1", LayersDraft((0, 1))),
        ("layers:0", LayersDraft((0,))),
        ("gemma3-270m", ModelDraft("gemma3-270m")),
        ("HuggingFaceTB/SmolLM2-135M", ModelDraft("HuggingFaceTB/SmolLM2-135M")),
        ("ngram+self", HybridDraft(SelfDraft())),
        ("ngram+none", HybridDraft(NoDraft())),
        ("ngram+auto", HybridDraft(AutoDraft())),
        ("ngram+layers:0,2", HybridDraft(LayersDraft((0, 2)))),
        ("ngram+smollm2-135m", HybridDraft(ModelDraft("smollm2-135m"))),
        ("distilgpt2", ModelDraft("distilgpt2")),  # a Hugging Face id of the time before owners
        ("someone/ngramm", ModelDraft("someone/ngramm")),  # with an owner, no name is taken for a typo
    ],
)
def test_good_specs(text, spec):
    assert parse_draft_spec(text) == spec
    assert str(spec) == text  # a spec reads back as what names it


def test_a_folder_with_draft_json_is_a_trained_draft(trained_folder):
    assert parse_draft_spec(str(trained_folder)) == TrainedDraft(trained_folder)
    assert parse_draft_spec(f"self:{trained_folder}") == SelfDraft(trained_folder)
    assert parse_draft_spec(f"ngram+{trained_folder}") == HybridDraft(TrainedDraft(trained_folder))
    assert parse_draft_spec(str(trained_folder.parent)) == ModelDraft(str(trained_folder.parent))  # no draft.json


@pytest.mark.parametrize(
    "text, error, message",
    [
        ("", ValueError, "empty draft spec"),
        ("ngram+", ValueError, "empty draft spec"),
        ("ngram+ngram", ValueError, "'ngram\\+' must be followed by a model draft or 'none'"),
        ("ngram+ngram+none", ValueError, "'ngram\\+' must be followed by a model draft or 'none'"),
        ("layers:", ValueError, "must look like layers:0,1"),
        ("layers:0,x", ValueError, "must look like layers:0,1"),
        ("self:/nonexistent/draft", DraftLoadError, "not a trained draft folder"),
        ("ngramm", ValueError, "unknown draft spec 'ngramm' \\(did you mean 'ngram'\\?\\): use auto, none, ngram,"),
        ("Eagle", ValueError, "did you mean 'eagle3'"),
        ("gemma3-27Om", ValueError, "did you mean 'gemma3-270m'.*a packaged alias \\(smollm2-135m, gemma3-270m\\)"),
        ("ngram+nonne", ValueError, "unknown draft spec 'nonne' \\(did you mean 'none'"),
        ("layer:0,1", ValueError, "unknown draft spec 'layer:0,1': use auto"),
        ("ngram + self", ValueError, "unknown draft spec"),
    ],
)
def test_bad_specs(text, error, message):
    with pytest.raises(error, match=message):
        parse_draft_spec(text)


def test_labels_resolve_auto_and_name_trained_folders(trained_folder):
    target = tiny_llama(seed=0, layers=2)  # no trained draft ships for it: auto is its first two layers
    assert draft_label("auto", target) == "layers:0,1"
    assert draft_label("ngram+auto", target) == "ngram+layers:0,1"
    assert draft_label(str(trained_folder), target) == "my-draft"
    assert draft_label(f"ngram+{trained_folder}", target) == "ngram+my-draft"
    assert draft_label("ngram+self", target) == "ngram+self"
    assert draft_label(parse_draft_spec("layers:0"), target) == "layers:0"
