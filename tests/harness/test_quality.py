"""`specdec quality`: the loop metric's golden cases, the reference line of a case, and a run through the server's
pipeline on a tiny random model."""

from __future__ import annotations

import json

import pytest
from helpers.lsp import EXAMPLES, save_random_model

from speccomplete.cli import main
from speccomplete.harness import quality
from speccomplete.harness.lib.cases import Case, read_cases, write_cases
from speccomplete.harness.quality import (
    OVERALL,
    after_enter,
    line_match,
    loop_kind,
    loops,
    next_line_request,
    request_document,
    scored,
    summarize,
)
from speccomplete.server.completion import Completion
from speccomplete.server.options import parse_options
from speccomplete.server.snippets import OpenDocument
from speccomplete.telemetry.events import CompletionEvent

LOOPING = [  # (completion, the rule that catches it)
    ("foo()\nfoo()\nfoo()", "line"),  # a line three times
    ("    x += 1\n    x += 1\n    x += 1\n", "line"),
    ("a = 1\nb = 2\na = 1\nb = 2", "block"),  # a block of two lines twice
    ("if x:\n    y()\nif x:\n    y()\n", "block"),
    ("call()\n\ncall()\n\n", "block"),  # a line and a blank line, twice
    ("a & b & b & b & b", "phrase"),  # " & b" four times back to back
    ("foo(foo(foo(", "phrase"),
    ("return self.self.self.x", "phrase"),  # "self." three times
    ("ok\nthe the the end", "phrase"),  # inside any line
    ("xs = [a0, a0, a0, a0]", "phrase"),  # "a0, " holds a letter outside a number
    # counting: lines alike but for their numbers, 5 lines or a block 3 times (a small model's favourite)
    ("".join(f'    "{i}": {i},\n' for i in range(6)), "counting"),
    ("".join(f"if n == {i} then\n  return {i}\nend\n" for i in range(3)), "counting"),
    ("".join(f"    if (args[{i}] === 'x') {{\n      t = args[{i + 1}];\n    }}\n" for i in range(3)), "counting"),
    ("/*\n * " + "* " * 60, "run"),  # a phrase without a letter, over 80 characters
    ("pad = [" + "0, " * 40 + "0]", "run"),
]

NOT_LOOPING = [
    "",
    "foo()\nfoo()",  # a line twice: real code does that
    "    i++;\n    i++;\n    j++;",
    "x = [0, 0, 0]",  # short repeats without a letter: data
    "x = [0, 0, 0, 0, 0, 0]",
    "static const char pad[] = {0x00, 0x00, 0x00, 0x00};",  # the x is part of a number
    "v = {1.5f, 1.5f, 1.5f, 1.5f}",
    "# " + "-" * 100,  # one character, however long: a ruler
    "/* " + "=" * 120 + " */",
    "}\n}\n}",  # closing brackets, even at one indentation: structure, not a loop
    "        }\n    }\n}",
    "end\n  end\nend",  # `end` three times, but not the same line (indentation differs)
    "\n\n\n",
    "a = 1\nb = 2\na = 1",  # the block does not come back whole
    "a & b & b",  # a phrase twice only
    "aa aa",
    "for i in range(10):\n    total += i\nreturn total",
    "".join(f"    v[{i}] = {i};\n" for i in range(4)),  # alike but for numbers: 4 lines are not yet counting
    "".join(f"case {i}:\n  return {i};\n" for i in range(2)),  # a block alike twice only
    "RED = 1\nGREEN = 2\nBLUE = 3\nALPHA = 4\nGAMMA = 5\nDELTA = 6",  # an enumeration: names differ
]


@pytest.mark.parametrize(("text", "kind"), LOOPING)
def test_loops(text, kind):
    assert loop_kind(text) == kind
    assert loops(text)


@pytest.mark.parametrize("text", NOT_LOOPING)
def test_does_not_loop(text):
    assert loop_kind(text) is None
    assert not loops(text)


PY = "import os\n\n\ndef f(x):\n    y = x + 1\n    return y\n"


