"""The trained draft's file format (decoder/drafts/trained.py): draft.json as a typed DraftMeta."""

from __future__ import annotations

import json

import pytest

from speccomplete.decoder.drafts import SHIPPED_DRAFTS, DraftLoadError
from speccomplete.decoder.drafts.trained import DRAFT_JSON, DraftMeta


def test_the_shipped_draft_json_reads_and_writes_back_the_same(tmp_path):
    shipped = SHIPPED_DRAFTS / "gemma3-270m-code"
    meta = DraftMeta.read(shipped)
    assert meta.layers == [0, 1] and meta.draft_vocab == 32768
    assert meta.target_config["model_type"] == "gemma3_text"
    meta.write(tmp_path)
    assert (tmp_path / DRAFT_JSON).read_text() == (shipped / DRAFT_JSON).read_text()


def test_meta_round_trips(tmp_path):
    meta = DraftMeta(
        target_config={"vocab_size": 258},
        layers=[0, 2],
        target="t",
        objective="kd",
        corpus=[{"data": "d", "tokens": 5}],
        dev_fitness={"all": {"expected_acceptance": 0.5}},
        command="specdec finetune",
    )
    meta.write(tmp_path)
    assert DraftMeta.read(tmp_path) == meta


@pytest.mark.parametrize(
    "content, message",
    [
        ("{", "cannot read"),
        (json.dumps({"layers": [0]}), "cannot read"),  # no target_config
        (json.dumps({"format": "other", "layers": [0], "target_config": {}}), "not a version 1 specdec-draft"),
        (json.dumps({"version": 2, "layers": [0], "target_config": {}}), "not a version 1 specdec-draft"),
        (json.dumps([0]), "not a version 1 specdec-draft"),
    ],
)
def test_bad_meta_is_refused(tmp_path, content, message):
    (tmp_path / DRAFT_JSON).write_text(content)
    with pytest.raises(DraftLoadError, match=message):
        DraftMeta.read(tmp_path)
