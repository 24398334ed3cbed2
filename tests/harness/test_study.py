"""`specdec study` on tiny random models: study.json's schema, a rerun that decodes nothing again, an
interrupted run that, resumed, ends with the numbers of an uninterrupted one, and the summary remade from the
events alone."""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest
from helpers.lsp import save_random_model
from helpers.tiny_models import TEST_DEVICE, tiny_llama

from speccomplete.cli import main
from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import parse_gamma_policy
from speccomplete.harness import study
from speccomplete.harness.lib.cases import Case, write_cases
from speccomplete.telemetry.analysis.read import UnreadableLineWarning

PY = "def add(x, y):\n    return x + y\n\n\ndef twice(x):\n    return add(x, add(x, x))\n"
RS = "fn add(x: i32, y: i32) -> i32 {\n    x + y\n}\n\nfn twice(x: i32) -> i32 {\n    add(x, add(x, x))\n}\n"
CASES = [Case(f"py-{i}", "a.py", PY, line, col) for i, (line, col) in enumerate([(1, 4), (5, 4), (5, 15)])]
CASES += [Case(f"rs-{i}", "b.rs", RS, line, col) for i, (line, col) in enumerate([(1, 4), (5, 4), (5, 10)])]
SETTINGS = dict(gammas=[1, 3], temperatures=[0.0, 1.0], rq3_per_language=1, max_new_tokens=8, max_line_tokens=6)
# what does not depend on the clock: the counts and acceptance
STEADY = ("alpha", "alpha_all", "mean_accepted")


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=3)


def decoders(target, tokenizer):
    """A fresh AR decoder and two drafts, as a new process would build them."""
    layer0 = derive_draft(target, [0])
    drafts = [
        study.StudyDraft("layers:0", SpeculativeDecoder(target, tokenizer, ModelDrafter(layer0), policy())),
        study.StudyDraft(
            "ngram+layers:0", SpeculativeDecoder(target, tokenizer, HybridDrafter(ModelDrafter(layer0)), policy())
        ),
    ]
    return SpeculativeDecoder(target, tokenizer), drafts, ("layers:0", ModelDrafter(layer0))


def policy():
    return parse_gamma_policy("heuristic")


def run(target, tokenizer, out, **more):
    ar, drafts, rq3 = decoders(target, tokenizer)
    settings = SETTINGS | more
    return study.run_study(
        CASES, ar, drafts, out, gamma="heuristic", target_name="tiny", device="test", rq3_draft=rq3, **settings
    )


def count_decodes(monkeypatch) -> list[int]:
    calls = [0]
    generate = SpeculativeDecoder.generate

    def counted(self, *args, **kwargs):
        calls[0] += 1
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", counted)
    return calls


def lines(path) -> int:
    return len(path.read_text().splitlines())


def steady(data: dict) -> dict:
    """study.json's numbers that a rerun must reproduce exactly (timings differ from run to run)."""
    out = {}
    for draft, entry in data["drafts"].items():
        for scope in ("languages", "groups"):
            for name, row in entry[scope].items():
                out[(draft, scope, name)] = (row["n"], *(tuple(row[m].values()) for m in STEADY))
        for group, row in entry["disparity"].items():
            out[(draft, "U", group)] = (row["U"], row["U_lo"], row["U_hi"])
    for row in data["rq3"]:
        out[("rq3", row["group"], row["gamma"], row["temperature"])] = (row["n"], *row["alpha"].values())
    return out


