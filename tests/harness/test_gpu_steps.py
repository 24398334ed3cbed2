"""The CPU rehearsal of the GPU programme (docs/gpu.md): gpu/step.sh's steps with --smoke.

Each step runs the command it runs on the device machine, on the CPU with tiny budgets: a tiny
random target in place of the converted Gemma, a tiny corpus in place of the corpus pack, two
cases. What it leaves under $OUT must exist and parse, as the runbook's readers expect it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import write_python_splits

from speccomplete.cli import main
from speccomplete.decoder.drafts.trained import DraftMeta
from tests.lsp_support import save_random_model

REPO = Path(__file__).resolve().parents[2]
STEP = REPO / "gpu" / "step.sh"


@pytest.fixture(scope="module")
def gpu_root(tmp_path_factory):
    """What gpu/unpack.sh leaves on the machine, in small: env.sh, the target folder, the corpus."""
    root = tmp_path_factory.mktemp("gpu")
    model = save_random_model(root / "models" / "tiny")
    splits = write_python_splits(root, 3)
    for split, budget in (("train", "1k"), ("dev", "128")):
        args = ["corpus", "--splits", str(splits), "--split", split, "--budget", budget, "--seq-len", "64"]
        assert main([*args, "--tokenizer", str(model), "--out", str(root / "corpus" / split)]) == 0
    (root / "env.sh").write_text(f"export SPECDEC_TARGET={model}\n")
    return root


def run_step(gpu_root: Path, out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    env = os.environ | {"GPU_ROOT": str(gpu_root), "OUT": str(out), "PYTHON": sys.executable} | env
    done = subprocess.run(["bash", str(STEP), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_bench_smoke_writes_its_tables(gpu_root, tmp_path):
    run_step(gpu_root, tmp_path, "bench", "--smoke")
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {"ar", "spec", "spec_draft_ngram", "hf_greedy"} <= set(data["methods"]) and any(
        m.startswith("hf_assisted") for m in data["methods"]
    )
    assert data["bandwidth_bound"]["bound_tokens_per_s"] > 0
    assert "bandwidth bound" in (tmp_path / "bench.txt").read_text()
    assert json.loads((tmp_path / "bench-device.json").read_text())["date_utc"]


def test_train_smoke_stops_on_time_resumes_and_returns_the_draft(gpu_root, tmp_path):
    first = tmp_path / "first"
    run_step(gpu_root, first, "train", "--smoke")  # --max-minutes 0.0005: a step or a few, then a checkpoint
    stopped = json.loads((first / "train.json").read_text())
    assert stopped["complete"] is False and stopped["steps"] >= 1 and stopped["tokens_per_s"] > 0
    assert "resumes" in (first / "train.log").read_text()
    second = tmp_path / "second"
    run_step(gpu_root, second, "train", "--smoke", TRAIN_MINUTES="5")  # the same command, time to finish
    finished = json.loads((second / "train.json").read_text())
    assert finished["complete"] is True and finished["steps"] > stopped["steps"]  # it went on from the checkpoint
    assert finished["tokens"] == 16000 // 128 * 128  # whole steps of 2 x 64 within --tokens 16k, over both calls
    # the draft comes back in parts that join into the file the machine wrote
    parts = sorted((second / "draft").glob("model.safetensors.part-*"))
    assert [p.name for p in parts] == finished["parts"] and all(p.stat().st_size <= 15 * 2**20 for p in parts)
    joined = second / "draft" / "model.safetensors"
    joined.write_bytes(b"".join(p.read_bytes() for p in parts))
    for p in parts:
        p.unlink()
    assert DraftMeta.read(second / "draft").tokens_seen == finished["tokens"]


def test_bench_trained_smoke_compares_the_new_draft(gpu_root, tmp_path):
    if not (gpu_root / "train" / "draft" / "draft.json").exists():
        run_step(gpu_root, tmp_path / "train", "train", "--smoke")
    run_step(gpu_root, tmp_path, "bench-trained", "--smoke")
    data = json.loads((tmp_path / "bench-trained.json").read_text())
    assert {"spec_draft_ngram+self", "spec_draft_ngram+auto"} <= set(data["methods"])
    assert str(gpu_root / "train" / "draft") in data["draft"]


def test_eval_and_tests_smoke(gpu_root, tmp_path):
    run_step(gpu_root, tmp_path / "eval", "eval", "--smoke")
    latency = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert latency["events"] == 2 and latency["single_line"]["p50_ms"] > 0 and latency["multi_line"]["p50_ms"] > 0
    run_step(gpu_root, tmp_path / "tests", "tests", "--smoke")
    summary = json.loads((tmp_path / "tests" / "tests.json").read_text())
    assert summary["exit"] == 0 and summary["tests"] >= 2 and not summary["failed"]
    assert ET.parse(tmp_path / "tests" / "tests.xml").getroot().find("testsuite") is not None


def test_train_eagle3_smoke_resumes_returns_the_draft_and_bench_eagle3_compares_it(gpu_root, tmp_path):
    from safetensors.torch import load_file

    from speccomplete.decoder.drafts.eagle3 import WEIGHTS, load_eagle3, read_config
    from speccomplete.decoder.models import load_model

    eagle_dir = gpu_root / "train-eagle3" / "draft"
    first = tmp_path / "first"
    run_step(gpu_root, first, "train-eagle3", "--smoke")  # --max-minutes 0.0005: a step or a few, then a checkpoint
    stopped = json.loads((first / "train-eagle3.json").read_text())
    assert stopped["exit"] == 0 and stopped["complete"] is False and stopped["steps"] >= 1
    assert stopped["tokens_per_s"] > 0 and len(stopped["train_top1"]) == 3  # --ttt-steps 3, the default
    assert 0 < stopped["features_tokens"] <= 2048 and stopped["features_tokens"] % 64 == 0  # whole sequences of 64
    assert stopped["dev_eval_step"] == 0 and len(stopped["dev_first_top1"]) == 3  # the untrained baseline
    assert stopped["device"]["date_utc"] and not (first / "train-eagle3-device.json").exists()
    assert "the same command resumes" in (first / "train-eagle3.log").read_text()

    second = tmp_path / "second"
    run_step(gpu_root, second, "train-eagle3", "--smoke", TRAIN_MINUTES="5")  # the same command, time to finish
    finished = json.loads((second / "train-eagle3.json").read_text())
    assert finished["exit"] == 0 and finished["complete"] is True and finished["steps"] > stopped["steps"]
    assert finished["tokens"] == 4000 // 128 * 128  # whole steps of 2 x 64 within --train-tokens 4k, both calls
    # it went on from the checkpoint: one log, its steps counted on across the two calls
    log = [json.loads(line) for line in (eagle_dir / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == list(range(1, finished["steps"] + 1))
    assert finished["features_tokens"] == stopped["features_tokens"]  # the cached features, reused
    # the dev eval at the end: top-1 and acceptance per TTT step, from the folder's log
    assert finished["dev_eval_step"] == finished["steps"]
    assert len(finished["dev_top1"]) == len(finished["dev_acceptance"]) == 3
    assert all(0 <= x <= 1 for x in finished["dev_top1"] + finished["dev_acceptance"])
    assert finished["dev_expected_acceptance"] == finished["dev_acceptance"][0]
    assert set(finished["dev_last"]) == {"python", "all"}
    # at most the device tool's 8 files come back, each under 16 MiB
    returned = [p for p in second.rglob("*") if p.is_file()]
    assert len(returned) <= 8 and all(p.stat().st_size <= 15 * 2**20 for p in returned)

    # the parts join into the file the machine wrote, and the folder loads as an EAGLE-3 draft for the target
    parts = sorted((second / "draft").glob("model.safetensors.part-*"))
    assert parts and [p.name for p in parts] == finished["parts"]
    folder = second / "draft"
    joined = b"".join(p.read_bytes() for p in parts)
    assert hashlib.sha256(joined).hexdigest() == finished["model_sha256"]
    (folder / WEIGHTS).write_bytes(joined)
    for p in parts:
        p.unlink()
    config = read_config(folder)
    assert config["speculators_model_type"] == "eagle3" and config["head_from_target"] is False  # --with-head
    assert config["specdec"]["tokens_seen"] == finished["tokens"] and "lm_head.weight" in load_file(folder / WEIGHTS)
    target, _ = load_model(str(gpu_root / "models" / "tiny"), device="cpu")  # the fixture's SPECDEC_TARGET
    assert load_eagle3(folder, target).shape.draft_vocab == 64
    assert "| python |" in (folder / "README.md").read_text()

    run_step(gpu_root, tmp_path / "bench", "bench-eagle3", "--smoke")
    data = json.loads((tmp_path / "bench" / "bench-eagle3.json").read_text())
    assert {"spec_draft_ngram+self", f"spec_draft_{eagle_dir}"} <= set(data["methods"])
    assert str(eagle_dir) in data["draft"] and "hf_greedy" not in data["methods"]  # --no-hf
