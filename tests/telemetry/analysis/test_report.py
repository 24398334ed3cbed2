"""`specdec report` numbers on synthetic events whose answers were worked out by hand."""

import json

import numpy as np
import pytest

from speccomplete.telemetry.analysis.groups import default_groups, parse_groups
from speccomplete.telemetry.analysis.report import build_report
from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import EventLog

# Per-token acceptance per language (accepted, rejected rounds), summed over the two cases of a
# language; every language has accepted + rejected = 10, so α̂ = accepted / 10.
BASE = {"python": (8, 2), "cpp": (6, 4), "lua": (5, 5), "rust": (3, 7), "zig": (2, 8), "nl": (1, 3)}
TUNED = {"python": (8, 2), "cpp": (7, 3), "lua": (6, 4), "rust": (5, 5), "zig": (5, 5), "nl": (1, 4)}
# Spec decoding time per case (ms) for 10 tokens; AR takes 1000 ms, so speedup = 1000 / ms.
SPEC_MS = {"python": 500.0, "cpp": 1000 / 1.5, "lua": 800.0, "rust": 1000.0, "zig": 1250.0, "nl": 1000.0}


def _event(language, case, draft, gamma, accepted=0, rejected=0, hist=None, ms=1000.0, temperature=0.0, **kw):
    return CompletionEvent(
        language=language,
        case_id=f"{language}-{case}",
        draft=draft,
        target="t",
        device="cpu",
        settings={"gamma": gamma, "temperature": temperature, "max_new_tokens": 10},
        generated_tokens=10,
        accepted=accepted,
        rejected_rounds=rejected,
        accepted_histogram=hist if hist is not None else [rejected, accepted],
        total_ms=ms,
        latency_ms=ms,
        source="bench",
        **kw,
    )