def test_a_case_after_indentation_is_scored_with_its_line_cut_out():
    case = Case("py", "a.py", PY, 4, 4)  # before `y = x + 1`
    assert scored(case) and case.expected_line == "y = x + 1"
    assert request_document(case) == "import os\n\n\ndef f(x):\n    \n    return y\n"
    assert line_match(case, "y = x + 1\n    return y") == (True, 1.0, "y = x + 1", "y = x + 1")
    exact, similarity, got, _ = line_match(case, "y = x + 2  ")
    assert not exact and 0.8 < similarity < 1 and got == "y = x + 2"
    assert line_match(case, "") == (False, 0.0, "", "y = x + 1")


def test_a_mid_line_case_is_scored_with_the_rest_of_its_line_cut_out():
    text = "def f(x):\n    y = x + 1\n    return y\n"
    case = Case("py-0", "a.py", text, 1, 9, cut=True)  # "    y = x" typed, " + 1" to come
    assert scored(case) and case.expected_line == " + 1"
    assert request_document(case) == "def f(x):\n    y = x\n    return y\n"
    assert line_match(case, " + 1\n    return y") == (True, 1.0, "y = x + 1", "y = x + 1")
    assert not scored(Case("py-0", "a.py", text, 1, 9))  # unmarked, the same cursor is a hole: sent as it is


def test_holes_have_no_reference():
    mid_line = Case("mid", "a.py", PY, 4, 9)  # `    y = |x + 1`
    empty_line = Case("blank", "a.py", "def f():\n    \n", 1, 4)
    for case in (mid_line, empty_line):
        assert not scored(case)
        assert request_document(case) == case.text
        assert line_match(case, "x + 1") is None


def test_run_case_opens_the_neighbours_beside_the_document(monkeypatch):
    seen = []

    def complete(engine, options, request, cancel):
        seen.append(request)
        return Completion("y = x + 1", "python", True, CompletionEvent(latency_ms=5.0))

    monkeypatch.setattr(quality, "complete", complete)
    options, errors = parse_options({})
    assert not errors
    neighbours = [{"path": "b.py", "text": "def g():\n    pass\n"}, {"path": "c.py", "text": "z = 3\n"}]
    row = quality.run_case(None, options, Case("py", "a.py", PY, 4, 4, neighbours=neighbours), "q-0")
    assert seen[0].open_documents == (OpenDocument("b.py", "def g():\n    pass\n"), OpenDocument("c.py", "z = 3\n"))
    assert seen[0].path == "a.py" and seen[0].text == request_document(Case("py", "a.py", PY, 4, 4))
    assert row["exact"] is True
    quality.run_case(None, options, Case("py", "a.py", PY, 4, 4), "q-1")
    assert seen[1].open_documents == ()


def test_a_line_end_case_is_scored_on_the_next_line_cut_out_with_its_line_break():
    case = Case("py", "a.py", PY, 4, 13, line_end=True)  # `    y = x + 1|`, finished; `return y` to come
    assert scored(case) and case.next_line == "    return y"
    assert request_document(case) == "import os\n\n\ndef f(x):\n    y = x + 1\n"
    assert line_match(case, "") == (False, 0.0, "", "return y")
    assert line_match(case, "\n    return y\n") == (True, 1.0, "return y", "return y")  # offered below the line
    assert line_match(case, "\n\n    return y")[:3] == (False, 0.0, "")  # a blank line offered first: not it
    exact, similarity, got, _ = line_match(case, "  # one more\n    return y")  # text added to the finished line
    assert not exact and 0 < similarity < 1 and got == "# one more\nreturn y"
    assert not scored(Case("py", "a.py", PY, 5, 12, line_end=True))  # the last line: nothing comes next
    # offered the next line: a line break after the cursor, the cursor after it at column 0
    assert next_line_request(case) == ("import os\n\n\ndef f(x):\n    y = x + 1\n\n", 5, 0)
    # the baseline: the user pressed Enter, the editor indented: the usual scored case on the same line
    entered = after_enter(case)
    assert (entered.line, entered.character, entered.line_end) == (5, 4, False)
    assert scored(entered) and entered.expected_line == "return y"
    assert request_document(entered) == "import os\n\n\ndef f(x):\n    y = x + 1\n    \n"


