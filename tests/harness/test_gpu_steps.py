"""The CPU rehearsal of the GPU programme (docs/gpu.md): gpu/step.sh's steps with --smoke.

Each step runs the command it runs on the device machine, on the CPU with tiny budgets: a tiny
random target in place of the converted Gemma, a tiny corpus in place of the corpus pack, two
cases. What it leaves under $OUT must exist and parse, as the runbook's readers expect it: each
command's own summary JSON, the machine's facts inside it, and a trained draft in parts that join.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers.corpus import write_python_splits
from helpers.lsp import save_random_model

from speccomplete.cli import main
from tools.gpu.returns import PART_BYTES, join_parts, sha256_file

REPO = Path(__file__).resolve().parents[2]
STEP = REPO / "gpu" / "step.sh"
WEIGHTS = "model.safetensors"


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


def returned_files(out: Path) -> list[Path]:
    """What the device tool would bring back: at most 8 files, each under 16 MiB."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(p.stat().st_size <= PART_BYTES for p in files), files
    return files


def join_returned_draft(out: Path, summary: dict) -> Path:
    """The draft folder that came back, its weights joined from the parts and checked against the summary."""
    folder = out / "draft"
    assert sorted(p.name for p in folder.glob(f"{WEIGHTS}.part-*")) == [f"{WEIGHTS}.part-00"]  # 15 MiB a part
    joined = join_parts(folder, WEIGHTS)
    assert sha256_file(joined) == summary["model_sha256"]
    return folder


def test_bench_smoke_writes_its_tables(gpu_root, tmp_path):
    run_step(gpu_root, tmp_path, "bench", "--smoke")
    data = json.loads((tmp_path / "bench.json").read_text())
    assert {"ar", "spec", "spec_draft_ngram", "hf_greedy"} <= set(data["methods"]) and any(
        m.startswith("hf_assisted") for m in data["methods"]
    )
    assert data["bandwidth_bound"]["bound_tokens_per_s"] > 0
    assert "bandwidth bound" in (tmp_path / "bench.txt").read_text()
    # the machine's facts inside the bench's own JSON, no file of their own
    assert data["device"] == "cpu" and data["device_facts"]["date_utc"] and data["device_facts"]["torch"]
    assert {p.name for p in returned_files(tmp_path)} == {"bench.json", "bench.txt", "bench.log"}


def test_train_smoke_stops_on_time_resumes_and_returns_the_eagle3_draft(gpu_root, tmp_path):
    from safetensors.torch import load_file

    from speccomplete.decoder.drafts.eagle3.model import load_eagle3, read_config
    from speccomplete.decoder.models import load_model

    first = tmp_path / "first"
    run_step(gpu_root, first, "train", "--smoke")  # --max-minutes 0.0005: a step or a few, then a checkpoint
    stopped = json.loads((first / "train.json").read_text())
    assert stopped["complete"] is False and stopped["steps"] >= 1 and stopped["tokens_per_s"] > 0
    assert stopped["device"]["date_utc"] and "resumes" in (first / "train.log").read_text()
    assert not (gpu_root / "train" / "draft" / "features").exists()  # online: the target runs beside the draft

    second = tmp_path / "second"
    run_step(gpu_root, second, "train", "--smoke", TRAIN_MINUTES="5")  # the same command, time to finish
    finished = json.loads((second / "train.json").read_text())
    assert finished["complete"] is True and finished["steps"] > stopped["steps"]  # on from the checkpoint
    assert finished["tokens"] == 4000 // 128 * 128  # whole steps of 2 x 64 within --train-tokens 4k, both calls
    assert finished["dev_before"] is not None and finished["dev_after"] is not None  # the corpus pack's dev/
    assert finished["model_sha256"] and finished["device"]["date_utc"]
    returned_files(second)  # the log, the summary, config.json, README.md and the parts

    # the parts join into the file the machine wrote, and the folder loads as an EAGLE-3 draft for the target
    folder = join_returned_draft(second, finished)
    config = read_config(folder)
    # the head is the target's rows: left out of what travels back, rebuilt from the target on load
    assert config["speculators_model_type"] == "eagle3" and config["head_from_target"] is True
    assert config["specdec"]["tokens_seen"] == finished["tokens"]
    assert "lm_head.weight" not in load_file(folder / WEIGHTS)
    target, _ = load_model(str(gpu_root / "models" / "tiny"), device="cpu")  # the fixture's SPECDEC_TARGET
    assert load_eagle3(folder, target).shape.draft_vocab == 64
    assert (folder / "README.md").exists()