def test_study_writes_the_schema_and_a_rerun_decodes_nothing(target, tokenizer, tmp_path, monkeypatch):
    runs = run(target, tokenizer, tmp_path)
    grid = 2 * 3  # (AR, γ 1, γ 3) × 2 temperatures, on the first case of each language
    assert runs == 2 * 3 * len(CASES) + grid * 2
    events = tmp_path / "events"
    assert (lines(events / "block.jsonl"), lines(events / "line.jsonl"), lines(events / "rq3.jsonl")) == (18, 18, 12)
    line_events = [json.loads(x) for x in (events / "line.jsonl").read_text().splitlines()]
    block_events = [json.loads(x) for x in (events / "block.jsonl").read_text().splitlines()]
    # every run starts from the fresh heuristic policy (γ 4 first), whatever ran before it, warm-up included
    assert all(e["gammas"][0] == 4 for e in block_events if e["draft"] == "layers:0")
    assert all(e["generated_tokens"] <= 6 and "\n" not in (e["text"] or "") for e in line_events)
    rq3_events = [json.loads(x) for x in (events / "rq3.jsonl").read_text().splitlines()]
    # the study's own source; the rounds the lookup's copies lost are a field of their own
    for event in block_events + line_events + rq3_events:
        assert event["source"] == "study" and "lookup_rejected_rounds" in event
        assert "lookup_rejected_rounds" not in event["settings"]

    data = study.summarize(tmp_path, reps=200, seed=1, meta={"target": "tiny"}, paired_base="layers:0")
    assert data == json.loads((tmp_path / "study.json").read_text())
    assert set(data["drafts"]) == {"layers:0", "ngram+layers:0"}
    assert data["language_groups"] == {"python": "high", "rust": "medium"} and data["cases"] == len(CASES)
    for entry in data["drafts"].values():
        assert set(entry["languages"]) == {"python", "rust"}
        for language, row in entry["languages"].items():
            assert row["n"] == 3 and row["line_n"] == 3 and row["group"] == data["language_groups"][language]
            for metric in ("alpha", "mean_accepted", "speedup", "decode_speedup", "line_latency_ms"):
                estimate = row[metric]
                assert estimate["value"] is not None and estimate["lo"] <= estimate["value"] <= estimate["hi"], metric
            assert 0 <= row["alpha"]["value"] <= 1 and row["line_latency_p50_ms"] > 0
        assert entry["groups"]["all code"]["n"] == 6
        u = entry["disparity"]["all code"]
        assert u["languages"] == 2 and 0 <= u["U_lo"] <= u["U"] <= u["U_hi"] <= 0.5 and 0 <= u["U_p"] <= 1
        # U over the two languages is half their α̂ gap
        alphas = [entry["languages"][lang]["alpha"]["value"] for lang in ("python", "rust")]
        assert u["U"] == pytest.approx(abs(alphas[0] - alphas[1]) / 2)
    # paired: ngram+layers:0's speedup over layers:0's on the same cases is the ratio of their speedups over AR
    assert data["paired"]["base"] == "layers:0" and set(data["paired"]["drafts"]) == {"ngram+layers:0"}
    for group, row in data["paired"]["drafts"]["ngram+layers:0"].items():
        speedups = [data["drafts"][d]["groups"][group]["speedup"]["value"] for d in ("ngram+layers:0", "layers:0")]
        assert row["speedup"]["value"] == pytest.approx(speedups[0] / speedups[1])
        assert row["speedup"]["lo"] <= row["speedup"]["value"] <= row["speedup"]["hi"]
    assert "against `layers:0`, paired" in (tmp_path / "study.md").read_text()
    # the model-drafted α̂ leaves the lookup's copies out: with the model alone, the two agree
    model_only = data["drafts"]["layers:0"]["languages"]["python"]
    assert model_only["alpha"]["value"] == model_only["alpha_all"]["value"]
    assert set(data["ar"]["languages"]) == {"python", "rust"} and "alpha" not in data["ar"]["languages"]["python"]
    assert {(r["group"], r["gamma"], r["temperature"]) for r in data["rq3"]} == {
        (g, gamma, t) for g in ("high", "medium", "all code") for gamma in (1, 3) for t in (0.0, 1.0)
    }
    assert set(data["plots"]) == {"study_by_language.png", "rq3_heatmap.png"}
    assert all((tmp_path / p).stat().st_size > 0 for p in data["plots"])
    assert "| python | high | 3 |" in (tmp_path / "study.md").read_text()

    calls = count_decodes(monkeypatch)
    assert run(target, tokenizer, tmp_path) == 0 and calls[0] == 0  # nothing left: no decode, not even a warm-up
    with pytest.raises(ValueError, match="max_new_tokens: 8 then, 9 now"):  # its runs would pool with the 8-token ones
        run(target, tokenizer, tmp_path, max_new_tokens=9)
    assert run(target, tokenizer, tmp_path, rq3_per_language=0, gammas=[]) == 0  # a run without the grid goes on
    assert lines(events / "block.jsonl") == 18 and lines(events / "rq3.jsonl") == 12


