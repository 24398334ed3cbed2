"""`specdec sweep` on a tiny random model: the expected grid of events, and the report over them."""

import json

import torch
from helpers.events import read_events
from helpers.tiny_models import tiny_llama

from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, SelfDrafter, derive_draft
from speccomplete.harness.lib.cases import Case
from speccomplete.harness.lib.grid import grid_settings, run_sweep
from speccomplete.telemetry.analysis.report import build_report
from speccomplete.telemetry.log import EventLog

TEXT = "def f(x):\n    return x + 1\n\nfn main() {\n    let y = 2;\n}\n"
CASES = [Case("py-0", "a.py", TEXT, 1, 4), Case("rs-0", "b.rs", TEXT, 4, 4)]


def test_sweep_writes_the_grid_and_reports_it(tokenizer, tmp_path):
    target = tiny_llama(seed=3)
    drafter = ModelDrafter(derive_draft(target, [0]))
    path = tmp_path / "sweep.jsonl"
    with EventLog(path) as log:
        runs = run_sweep(
            CASES,
            target,
            tokenizer,
            drafter,
            log,
            gammas=[1, 4],
            temperatures=[0.0, 1.0],
            max_new_tokens=6,
            max_prompt_tokens=64,
            target_name="tiny",
            draft_name="layers:0",
            device="cpu",
            seed=1,
        )
    assert runs == 2 * 2 * 3 and len(grid_settings([1, 4], [0.0, 1.0])) == 6
    df = read_events([path])
    grid = set(zip(df.case_id, df.gamma, df.temperature, df.draft))
    assert grid == {
        (case.id, gamma, t, "none" if gamma == "0" else "layers:0")
        for case in CASES
        for gamma in ("0", "1", "4")
        for t in (0.0, 1.0)
    }
    assert set(df.source) == {"sweep"} and set(df.language) == {"python", "rust"}
    spec = df[df.gamma != "0"]
    assert (spec.drafted > 0).all() and (df[df.gamma == "0"].drafted == 0).all()
    assert (df.generated_tokens == 6).all() and (df.latency_ms >= df.total_ms).all()

    data = build_report([str(path)], tmp_path / "out", reps=20)
    rq3 = {(r["temperature"], r["gamma"]) for r in data["rq3"]}
    assert rq3 == {(0.0, 1), (0.0, 4), (1.0, 1), (1.0, 4)}
    assert all(r["speedup"] > 0 for r in data["rq3"])


def test_a_self_draft_drafts_at_every_gamma_of_the_grid(tokenizer, tmp_path):
    """A SelfDrafter drafts on the steps it was attached to: every γ's decoder must run on those."""
    target = tiny_llama(seed=3)
    vocabulary = torch.arange(target.get_output_embeddings().out_features)
    path = tmp_path / "sweep.jsonl"
    with EventLog(path) as log:
        run_sweep(
            CASES,
            target,
            tokenizer,
            HybridDrafter(SelfDrafter(target, vocabulary)),
            log,
            gammas=[1, 2, 4],
            temperatures=[0.0],
            max_new_tokens=6,
            max_prompt_tokens=64,
            target_name="tiny",
            draft_name="ngram+self",
            device="cpu",
        )
    events = [json.loads(line) for line in path.read_text().splitlines()]
    for gamma in ("1", "2", "4"):
        ran = [e for e in events if e["settings"]["gamma"] == gamma]
        assert sum(e["drafted"] - e["lookup_drafted"] for e in ran) > 0, gamma