def test_the_ratchet_takes_a_draft_that_continued_from_the_shipped_one(gpu_root, tmp_path):
    """The whole path of a lending's draft, on the tiny target: a draft trained here stands for the shipped
    one; a train call continues from it, as on a lent GPU; the ratchet joins what came back, checks it and,
    where its dev acceptance rose, writes the commit-ready folder that loads as the target's draft."""
    import shutil

    from speccomplete.decoder.drafts.eagle3.model import load_eagle3
    from speccomplete.decoder.models import load_model
    from tools import ratchet

    root = tmp_path / "gpu"  # the module's root, without its earlier training runs
    shutil.copytree(gpu_root, root, ignore=lambda d, _: {"train", "train-derived"} if Path(d) == gpu_root else set())
    first = tmp_path / "first"
    run_step(root, first, "train", "--smoke", TRAIN_MINUTES="5")
    shipped = tmp_path / "weights" / "tiny-eagle3"
    shutil.copytree(join_returned_draft(first, json.loads((first / "train.json").read_text())), shipped)
    (shipped / "NOTICE").write_text("licence notice\n")
    shutil.rmtree(root / "train")
    lent = tmp_path / "lent"
    run_step(root, lent, "train", "--smoke", TRAIN_MINUTES="5", TRAIN_TOKENS="8k", TRAIN_INIT=f"draft:{shipped}")
    summary = json.loads((lent / "train.json").read_text())
    before, after = (summary[f"dev_{w}"]["all"]["expected_acceptance"] for w in ("before", "after"))
    out = tmp_path / "ratchet"
    assert (
        ratchet.main([str(lent), "--shipped", str(shipped), "--out", str(out), "--plan", str(tmp_path / "none")]) == 0
    ) == (after > before)
    # The tiny random target's acceptance barely moves, so the taken path runs on the same returned files with
    # a rise written into their summary: what is joined, checked, carded and loaded is what the trainer wrote.
    summary["dev_after"]["all"]["expected_acceptance"] = before + 0.1
    (lent / "train.json").write_text(json.dumps(summary))
    assert (
        ratchet.main([str(lent), "--shipped", str(shipped), "--out", str(out), "--plan", str(tmp_path / "none")]) == 0
    )
    lineage = json.loads((out / "lineage.json").read_text())
    assert lineage["tokens"] == summary["tokens"] + json.loads((first / "train.json").read_text())["tokens"]
    assert (out / "NOTICE").exists() and "## Lineage" in (out / "README.md").read_text()
    target, _ = load_model(str(root / "models" / "tiny"), device="cpu")
    assert load_eagle3(out, target).shape.draft_vocab == 64


def test_bench_trained_smoke_compares_the_eagle3_draft(gpu_root, tmp_path):
    eagle_dir = gpu_root / "train" / "draft"
    if not (eagle_dir / "config.json").exists():
        run_step(gpu_root, tmp_path / "train", "train", "--smoke")
    run_step(gpu_root, tmp_path, "bench-trained", "--smoke")
    data = json.loads((tmp_path / "bench-trained.json").read_text())
    # behind the lookup, against the product default, the draft alone and the lookup alone
    assert {"spec_draft_ngram+self", f"spec_draft_{eagle_dir}", "spec_draft_ngram"} <= set(data["methods"])
    assert data["draft"] == f"ngram+{eagle_dir}" and "hf_greedy" not in data["methods"]  # --no-hf
    assert data["device_facts"]["date_utc"]


