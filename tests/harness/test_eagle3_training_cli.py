"""`specdec train-eagle3` end to end on a tiny Llama target: features, training, a speculators folder
that loads, its model card, resuming, and --with-head."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from helpers.corpus import write_python_splits
from helpers.lsp import save_random_model
from safetensors.torch import load_file

from speccomplete.cli import main
from speccomplete.decoder.drafts.eagle3.model import WEIGHTS, load_eagle3, read_config
from speccomplete.decoder.models import load_model
from speccomplete.decoder.training.eagle3 import FeatureShards


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3")
    model = save_random_model(root / "model")  # 2 layers: the default aux layers are 0, 1 and 2 (the final state)
    splits = write_python_splits(root, 4)
    for split, budget in (("train", "1k"), ("dev", "256")):
        args = ["corpus", "--splits", str(splits), "--split", split, "--budget", budget, "--seq-len", "32"]
        assert main([*args, "--tokenizer", str(model), "--out", str(root / split)]) == 0
    return root, model


def train_args(root, model, out, *extra: str) -> list[str]:
    return [
        "train-eagle3",
        "--target",
        str(model),
        "--data",
        str(root / "train"),
        "--dev",
        str(root / "dev"),
        "--out",
        str(out),
        "--tokens",
        "320",
        "--train-tokens",
        "640",
        "--draft-vocab",
        "64",
        "--batch-size",
        "2",
        "--eval-sequences",
        "1",
        *extra,
    ]


def test_train_eagle3_writes_a_folder_that_loads(workspace, capsys):
    root, model = workspace
    out = root / "draft"
    assert main(train_args(root, model, out)) == 0
    assert "trained 640 tokens in 10 steps" in capsys.readouterr().out
    target, _ = load_model(str(model), device="cpu")
    draft = load_eagle3(out, target)
    assert draft.shape.aux_layers == (0, 1, 2) and draft.shape.draft_vocab == 64
    assert draft.shape.hidden_size == target.config.hidden_size
    # the head was left out and comes back as the target's rows for the draft's vocabulary
    assert "lm_head.weight" not in load_file(str(out / WEIGHTS))
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight[draft.target_ids()])
    config = read_config(out)
    assert config["head_from_target"] is True
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert config["speculators_config"]["verifier"]["architectures"] == ["LlamaForCausalLM"]
    extra = config["specdec"]
    assert extra["tokens_seen"] == 640 and extra["steps"] == 10 and extra["command"].startswith("specdec train-eagle3")
    assert set(extra["dev_fitness"]) == {"python", "all"} and "top1_2" in extra["dev_fitness"]["python"]
    features = FeatureShards(out / "features")
    assert len(features) == 10 and features.taps == [0, 1, 2]  # 320 tokens: 10 sequences of 32
    card = (out / "README.md").read_text()
    assert "vllm serve" in card and '"method": "eagle3"' in card and "--with-head" in card
    assert "| python |" in card and "top-1 step 2" in card

    # the same command again resumes a finished run: nothing more is trained, the features are reused
    mtime = (out / "features" / "chunk-00000.safetensors").stat().st_mtime_ns
    assert main(train_args(root, model, out)) == 0
    assert "trained 640 tokens in 10 steps" in capsys.readouterr().out
    assert (out / "features" / "chunk-00000.safetensors").stat().st_mtime_ns == mtime
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, 11))


def test_with_head_and_continuing_from_a_draft(workspace, capsys):
    root, model = workspace
    first = root / "first"
    assert main(train_args(root, model, first, "--train-tokens", "128", "--max-minutes", "1e-9")) == 0
    printed = capsys.readouterr().out
    assert "trained 64 tokens in 1 steps" in printed and "the same command resumes" in printed
    out = root / "second"
    args = train_args(root, model, out, "--init", f"draft:{first}", "--with-head", "--train-tokens", "128")
    assert main(args) == 0
    target, _ = load_model(str(model), device="cpu")
    weights = load_file(str(out / WEIGHTS))
    assert "lm_head.weight" in weights and read_config(out)["head_from_target"] is False
    start = load_eagle3(first, target)
    loaded = load_eagle3(out, target)
    assert torch.equal(loaded.lm_head.weight, start.lm_head.weight.bfloat16().float())  # written in bf16
    assert not torch.equal(loaded.fc.weight, start.fc.weight)  # trained on from the first draft
    assert read_config(out)["specdec"]["init"] == f"draft:{first}"


def test_bad_init_is_an_error(workspace, capsys):
    root, model = workspace
    assert main(train_args(root, model, root / "bad", "--init", "scratch")) == 2
    assert "draft:FOLDER" in capsys.readouterr().err


def test_online_training_writes_a_summary(workspace, tmp_path):
    """What a lent GPU runs (on the CPU here): no feature files, and a summary JSON with the weights' hash, which
    the parts gpu/step.sh returns are checked against (tools/ratchet.py)."""
    root, model = workspace
    out = tmp_path / "draft"
    summary = tmp_path / "train.json"
    extra = ("--online", "--with-head", "--log-every", "4", "--summary", str(summary))
    assert main(train_args(root, model, out, *extra)) == 0
    assert not (out / "features").exists()
    rows = json.loads(summary.read_text())
    assert rows["tokens"] == 640 and rows["steps"] == 10 and rows["complete"] is True
    assert rows["tokens_per_s"] > 0 and rows["startup_s"] > 0 and rows["device"]["torch"]
    assert rows["last_train"]["step"] == 10  # read back at steps 4, 8 and the last
    assert rows["dev_before_step"] == 0 and rows["dev_after_step"] == 10
    assert set(rows["dev_before"]) == set(rows["dev_after"]) == {"python", "all"}
    assert rows["model_sha256"] == hashlib.sha256((out / WEIGHTS).read_bytes()).hexdigest()
    assert rows["command"].startswith("specdec train-eagle3 ")
    target, _ = load_model(str(model), device="cpu")
    assert load_eagle3(out, target).shape.aux_layers == (0, 1, 2)