def _split(n):
    return [n // 2, n - n // 2]


def write_disparity_events(path):
    """Two cases per language; AR plus a base and a tuned draft at γ=1 (histogram [rejected, accepted])."""
    with EventLog(path) as log:
        for language in BASE:
            for case in range(2):
                log.write(_event(language, case, "none", "0"))
        for draft, table in (("base", BASE), ("tuned", TUNED)):
            for language, (accepted, rejected) in table.items():
                for case, (a, r) in enumerate(zip(_split(accepted), _split(rejected))):
                    log.write(_event(language, case, draft, "1", a, r, ms=SPEC_MS[language]))


@pytest.fixture(scope="module")
def disparity_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    write_disparity_events(tmp / "events.jsonl")
    data = build_report([str(tmp / "events.jsonl")], tmp / "out", reps=200)
    return data, tmp / "out"


def _rows(rows, **match):
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


def test_per_language_alpha_speedup_and_groups(disparity_report):
    data, _ = disparity_report
    base = {r["language"]: r for r in data["languages"] if r["draft"] == "base"}
    assert {lang: round(r["alpha"], 6) for lang, r in base.items()} == {
        "python": 0.8,
        "cpp": 0.6,
        "lua": 0.5,
        "rust": 0.3,
        "zig": 0.2,
        "nl": 0.25,
    }
    assert {lang: round(r["speedup"], 6) for lang, r in base.items()} == {
        "python": 2.0,
        "cpp": 1.5,
        "lua": 1.25,
        "rust": 1.0,
        "zig": 0.8,
        "nl": 1.0,
    }
    assert base["python"]["group"] == "high" and base["lua"]["group"] == "medium" and base["nl"]["group"] == "-"
    assert base["python"]["n"] == 2 and base["python"]["cases"] == 2 and base["python"]["paired_cases"] == 2
    assert base["python"]["mean_accepted"] == pytest.approx(8 / 10)  # γ=1: accepted drafts per drafting round
    assert base["python"]["tokens_per_s"] == pytest.approx(20.0)
    assert base["python"]["latency_p50_ms"] == pytest.approx(500.0)
    assert base["python"]["user_acceptance"] is None  # no outcome records
    # rust's two cases have α̂ 1/4 and 2/6: resampling them gives 0.25, 0.3 or 1/3
    assert (base["rust"]["alpha_lo"], base["rust"]["alpha_hi"]) == (pytest.approx(0.25), pytest.approx(1 / 3))
    ar = [r for r in data["languages"] if r["draft"] == "none"]
    assert ar and all(r["alpha"] is None and r["speedup"] is None for r in ar)


def test_unfairness_and_speedup_dispersion_by_group(disparity_report):
    data, _ = disparity_report
    base = {r["group"]: r for r in _rows(data["disparity"], draft="base")}
    # high: α̂ 0.8, 0.6 -> mean 0.7, MAD 0.1; medium: 0.5, 0.3 -> 0.1; low has one language only
    assert base["high"]["U"] == pytest.approx(0.1)
    assert base["medium"]["U"] == pytest.approx(0.1)
    assert base["low"]["U"] is None and base["low"]["languages"] == 1
    # all code: 0.8 0.6 0.5 0.3 0.2, mean 0.48, |dev| .32 .12 .02 .18 .28 -> 0.184
    everything = base["all code"]
    assert everything["languages"] == 5 and "nl" not in everything["language_list"]
    assert everything["U"] == pytest.approx(0.184)
    assert everything["U_std"] == pytest.approx(np.sqrt((0.32**2 + 0.12**2 + 0.02**2 + 0.18**2 + 0.28**2) / 5))
    # speedups 2, 1.5, 1.25, 1, 0.8: mean 1.31, population std sqrt(0.872 / 5) -> CV 0.31879
    assert everything["speedup_max"] == pytest.approx(2.0) and everything["fastest"] == "python"
    assert everything["speedup_min"] == pytest.approx(0.8) and everything["slowest"] == "zig"
    assert everything["speedup_cv"] == pytest.approx(0.31879, abs=1e-5)
    assert everything["U_lo"] <= everything["U"] <= everything["U_hi"]
    assert 0 <= everything["U_p"] <= 1  # its test: test_statistics.py


def test_delta_disparity_and_rq1_compare_base_and_tuned(disparity_report):
    data, _ = disparity_report
    assert data["base_tuned"] == ["base", "tuned"]
    delta = {r["group"]: r for r in data["delta_disparity"]}
    # tuned all code: 0.8 0.7 0.6 0.5 0.5, mean 0.62, |dev| .18 .08 .02 .12 .12 -> 0.104
    assert delta["all code"]["U_base"] == pytest.approx(0.184)
    assert delta["all code"]["U_tuned"] == pytest.approx(0.104)
    assert delta["all code"]["delta_U"] == pytest.approx(-0.08)
    assert delta["all code"]["delta_U_pct"] == pytest.approx(-0.08 / 0.184 * 100)
    assert delta["high"]["delta_U"] == pytest.approx(0.05 - 0.1)
    rq1 = {(r["role"], r["domain"]): r for r in data["rq1"]}
    assert rq1[("base", "code")]["alpha"] == pytest.approx(24 / 50)
    assert rq1[("tuned", "code")]["alpha"] == pytest.approx(31 / 50)
    assert rq1[("base", "natural language")]["alpha"] == pytest.approx(0.25)
    assert rq1[("tuned", "natural language")]["alpha"] == pytest.approx(0.2)
    # code speedup pooled: 50 tokens over Σ ms of spec vs 50 tokens over 5000 ms of AR
    code_ms = 2 * sum(ms for lang, ms in SPEC_MS.items() if lang != "nl")
    assert rq1[("base", "code")]["speedup"] == pytest.approx(10000 / code_ms)


def test_report_files_and_plots_are_written(disparity_report):
    data, out = disparity_report
    for name in ("report.md", "report.json", "languages.csv", "disparity.csv", "delta_disparity.csv", "rq1.csv"):
        assert (out / name).stat().st_size > 100, name
    md = (out / "report.md").read_text()
    assert "mean absolute deviation" in md and "Δ disparity" in md and "0.184" in md
    assert json.loads((out / "report.json").read_text())["events"] == 12 + 24
    assert set(data["plots"]) >= {"alpha_by_language.png", "speedup_by_language.png"}
    _assert_real_png(out / "alpha_by_language.png")


def _assert_real_png(path):
    import matplotlib.pyplot as plt

    assert path.stat().st_size > 10_000
    pixels = plt.imread(path)
    colours = np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)
    assert len(colours) > 20  # bars, text and axes, not a blank canvas


def write_sweep_events(path):
    """One python case; AR and γ ∈ {2, 16} at T ∈ {0, 1}; explicit histograms for the burst stats."""
    with EventLog(path) as log:
        for temperature in (0.0, 1.0):
            log.write(_event("python", 0, "none", "0", hist=[], temperature=temperature))
            # γ=16 bursts 0, 3, 12, 16: 31 accepted in 4 rounds, 3 rounds rejected, 2 bursts > 10
            log.write(
                _event(
                    "python",
                    0,
                    "d",
                    "16",
                    31,
                    3,
                    hist=[1, 0, 0, 1] + [0] * 8 + [1, 0, 0, 0, 1],
                    ms=400.0,
                    temperature=temperature,
                )
            )
            # γ=2 bursts 0, 1, 2, 2: 5 accepted in 4 rounds, 2 rejected
            log.write(_event("python", 0, "d", "2", 5, 2, hist=[1, 1, 2], ms=800.0, temperature=temperature))


