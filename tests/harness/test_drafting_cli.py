"""`specdec corpus` and `specdec finetune` end to end on a tiny model, and their errors for bad input."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.corpus import write_python_splits
from helpers.lsp import save_random_model
from safetensors.torch import load_file

from speccomplete.cli import main
from speccomplete.decoder.drafts import build_drafter
from speccomplete.decoder.drafts.trained import VOCABULARY, DraftMeta, write_vocabulary
from speccomplete.decoder.models import load_model
from speccomplete.decoder.training.corpus import Shards
from tools import vocab_counts


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafting")
    model = save_random_model(root / "model")
    splits = write_python_splits(root, 6)
    for split, budget in (("train", "2k"), ("dev", "512")):
        assert (
            main(
                [
                    "corpus",
                    "--splits",
                    str(splits),
                    "--split",
                    split,
                    "--budget",
                    budget,
                    "--seq-len",
                    "64",
                    "--tokenizer",
                    str(model),
                    "--out",
                    str(root / split),
                ]
            )
            == 0
        )
    return root, model, splits


def test_corpus_then_finetune_ships_a_loadable_draft(workspace):
    root, model, splits = workspace
    manifest = json.loads((root / "train" / "manifest.json").read_text())
    assert manifest["per_language"]["python"]["tokens"] == 2000 // 64 * 64 and manifest["command"].startswith(
        "specdec corpus"
    )
    out = root / "draft"
    assert (
        main(
            [
                "finetune",
                "--data",
                str(root / "train"),
                "--dev",
                str(root / "dev"),
                "--out",
                str(out),
                "--target",
                str(model),
                "--layers",
                "0",
                "--draft-vocab",
                "64",
                "--tokens",
                "1k",
                "--batch-size",
                "2",
                "--eval-sequences",
                "1",
                "--eval-tokens",
                "32",
            ]
        )
        == 0
    )
    assert {"draft.json", "model.safetensors", "README.md"} <= {p.name for p in out.iterdir()}
    meta = DraftMeta.read(out)
    assert (
        meta.layers == [0] and meta.draft_vocab == 64 and meta.tokens_seen == 1000 // 128 * 128
    )  # whole steps of 2 x 64, within the budget
    assert "untrained exp. acc." in (out / "README.md").read_text()  # the card compares with the start
    target, tokenizer = load_model(str(model))
    _, draft = build_drafter(str(out), target, tokenizer)
    assert len(draft.vocab_ids) == 64
    # the vocabulary's file counts each id in the corpus, for the self draft's cut (and a draft trained before it
    # did gets them from tools/vocab_counts.py, the same counts)
    vocabulary = load_file(str(out / VOCABULARY))
    ids = vocabulary["vocab_ids"].long()
    counts = torch.bincount(Shards.load(root / "train").tokens.flatten(), minlength=int(ids.max()) + 1)
    assert torch.equal(vocabulary["vocab_counts"], counts[ids])
    write_vocabulary(out, vocabulary["vocab_ids"])
    assert "vocab_counts" not in load_file(str(out / VOCABULARY))
    assert vocab_counts.main(["--data", str(root / "train"), "--draft", str(out)]) == 0
    assert torch.equal(load_file(str(out / VOCABULARY))["vocab_counts"], vocabulary["vocab_counts"])
    with pytest.raises(SystemExit):  # a folder without a cut head: a clear error, not a traceback
        vocab_counts.main(["--data", str(root / "train"), "--draft", str(root)])


def test_bad_input_is_a_clear_error(workspace, tmp_path, capsys):
    root, model, splits = workspace
    assert (
        main(
            [
                "corpus",
                "--splits",
                str(splits),
                "--languages",
                "cobol",
                "--tokenizer",
                str(model),
                "--out",
                str(tmp_path / "c"),
            ]
        )
        == 2
    )
    assert "unknown language(s) ['cobol']" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "python.train.txt").write_text("")
    assert (
        main(["corpus", "--splits", str(tmp_path / "empty"), "--tokenizer", str(model), "--out", str(tmp_path / "e")])
        == 2
    )
    assert "the corpus is empty" in capsys.readouterr().err
    # a corpus tokenized for another vocabulary
    manifest = json.loads((root / "train" / "manifest.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    for name in manifest["shards"]:
        (other / name).write_bytes((root / "train" / name).read_bytes())
    (other / "manifest.json").write_text(json.dumps(manifest | {"vocab_size": 262144}))
    assert main(["finetune", "--data", str(other), "--out", str(tmp_path / "d"), "--target", str(model)]) == 2
    assert "262144-token vocabulary" in capsys.readouterr().err


def test_finetune_goes_on_from_a_trained_draft(workspace, tmp_path):
    """--init draft:FOLDER starts from that draft's weights, layers and head: at lr 0 it comes back unchanged."""
    root, model, _ = workspace
    start, again = tmp_path / "start", tmp_path / "again"
    argv = ["finetune", "--data", str(root / "train"), "--target", str(model), "--tokens", "256", "--batch-size", "2"]
    assert main([*argv, "--out", str(start), "--layers", "0", "--draft-vocab", "64"]) == 0
    assert main([*argv, "--out", str(again), "--init", f"draft:{start}", "--lr", "0"]) == 0
    meta = DraftMeta.read(again)
    assert meta.layers == [0] and meta.draft_vocab == 64 and meta.init == f"draft:{start}"
    started, trained = load_file(str(start / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert started.keys() == trained.keys()
    for name, tensor in started.items():
        assert torch.equal(trained[name], tensor), name
