"""`specdec report` over events of several decode backends: our decoder records every drafting round,
llama.cpp only the totals drafted and accepted, vLLM no draft counts. Each backend gets its own rows,
α̂ comes only from events with rounds, and llama.cpp's accepted/drafted is reported as what it is."""

import math

import pytest

from speccomplete.telemetry.analysis.report import build_report
from speccomplete.telemetry.analysis.synthetic import write_synthetic
from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import EventLog

# Per language, summed over its two cases. Ours (γ=1, histogram [rejected, accepted]): (accepted,
# rejected rounds), α̂ = accepted / 10, and drafted = 20 so that accepted/drafted (α̂ / 2) is visibly
# not α̂. llama.cpp: accepted of 20 drafted.
LOCAL = {
    "base": {"python": (8, 2), "cpp": (6, 4), "rust": (3, 7)},
    "tuned": {"python": (8, 2), "cpp": (7, 3), "rust": (5, 5)},
}
LLAMA = {"base": {"python": 14, "cpp": 10, "rust": 4}, "tuned": {"python": 16, "cpp": 12, "rust": 8}}
# 10 tokens per case; AR / spec ms: ours 1000 / 400 (speedup 2.5), llama.cpp 400 / 250 (1.6). Paired
# with the other backend's AR, llama.cpp's speedup would read 4.0.
MS = {"local": (1000.0, 400.0), "llamacpp": (400.0, 250.0)}


def _event(language, case, draft, backend, ms, **counts):
    return CompletionEvent(
        language=language,
        case_id=f"{language}-{case}",
        draft=draft,
        target="t",
        device="cpu",
        backend=backend,
        settings={"gamma": "0" if draft == "none" else "1", "temperature": 0.0, "max_new_tokens": 10},
        generated_tokens=10,
        total_ms=ms,
        latency_ms=ms,
        source="bench",
        **counts,
    )