def test_an_interrupted_study_resumed_counts_what_an_uninterrupted_one_does(target, tokenizer, tmp_path):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    total = run(target, tokenizer, whole)
    assert run(target, tokenizer, parts, max_runs=7) == 7
    assert lines(parts / "events" / "block.jsonl") + lines(parts / "events" / "line.jsonl") == 7
    # the 29 block and line runs left, then the RQ3 grid of a case, which runs whole (6 runs)
    assert run(target, tokenizer, parts, max_runs=30) == 29 + 6 and run(target, tokenizer, parts) == total - 42
    expected = steady(study.summarize(whole, reps=200, seed=1))
    assert steady(study.summarize(parts, reps=200, seed=1)) == expected
    # a crash's torn last line is skipped, and a run written twice (an RQ3 grid run again) counts once
    rq3 = parts / "events" / "rq3.jsonl"
    rq3.write_text(rq3.read_text() + rq3.read_text().splitlines()[-1] + "\n")
    block = parts / "events" / "block.jsonl"
    block.write_text(block.read_text() + '{"schema": 1, "language": "pyth')
    with pytest.warns(UnreadableLineWarning):
        assert steady(study.summarize(parts, reps=200, seed=1)) == expected
    (events := block.read_text().splitlines()).pop(3)  # a run lost in the crash: decoded again, after the torn line
    block.write_text("\n".join(events))
    assert run(target, tokenizer, parts) == 1 and block.read_text().splitlines()[-2].endswith('"pyth')
    with pytest.warns(UnreadableLineWarning):
        assert steady(study.summarize(parts, reps=200, seed=1)) == expected


def test_the_command_runs_the_study_and_its_report(tmp_path):
    model = save_random_model(tmp_path / "model")
    write_cases(CASES[:1] + CASES[3:4], tmp_path / "cases.jsonl")
    argv = ["study", "--cases", str(tmp_path / "cases.jsonl"), "--out", str(tmp_path / "out"), "--target", str(model)]
    argv += ["--drafts", "ngram,layers:0", "--max-new-tokens", "4", "--gammas", "1", "--temperatures", "0"]
    argv += ["--rq3-per-language", "1", "--bootstrap", "50", "--device", str(TEST_DEVICE)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "out" / "study.json").read_text())
    assert set(data["drafts"]) == {"ngram", "layers:0"} and data["command"].startswith("specdec study --cases")
    ngram = data["drafts"]["ngram"]["languages"]["python"]
    assert ngram["alpha"] == ngram["alpha_all"]  # the lookup alone is the draft: none of its drafts is set apart
    assert (tmp_path / "out" / "report" / "report.md").exists()
    assert main([*argv, "--drafts", "layers:9"]) == 2  # a draft named on the command line must exist
    # the summary remade from the events alone, loading no model (the target named does not exist): the same
    (tmp_path / "out" / "report" / "report.md").unlink()
    remake = ["study", "--out", str(tmp_path / "out"), "--from-events", "--bootstrap", "50"]
    assert main([*remake, "--target", str(tmp_path / "no-model")]) == 0
    assert json.loads((tmp_path / "out" / "study.json").read_text()) == data | {"made": ANY}
    assert (tmp_path / "out" / "report" / "report.md").exists()
    assert main(remake[:3]) == 2  # without --from-events a study needs its cases
