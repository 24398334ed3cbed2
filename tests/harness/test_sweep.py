"""`specdec sweep` and `specdec bench --events` on tiny random models: the expected grid of events."""

import json

from conftest import tiny_llama
from speccomplete.decoder.drafts import ModelDrafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.harness.bench import Contenders, bench_events, run_bench
from speccomplete.harness.cases import Case
from speccomplete.harness.sweep import grid_settings, run_sweep
from speccomplete.telemetry.log import EventLog
from speccomplete.telemetry.read import read_events
from speccomplete.telemetry.report import build_report

TEXT = "def f(x):\n    return x + 1\n\nfn main() {\n    let y = 2;\n}\n"
CASES = [Case("py-0", "a.py", TEXT, 1, 4), Case("rs-0", "b.rs", TEXT, 4, 4)]


def test_sweep_writes_the_grid_and_reports_it(tokenizer, tmp_path):
    target = tiny_llama(seed=3)
    drafter = ModelDrafter(derive_draft(target, [0]))
    path = tmp_path / "sweep.jsonl"
    with EventLog(path) as log:
        runs = run_sweep(CASES, target, tokenizer, drafter, log, gammas=[1, 4], temperatures=[0.0, 1.0],
                         max_new_tokens=6, max_prompt_tokens=64, target_name="tiny", draft_name="layers:0",
                         device="cpu", seed=1)
    assert runs == 2 * 2 * 3 and len(grid_settings([1, 4], [0.0, 1.0])) == 6
    df = read_events([path])
    grid = set(zip(df.case_id, df.gamma, df.temperature, df.draft))
    assert grid == {(case.id, gamma, t, "none" if gamma == "0" else "layers:0")
                    for case in CASES for gamma in ("0", "1", "4") for t in (0.0, 1.0)}
    assert set(df.source) == {"sweep"} and set(df.language) == {"python", "rust"}
    spec = df[df.gamma != "0"]
    assert (spec.drafted > 0).all() and (df[df.gamma == "0"].drafted == 0).all()
    assert (df.generated_tokens == 6).all() and (df.latency_ms >= df.total_ms).all()

    data = build_report([str(path)], tmp_path / "out", reps=20)
    rq3 = {(r["temperature"], r["gamma"]) for r in data["rq3"]}
    assert rq3 == {(0.0, 1), (0.0, 4), (1.0, 1), (1.0, 4)}
    assert all(r["speedup"] > 0 for r in data["rq3"])


def test_bench_writes_one_event_per_case_per_method(tokenizer, tmp_path):
    target = tiny_llama(seed=3)
    draft = derive_draft(target, [0])
    spec = SpeculativeDecoder(target, tokenizer, ModelDrafter(draft), FixedGamma(2))
    ours = {"ar": SpeculativeDecoder(target, tokenizer), "spec": spec}
    results = run_bench(CASES, Contenders(ours), max_new_tokens=5, max_prompt_tokens=64)
    events = bench_events(results, target="tiny", draft="layers:0", device="cpu", gamma="2", max_new_tokens=5)
    assert [(e.case_id, e.draft, e.settings["gamma"]) for e in events] == [
        ("py-0", "none", "0"), ("py-0", "layers:0", "2"), ("rs-0", "none", "0"), ("rs-0", "layers:0", "2")]
    assert all(e.source == "bench" and e.text is None for e in events)
    for event, run in zip(events, [r.runs[m] for r in results for m in ("ar", "spec")]):
        assert event.generated_tokens == len(run.tokens) and event.accepted == run.stats.accepted
        json.dumps(event.to_dict())
