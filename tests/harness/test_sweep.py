"""`specdec sweep` on a tiny random model: the expected grid of events, and the report over them."""

from conftest import tiny_llama

from speccomplete.decoder.drafts import ModelDrafter, derive_draft
from speccomplete.harness.cases import Case
from speccomplete.harness.sweep import grid_settings, run_sweep
from speccomplete.telemetry.analysis.read import read_events
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