def test_bench_trained_says_when_no_draft_was_trained(tmp_path):
    root = tmp_path / "gpu"
    root.mkdir()
    (root / "env.sh").write_text("export SPECDEC_TARGET=unused\n")
    env = os.environ | {"GPU_ROOT": str(root), "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(STEP), "bench-trained"], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 2 and "run the step that trains it first" in done.stderr


def test_train_derived_smoke_resumes_returns_the_draft_and_bench_derived_compares_it(gpu_root, tmp_path):
    from speccomplete.decoder.drafts.trained import DraftMeta

    derived_dir = gpu_root / "train-derived" / "draft"
    first = tmp_path / "first"
    run_step(gpu_root, first, "train-derived", "--smoke")  # --max-minutes 0.0005: a step or a few
    stopped = json.loads((first / "train-derived.json").read_text())
    assert stopped["complete"] is False and stopped["steps"] >= 1 and stopped["tokens_per_s"] > 0
    assert stopped["device"]["date_utc"] and "resumes" in (first / "train-derived.log").read_text()

    second = tmp_path / "second"
    run_step(gpu_root, second, "train-derived", "--smoke", TRAIN_MINUTES="5")  # the same command, time to finish
    finished = json.loads((second / "train-derived.json").read_text())
    assert finished["complete"] is True and finished["steps"] > stopped["steps"]  # on from the checkpoint
    assert finished["tokens"] == 16000 // 128 * 128  # whole steps of 2 x 64 within --tokens 16k, both calls
    returned_files(second)
    folder = join_returned_draft(second, finished)
    assert DraftMeta.read(folder).tokens_seen == finished["tokens"]

    run_step(gpu_root, tmp_path / "bench", "bench-derived", "--smoke")
    data = json.loads((tmp_path / "bench" / "bench-derived.json").read_text())
    assert {"spec_draft_ngram+self", "spec_draft_ngram+auto"} <= set(data["methods"])
    assert data["draft"] == f"ngram+{derived_dir}" and "hf_greedy" not in data["methods"]


def test_eval_and_tests_smoke(gpu_root, tmp_path):
    run_step(gpu_root, tmp_path / "eval", "eval", "--smoke")
    latency = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert latency["events"] == 2 and latency["single_line"]["p50_ms"] > 0 and latency["multi_line"]["p50_ms"] > 0
    assert latency["single_line"]["n"] == latency["multi_line"]["n"] == 1
    assert latency["decoder_device"].startswith("cpu") and latency["device"]["date_utc"]  # "cpu int8": its label
    run_step(gpu_root, tmp_path / "tests", "tests", "--smoke")
    summary = json.loads((tmp_path / "tests" / "tests.json").read_text())
    assert summary["exit"] == 0 and summary["tests"] >= 2 and summary["passed"] == summary["tests"]
    assert not summary["failed"] and not summary["interrupted"] and summary["device"]["date_utc"]
    assert ET.parse(tmp_path / "tests" / "tests.xml").getroot().find("testsuite") is not None


def test_cuda_smoke_runs_tests_bench_and_eval_and_a_capped_part_leaves_the_earlier_parts(gpu_root, tmp_path):
    """The runbook's call after training: three parts, each under its own cap. Here the eval's cap (1 s)
    stops it; the tests' and the bench's JSON are there, and cuda.json says which part was capped."""
    env = os.environ | {"GPU_ROOT": str(gpu_root), "OUT": str(tmp_path), "PYTHON": sys.executable}
    env |= {"CUDA_CAPS": "120 120 1"}
    done = subprocess.run(
        ["bash", str(STEP), "cuda", "--smoke"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 124, done.stdout[-3000:] + done.stderr[-3000:]  # the capped part's status
    parts = json.loads((tmp_path / "cuda.json").read_text())["parts"]
    assert list(parts) == ["tests", "bench", "eval"]  # in this order
    assert parts["tests"]["exit"] == parts["bench"]["exit"] == 0 and not parts["bench"]["capped"]
    assert parts["eval"] == {"exit": 124, "seconds": parts["eval"]["seconds"], "cap_s": 1, "capped": True}

    tests = json.loads((tmp_path / "tests.json").read_text())
    assert tests["exit"] == 0 and tests["passed"] == tests["tests"] >= 2
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["complete"] is True and bench["cases"] == 2 and bench["steady_state"] is True
    assert {"ar", "spec", "spec_draft_ngram", "hf_greedy", "hf_assisted_default"} <= set(bench["methods"])
    assert "hf_assisted_lookup" not in bench["methods"]  # the call's HF rows: greedy and assisted's default
    assert all(case["ar_prefill_ms"] > 0 and case["ar_decode_ms"] > 0 for case in bench["per_case"])
    assert not (tmp_path / "eval.json").exists()

    # one log for the call, each part's start and end in it
    log = (tmp_path / "cuda.log").read_text()
    assert log.index("== cuda step: tests") < log.index("== cuda step: bench") < log.index("== cuda step: eval")
    assert "eval exit 124" in log
    files = returned_files(tmp_path)
    assert {p.name for p in files} == {"cuda.json", "cuda.log", "tests.json", "tests.xml", "bench.json", "bench.txt"}
    assert len(files) + 2 <= 8  # with the eval's eval.json and eval-events.jsonl, when it is not capped


def test_the_tests_summary_is_written_when_sigint_stops_pytest(tmp_path):
    """gpu/step.sh tests stops pytest with SIGINT at its cap: the summary must still say what ran."""
    started = tmp_path / "started"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: node ids relative to tmp_path
    (tmp_path / "test_capped.py").write_text(
        "import time\n"
        "from pathlib import Path\n\n"
        "def test_passes():\n    pass\n\n"
        "def test_fails():\n    assert False\n\n"
        "def test_runs_into_the_cap():\n"
        f"    Path({str(started)!r}).touch()\n"
        "    time.sleep(120)\n"
    )
    summary = tmp_path / "tests.json"
    # tests/conftest.py as a plugin: the test file lies outside tests/
    command = [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q"]
    command += [f"--summary-json={summary}", f"--junitxml={tmp_path / 'tests.xml'}", "test_capped.py"]
    env = os.environ | {"PYTHONPATH": str(REPO / "tests")}
    # SIGINT as a terminal delivers it, even where this run inherited it ignored (a job started in the background)
    pytest_run = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and pytest_run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert started.exists(), pytest_run.communicate(timeout=30)[0].decode()[-3000:]
        pytest_run.send_signal(signal.SIGINT)
        output = pytest_run.communicate(timeout=60)[0].decode()
    finally:
        if pytest_run.poll() is None:
            pytest_run.kill()
    rows = json.loads(summary.read_text())
    assert rows["interrupted"] is True and rows["exit"] == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert rows["tests"] == 2 and rows["passed"] == 1 and rows["failures"] == 1 and rows["errors"] == 0
    assert rows["failed"] == ["test_capped.py::test_fails"] and rows["device"]["date_utc"]
    assert ET.parse(tmp_path / "tests.xml").getroot().find("testsuite") is not None  # the junit file too