@pytest.mark.parametrize(
    ("at_line_end", "sent", "answer", "shown"),
    [
        ("as-is", ("import os\n\n\ndef f(x):\n    y = x + 1\n", 4, 13), "", ""),
        ("next-line", ("import os\n\n\ndef f(x):\n    y = x + 1\n\n", 5, 0), "    return y", "\n    return y"),
        ("next-line", ("import os\n\n\ndef f(x):\n    y = x + 1\n\n", 5, 0), "", ""),  # nothing: no line break
        ("after-enter", ("import os\n\n\ndef f(x):\n    y = x + 1\n    \n", 5, 4), "return y", "return y"),
    ],
)
def test_run_case_sends_a_line_end_case_as_told(monkeypatch, at_line_end, sent, answer, shown):
    seen = []

    def complete(engine, options, request, cancel):
        seen.append((request.text, request.line, request.character))
        return Completion(answer, "python", True, CompletionEvent(latency_ms=5.0))

    monkeypatch.setattr(quality, "complete", complete)
    options, _ = parse_options({})
    row = quality.run_case(None, options, Case("py", "a.py", PY, 4, 13, line_end=True), "q-0", at_line_end)
    assert seen == [sent]
    assert row["completion"] == shown and row["shown"] == bool(shown) and row["scored"]
    assert row["exact"] is bool(shown) and row["expected_line"] == "return y"


def _row(language, shown, exact=None, similarity=None, looping=None, latency=10.0, lines=(0, None)):
    return {
        "language": language,
        "lines_shown": lines[0],
        "lines_right": lines[1],
        "shown": shown,
        "scored": exact is not None,
        "exact": exact,
        "similarity": similarity,
        "loops": looping is not None,
        "loop_kind": looping,
        "multiline": True,
        "latency_ms": latency,
        "generated_tokens": 4,
        "error": None,
    }


@pytest.mark.parametrize(
    "completion, right",
    [
        ("x = 1\n    y = 2\n    return x + y", 3),  # the rest of the line, then the file's next two lines
        ("x = 1\n    y = 3", 1),
        ("x = 2", 0),
        ("x = 1\n\n    y = 2", 1),  # a blank line the file does not have ends it
    ],
)
def test_lines_right_counts_the_file_own_lines_in_order(completion, right):
    text = "def f():\n    x = 1\n    y = 2\n    return x + y\n"
    case = Case("py", "f.py", text, 1, 4)
    assert quality.lines_right(case, completion) == right


def test_summary_rates_over_shown_and_over_all():
    rows = [
        _row("python", True, True, 1.0, latency=10, lines=(3, 2)),
        _row("python", True, False, 0.5, looping="phrase", latency=30, lines=(1, 0)),
        _row("python", False, False, 0.0, latency=20),
        _row("go", True, latency=40),  # shown, no reference
    ]
    summary = summarize(rows)
    assert list(summary) == ["go", "python", OVERALL]
    py = summary["python"]
    assert (py["n"], py["shown"], py["scored"]) == (3, 2, 3)
    assert py["shown_rate"] == pytest.approx(2 / 3) and py["empty_rate"] == pytest.approx(1 / 3)
    assert py["exact_shown"] == 0.5 and py["exact_all"] == pytest.approx(1 / 3)
    assert py["similarity_shown"] == 0.75 and py["similarity_all"] == pytest.approx(0.5)
    assert py["loop_rate"] == 0.5 and py["loop_kinds"]["phrase"] == 1 and sum(py["loop_kinds"].values()) == 1
    assert py["mean_latency_ms"] == 20 and py["p50_latency_ms"] == 20
    assert py["mean_lines_shown"] == 2 and py["mean_lines_right"] == 1
    go = summary["go"]
    assert go["exact_shown"] is None and go["similarity_all"] is None and go["loop_rate"] == 0
    assert summary[OVERALL]["n"] == 4 and summary[OVERALL]["p50_latency_ms"] == 25