def _half(n):
    return [n // 2, n - n // 2]


def write_mixed_events(path):
    """Ours and llama.cpp on the same cases, AR and two drafts each, with the same draft names; and one
    llama.cpp completion whose stream was closed before its totals came (unreported, an unpaired case)."""
    with EventLog(path) as log:
        for language in LOCAL["base"]:
            for case in range(2):
                log.write(_event(language, case, "none", "local", MS["local"][0]))
                log.write(_event(language, case, "none", "llamacpp", MS["llamacpp"][0], draft_counts="totals"))
        for draft in ("base", "tuned"):
            for language, (accepted, rejected) in LOCAL[draft].items():
                for case, (a, r) in enumerate(zip(_half(accepted), _half(rejected))):
                    counts = {"accepted": a, "rejected_rounds": r, "drafted": 2 * (a + r), "accepted_histogram": [r, a]}
                    log.write(_event(language, case, draft, "local", MS["local"][1], rounds=a + r, **counts))
            for language, accepted in LLAMA[draft].items():
                for case, a in enumerate(_half(accepted)):
                    counts = {"accepted": a, "drafted": 10, "draft_counts": "totals"}
                    log.write(_event(language, case, draft, "llamacpp", MS["llamacpp"][1], **counts))
        log.write(_event("python", 9, "base", "llamacpp", MS["llamacpp"][1], draft_counts="unreported"))


@pytest.fixture(scope="module")
def mixed_report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("backends")
    write_mixed_events(tmp / "events.jsonl")
    data = build_report([str(tmp / "events.jsonl")], tmp / "out", reps=50)
    return data, tmp / "out"


def _by_language(rows, backend, draft):
    return {r["language"]: r for r in rows if r["backend"] == backend and r["draft"] == draft}


def test_each_backend_has_its_own_rows_and_configurations(mixed_report):
    data, _ = mixed_report
    langs = data["languages"]
    keys = [(r["backend"], r["draft"], r["language"]) for r in langs]
    assert len(keys) == len(set(keys)) == 2 * 3 * 3  # (AR, base, tuned) × 3 languages per backend
    labels = {r["backend"]: set() for r in langs}
    for r in langs:
        labels[r["backend"]].add(r["config"])
    assert labels["local"].isdisjoint(labels["llamacpp"])
    assert all("via" not in c for c in labels["local"]) and all(c.endswith("via llamacpp") for c in labels["llamacpp"])
    # speed pairs each backend with its own AR: 1000/400 and 400/250, never 1000/250
    for backend, speedup in (("local", 2.5), ("llamacpp", 1.6)):
        for draft in ("base", "tuned"):
            rows = _by_language(langs, backend, draft)
            assert {lang: r["speedup"] for lang, r in rows.items()} == pytest.approx(dict.fromkeys(rows, speedup))
    assert _by_language(langs, "llamacpp", "base")["python"]["tokens_per_s"] == pytest.approx(40.0)
    assert _by_language(langs, "llamacpp", "base")["python"]["latency_p50_ms"] == pytest.approx(250.0)


def test_alpha_for_our_rows_and_accepted_over_drafted_for_llamacpps(mixed_report):
    data, _ = mixed_report
    local = _by_language(data["languages"], "local", "base")
    assert {lang: r["alpha"] for lang, r in local.items()} == pytest.approx({"python": 0.8, "cpp": 0.6, "rust": 0.3})
    assert local["python"]["mean_accepted"] == pytest.approx(0.8)
    assert local["python"]["accepted_per_drafted"] == pytest.approx(0.4)  # reported alongside, not as α̂
    assert local["python"]["alpha_lo"] is not None and local["python"]["draft_counts"] == "rounds"
    llama = _by_language(data["languages"], "llamacpp", "base")
    # python: 14 of 20 over the two events with totals; the unreported one counts for speed only
    assert {lang: r["accepted_per_drafted"] for lang, r in llama.items()} == pytest.approx(
        {"python": 0.7, "cpp": 0.5, "rust": 0.2}
    )
    python = llama["python"]
    assert (python["n"], python["n_rounds"], python["n_totals"]) == (3, 0, 2)
    assert python["draft_counts"] == "totals+unreported" and llama["cpp"]["draft_counts"] == "totals"
    assert (python["accepted"], python["drafted"]) == (14, 20)
    for row in llama.values():
        # accepted + 0 rejected rounds would read α̂ = 1: llama.cpp's zeros are not counts of rounds
        assert row["alpha"] is None and row["mean_accepted"] is None and row["p_burst_gt10"] is None
        assert row["alpha_lo"] is None and row["alpha_hi"] is None
        assert row["rejected_rounds"] is None and row["drafting_rounds"] is None


def test_disparity_rq1_and_rq3_never_pool_backends(mixed_report):
    data, _ = mixed_report
    disparity = {(r["backend"], r["draft"], r["group"]): r for r in data["disparity"]}
    assert disparity[("local", "base", "high")]["U"] == pytest.approx(0.1)  # α̂ 0.8 and 0.6
    llama = disparity[("llamacpp", "base", "high")]
    assert llama["U"] is None and llama["speedup_cv"] == pytest.approx(0.0)  # no α̂, speed still compared
    delta = {(r["backend"], r["group"]): r for r in data["delta_disparity"]}
    assert set(delta) == {(b, g) for b in ("local", "llamacpp") for g in ("high", "medium", "low", "all code")}
    assert delta[("local", "high")]["delta_U"] == pytest.approx(0.05 - 0.1)
    assert delta[("llamacpp", "high")].get("delta_U") is None
    rq1 = {(r["backend"], r["role"], r["domain"]): r for r in data["rq1"]}
    assert set(rq1) == {(b, role, "code") for b in ("local", "llamacpp") for role in ("base", "tuned")}
    assert rq1[("local", "base", "code")]["alpha"] == pytest.approx(17 / 30)
    assert rq1[("llamacpp", "base", "code")]["alpha"] is None
    assert rq1[("llamacpp", "base", "code")]["accepted_per_drafted"] == pytest.approx(28 / 60)
    assert rq1[("llamacpp", "base", "code")]["speedup"] == pytest.approx(1.6)
    rq3 = {(r["backend"], r["draft"]): r for r in data["rq3"]}
    assert {k: r["n"] for k, r in rq3.items()} == {
        ("local", "base"): 6,
        ("local", "tuned"): 6,
        ("llamacpp", "base"): 7,
        ("llamacpp", "tuned"): 6,
    }


def test_report_md_labels_llamacpps_ratio_and_what_it_lacks(mixed_report):
    _, out = mixed_report
    md = (out / "report.md").read_text()
    section = md.split("### base γ=1 T=0.0 [t] via llamacpp", 1)[1].split("###", 1)[0]
    assert "draft totals only" in section and "not α̂" in section
    assert "1 of 7 events report no draft counts" in section
    python = next(line for line in section.splitlines() if line.startswith("| python"))
    # language, group, n, cases, α̂, acc/round, acc/drafted, ...
    assert python.split(" | ")[4:7] == ["n/a", "n/a", "0.700"]
    assert "| backend |" in md.split("## RQ1", 1)[1]


def test_a_backend_that_reports_no_draft_counts(tmp_path):
    """vLLM behind the OpenAI API: speed, latency, user acceptance and speedup, and no acceptance."""
    with EventLog(tmp_path / "events.jsonl") as log:
        for language in ("python", "cpp"):
            for case in range(2):
                for draft, ms in (("none", 800.0), ("eagle", 400.0)):
                    event = _event(language, case, draft, "openai", ms, draft_counts="unreported")
                    log.write(event)
                    if draft != "none":
                        log.update_outcome(event.request_id, "accepted" if case else "rejected")
    data = build_report([str(tmp_path / "events.jsonl")], tmp_path / "out", reps=20)
    rows = _by_language(data["languages"], "openai", "eagle")
    for row in rows.values():
        assert row["alpha"] is None and row["mean_accepted"] is None and row["accepted_per_drafted"] is None
        assert row["accepted"] is None and row["drafted"] is None  # zeros that mean nothing are not counts
        assert row["speedup"] == pytest.approx(2.0) and row["tokens_per_s"] == pytest.approx(25.0)
        assert row["user_acceptance"] == pytest.approx(0.5) and row["latency_p95_ms"] == pytest.approx(400.0)
    high = next(r for r in data["disparity"] if r["group"] == "high")
    assert high["U"] is None and high["speedup_min"] == pytest.approx(2.0)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Backend `openai` reports no draft counts" in md
    assert "| python | high | 2 | 2 | n/a | n/a | n/a |" in md


def test_synthetic_llamacpp_events_keep_the_totals_of_the_same_completions(tmp_path):
    """The same seed as our decoder's events, counts reduced to totals: accepted/drafted agrees row for
    row, α̂ exists only for ours, and the two files' rows stay apart."""
    kw = {"n": 300, "gammas": (0, 4), "temperatures": (0.0,), "drafts": ("d",), "cases_per_language": 5}
    write_synthetic(str(tmp_path / "local.jsonl"), **kw)
    write_synthetic(str(tmp_path / "llama.jsonl"), backend="llamacpp", draft_counts="totals", **kw)
    data = build_report([str(tmp_path / "local.jsonl"), str(tmp_path / "llama.jsonl")], tmp_path / "out", reps=20)
    local, llama = (_by_language(data["languages"], b, "d") for b in ("local", "llamacpp"))
    assert set(local) == set(llama) and len(local) > 5
    for language, row in local.items():
        assert row["n"] == llama[language]["n"]
        assert row["accepted_per_drafted"] == pytest.approx(llama[language]["accepted_per_drafted"])
        assert math.isfinite(row["alpha"]) and llama[language]["alpha"] is None
        assert row["alpha"] > row["accepted_per_drafted"]  # drafts after a rejection were never judged
