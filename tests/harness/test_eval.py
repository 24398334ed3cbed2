"""`specdec eval` end to end through the real server, and the bundled example cases it runs on."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import Counter

from helpers.languages import CODE_LANGUAGES
from helpers.lsp import EXAMPLES, REPO, SERVER_COMMAND, records, save_random_model

from speccomplete.harness.eval import CaseAnswer, run_eval, summarize_answers
from speccomplete.harness.lib.cases import Case, read_cases, write_cases
from speccomplete.telemetry.events import CompletionEvent


def test_examples_cover_the_14_languages():
    cases = read_cases(EXAMPLES)
    assert Counter(c.language for c in cases) == {language: 2 for language in CODE_LANGUAGES}
    for case in cases:
        line = case.text.split("\n")[case.line]
        kind = case.id.rsplit("-", 1)[1]
        assert case.id.startswith(case.language + "-") and kind in ("block", "line")
        if kind == "block":  # an empty line inside a block: a multi-line completion
            assert not line.strip() and case.character == len(line)
        else:  # mid-line: the rest of the line
            assert line[: case.character].strip()


def test_eval_end_to_end(tmp_path):
    model = save_random_model(tmp_path / "model")
    cases = [c for c in read_cases(EXAMPLES) if c.id in ("python-block", "c-line", "ocaml-line")]
    bad = Case("past-end", "x.py", "x = 1\n", 9, 0)  # a case the server must refuse, not crash on
    write_cases(cases + [bad], tmp_path / "cases.jsonl")
    events, results = tmp_path / "events.jsonl", tmp_path / "results.jsonl"
    command = [
        *SERVER_COMMAND[:-1],
        "eval",
        str(tmp_path / "cases.jsonl"),
        "--telemetry",
        str(events),
        "--results",
        str(results),
        "--target",
        str(model),
        "--draft",
        "layers:0",
        "--max-tokens-multi-line",
        "24",
        "--max-tokens-single-line",
        "12",
        "--summary",
        str(tmp_path / "summary.json"),
    ]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    # from the server's start to its ready status: the process, its imports and the models' load
    assert 0 < summary["ready_s"] < 600 and summary["restarts_ready_s"] == []
    assert "server ready" in run.stdout

    table = run.stdout
    for language in ("python", "c", "ocaml", "all"):
        assert any(line.startswith(language) for line in table.splitlines()), table
    assert "alpha" in table and "p95 ms" in table

    logged = records(events)
    assert {e["case_id"] for e in logged} == {"python-block", "c-line", "ocaml-line", "past-end"}
    assert all(e["source"] == "eval" and e["text"] is None for e in logged)
    by_case = {e["case_id"]: e for e in logged}
    assert by_case["python-block"]["multiline"] and not by_case["c-line"]["multiline"]
    assert by_case["ocaml-line"]["language"] == "ocaml" and by_case["ocaml-line"]["generated_tokens"] <= 12
    assert by_case["past-end"]["outcome"] == "error"
    all_row = next(line for line in table.splitlines() if line.startswith("all")).split()
    assert all_row[1] == "4" and all_row[-3:] == ["1", "0", "0"], "one error, no timeouts, no crashes"

    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert [r["id"] for r in rows] == [c.id for c in cases] + ["past-end"]
    assert set(rows[0]) >= {"id", "language", "completion", "latency_ms"}
    assert rows[3]["status"] == "error" and rows[3]["completion"] == ""


CRASHING_SERVER = """
import os, sys
import speccomplete.server.lsp as lsp
from speccomplete.cli import main

real = lsp.complete

def complete(engine, options, request, cancel):
    if "CRASH" in request.text:
        os._exit(3)  # a hard crash inside a decode, as a segfault would be
    return real(engine, options, request, cancel)

lsp.complete = complete
sys.exit(main(["serve"]))
"""


async def test_eval_counts_a_crash_and_restarts_the_server(tmp_path):
    model = save_random_model(tmp_path / "model")
    cases = [
        Case("before", "a.py", "x = 1\ny = ", 1, 4),
        Case("crash", "b.py", "CRASH = ", 0, 8),
        Case("after", "c.go", "package main\n\nvar x = ", 2, 8),
    ]
    options = {"target": str(model), "draft": "none", "debounceMs": 0, "telemetry": False, "maxTokensSingleLine": 4}
    ready_s: list[float] = []
    command = [sys.executable, "-c", CRASHING_SERVER]
    results = await run_eval(cases, options, command=command, timeout=120, ready_s=ready_s)
    assert [r.status for r in results] == ["ok", "crash", "ok"]
    assert len(ready_s) == 2 and all(s > 0 for s in ready_s)  # the first start and the restart, each to ready
    assert results[2].language == "go" and results[2].request_id, "the restarted server answered"
    rows = {row["language"]: row for row in summarize_answers(results, [])}
    assert rows["all"]["crashes"] == 1 and rows["python"]["crashes"] == 1 and rows["go"]["crashes"] == 0


def test_summary_rows_from_events_and_answers():
    """Latency percentiles interpolate linearly between ranks, as statistics.quantiles(method="inclusive")."""
    latencies = [12.0, 30.0, 7.0, 101.0, 55.0, 48.0, 9.5]
    cases = [Case(f"c{i}", "a.py", "x = 1\n", 0, 4) for i in range(len(latencies))]
    answers = [CaseAnswer(case, "python", "ok", "1", f"r{i}", 1.0) for i, case in enumerate(cases)]
    answers[-1].status, answers[-1].completion = "timeout", ""
    events = [
        CompletionEvent(
            request_id=f"r{i}",
            language="python",
            latency_ms=ms,
            multiline=i % 2 == 0,
            accepted=3,
            rejected_rounds=1,
            generated_tokens=5,
        )
        for i, ms in enumerate(latencies)
    ]
    python, all_ = summarize_answers(answers, events)
    assert python == {**all_, "language": "python"}
    quantiles = statistics.quantiles(latencies, n=100, method="inclusive")
    assert all_["p50_ms"] == quantiles[49] == 30.0
    assert abs(all_["p95_ms"] - quantiles[94]) < 1e-9
    assert all_["p50_multi_ms"] == statistics.median(latencies[::2])
    assert all_["alpha"] == 21 / 28 and all_["tokens"] == 35
    assert (all_["cases"], all_["single"], all_["multi"], all_["timeouts"], all_["empty"]) == (7, 3, 4, 1, 0)