def test_quality_runs_the_server_pipeline_and_writes_json(tmp_path, capsys):
    model = save_random_model(tmp_path / "model")
    bundled = [c for c in read_cases(EXAMPLES) if c.id in ("python-block", "go-line")]
    cases = [*bundled, Case("python-0", "walk.py", PY, 4, 4)]
    write_cases(cases, tmp_path / "cases.jsonl")
    out = tmp_path / "out" / "quality.json"
    argv = ["quality", "--cases", str(tmp_path / "cases.jsonl"), "--target", str(model), "--draft", "ngram"]
    argv += ["--options", '{"maxTokensMultiLine": 12, "maxTokensSingleLine": 6}', "--json", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "OVERALL" in table and "exact/sh" in table
    assert (tmp_path / "out" / "quality.txt").read_text().strip() == table.strip()

    data = json.loads(out.read_text())
    assert data["settings"]["max_tokens_multi_line"] == 12 and data["options"] == {
        "maxTokensMultiLine": 12,
        "maxTokensSingleLine": 6,
    }
    rows = {r["id"]: r for r in data["rows"]}
    assert list(rows) == [c.id for c in cases]  # in case order
    for row in rows.values():
        assert row["error"] is None and (row["evidence"] is None or isinstance(row["evidence"], dict))
        assert row["shown"] == bool(row["completion"])
        assert row["loops"] is False or row["shown"]
        assert row["loops"] == (row["loop_kind"] is not None)
        assert row["latency_ms"] > 0 and row["generated_tokens"] <= 12
    assert rows["python-block"]["multiline"] and not rows["go-line"]["multiline"]
    assert not rows["python-block"]["scored"] and rows["python-block"]["exact"] is None
    real = rows["python-0"]
    assert real["scored"] and real["multiline"]  # its line cut out: the cursor is on an empty line
    assert real["expected_line"] == "y = x + 1" and isinstance(real["exact"], bool)
    assert 0 <= real["similarity"] <= 1
    overall = data["languages"][OVERALL]
    assert overall["n"] == 3 and overall["scored"] == 1
    assert set(data["languages"]) == {"go", "python", OVERALL}
    assert overall["shown_rate"] + overall["empty_rate"] == pytest.approx(1)


def test_quality_offers_line_end_cases_the_next_line(tmp_path, capsys):
    model = save_random_model(tmp_path / "model")
    write_cases([Case("python-0", "walk.py", PY, 4, 13, line_end=True)], tmp_path / "cases.jsonl")
    out = tmp_path / "quality.json"
    argv = ["quality", "--cases", str(tmp_path / "cases.jsonl"), "--target", str(model), "--draft", "ngram"]
    argv += ["--options", '{"minConfidence": 0, "maxTokensMultiLine": 12}', "--at-line-end", "next-line"]
    assert main([*argv, "--json", str(out)]) == 0
    assert "at the end of a finished line: next-line" in capsys.readouterr().out
    data = json.loads(out.read_text())
    (row,) = data["rows"]
    assert data["at_line_end"] == "next-line" and row["line_end"] and row["scored"] and row["error"] is None
    assert row["multiline"]  # the request on the line below is an empty line's: a block
    assert row["expected_line"] == "return y" and 0 <= row["similarity"] <= 1
    assert row["shown"] == bool(row["completion"]) and (not row["shown"] or row["completion"].startswith("\n"))


def test_options_must_be_known_settings(tmp_path, capsys):
    write_cases([Case("py", "a.py", PY, 4, 4)], tmp_path / "cases.jsonl")
    argv = ["quality", "--cases", str(tmp_path / "cases.jsonl"), "--options", '{"maxTokensMultiLin": 64}']
    assert main(argv) == 2
    assert "did you mean maxTokensMultiLine" in capsys.readouterr().err