def test_rq3_burst_statistics_and_heatmap(tmp_path):
    write_sweep_events(tmp_path / "sweep.jsonl")
    data = build_report([str(tmp_path / "sweep.jsonl")], tmp_path / "out", reps=50)
    rq3 = {(r["temperature"], r["gamma"]): r for r in data["rq3"]}
    assert set(rq3) == {(0.0, 2), (0.0, 16), (1.0, 2), (1.0, 16)}
    g16 = rq3[(0.0, 16)]
    assert g16["mean_burst"] == pytest.approx(31 / 4)
    assert g16["p_burst_gt10"] == pytest.approx(0.5)
    assert g16["alpha"] == pytest.approx(31 / 34)
    assert g16["speedup"] == pytest.approx(2.5)
    g2 = rq3[(1.0, 2)]
    assert (g2["mean_burst"], g2["p_burst_gt10"], g2["speedup"]) == (pytest.approx(1.25), 0.0, pytest.approx(1.25))
    assert {"rq3_speedup_heatmap.png", "rq3_bursts.png"} <= set(data["plots"])
    _assert_real_png(tmp_path / "out" / "rq3_speedup_heatmap.png")
    assert "RQ3" in (tmp_path / "out" / "report.md").read_text()


def test_groups_are_configurable():
    assert parse_groups(None) == default_groups()
    assert parse_groups(["fast=python,cpp", "slow=zig"]) == {"fast": ["python", "cpp"], "slow": ["zig"]}
    assert parse_groups(["a=x;b=y,z"]) == {"a": ["x"], "b": ["y", "z"]}
    with pytest.raises(ValueError):
        parse_groups(["nolanguages="])


def test_default_groups_are_the_resource_groups_of_the_language_records():
    assert default_groups() == {
        "high": ["python", "cpp", "java", "c", "javascript", "go"],
        "medium": ["lua", "haskell", "ruby", "rust", "typescript"],
        "low": ["zig", "elixir", "ocaml"],
    }


def test_report_command_end_to_end(tmp_path, capsys):
    from speccomplete.cli import main

    write_disparity_events(tmp_path / "events.jsonl")
    assert (
        main(
            [
                "report",
                str(tmp_path / "*.jsonl"),
                "--out",
                str(tmp_path / "out"),
                "--bootstrap",
                "50",
                "--groups",
                "fast=python,cpp",
                "--groups",
                "slow=rust,zig",
                "--base",
                "tuned",
            ]
        )
        == 0
    )
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["base_tuned"] == ["tuned", "base"]
    assert {r["group"] for r in data["disparity"]} == {"fast", "slow", "all code"}
    assert "report.md" in capsys.readouterr().out
    assert main(["report", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "o2")]) == 2


def test_speedup_pairs_spec_with_the_ar_of_its_own_run(tmp_path):
    """Two bench runs on a machine of different speed: each draft is compared with its own run's AR."""

    def timed(draft, gamma, ms, run):
        event = _event("python", 0, draft, gamma, 4, 1, ms=ms)
        event.settings["run"] = run
        return event

    with EventLog(tmp_path / "events.jsonl") as log:
        for event in (
            timed("none", "0", 2000.0, "busy"),
            timed("base", "1", 1000.0, "busy"),
            timed("none", "0", 1000.0, "idle"),
            timed("tuned", "1", 800.0, "idle"),
        ):
            log.write(event)
    data = build_report([str(tmp_path / "events.jsonl")], tmp_path / "out", reps=10)
    speedup = {r["draft"]: r["speedup"] for r in data["languages"] if r["draft"] != "none"}
    assert speedup == {"base": pytest.approx(2.0), "tuned": pytest.approx(1.25)}  # pooled AR would give 1.5 and 1.875


def test_waits_per_kind_of_answer_add_the_debounce_to_the_latency(tmp_path):
    """An editor's answers: single lines, a staged block's first and next lines, a cancelled request (left
    out); each kind's wait is the server's debounce plus its latency after it."""

    def answer(ms, debounce, multiline=False, stage=None, outcome="shown"):
        event = _event("python", 0, "ngram+self", "heuristic", ms=ms, debounce_ms=debounce, multiline=multiline)
        event.stage, event.outcome, event.source = stage, outcome, "editor"
        return event

    with EventLog(tmp_path / "events.jsonl") as log:
        for event in (
            answer(100.0, 150.0),
            answer(300.0, 150.0),
            answer(200.0, 300.0),
            answer(400.0, 150.0, multiline=True, stage="first"),
            answer(5.0, 0.0, multiline=True, stage="continued"),
            answer(900.0, 150.0, outcome="cancelled"),
        ):
            log.write(event)
    data = build_report([str(tmp_path / "events.jsonl")], tmp_path / "out", reps=10)
    stages = {row["answer"]: row for row in data["stages"]}
    assert set(stages) == {"single line", "block, first lines", "block, next lines"}
    single = stages["single line"]
    assert single["n"] == 3 and single["debounce_p50_ms"] == 150 and single["latency_p50_ms"] == 200
    assert single["wait_p50_ms"] == 450  # of 250, 450 and 500
    assert stages["block, first lines"]["wait_p50_ms"] == 550 and stages["block, next lines"]["wait_p50_ms"] == 5
    assert "## Waits per kind of answer" in (tmp_path / "out" / "report.md").read_text()
