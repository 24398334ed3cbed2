"""Golden cases for each trimming filter (tests/server/golden/filters/<filter>/*.toml), then the pipeline and the
decoder stop predicate. A golden case: the language, the document with █ at the cursor, the raw completion and
the expected result (multi-line TOML strings, so they read as the editor shows them), and a description; the
tests below write their documents with █ too."""

from __future__ import annotations

import dataclasses
import importlib
import tomllib
from pathlib import Path

import pytest
from helpers.languages import CODE_LANGUAGES

from speccomplete.server import filters, syntax
from speccomplete.server.filters import TrimContext, scope_closed, stop_strings, trim
from speccomplete.server.prompt import build_prompt

GOLDEN = Path(__file__).parent / "golden" / "filters"
CASES = sorted(GOLDEN.glob("*/*.toml"))


def _context(doc: str, language: str) -> TrimContext:
    prefix, suffix = doc.split("█")
    return TrimContext.from_prompt(build_prompt(prefix + suffix, len(prefix), language))


def _load(path: Path) -> tuple[dict, TrimContext]:
    case = tomllib.loads(path.read_text())
    ctx = _context(case["document"], case["language"])
    if "multiline" in case:
        ctx = dataclasses.replace(ctx, multiline=case["multiline"])
    return case, ctx


def _apply(name: str, completion: str, ctx: TrimContext) -> str:
    if name == "trim":
        return trim(completion, ctx)
    end = importlib.import_module(f"speccomplete.server.filters.{name}").cut(completion, ctx)
    return completion if end is None else completion[:end]


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_golden(path):
    case, ctx = _load(path)
    assert _apply(path.parent.name, case["completion"], ctx) == case["expected"], case["description"]


def test_every_filter_has_golden_cases():
    names = {f.__name__.rsplit(".", 1)[1] for f in filters.FILTERS}
    assert names | {"trim"} == {p.name for p in GOLDEN.iterdir()}
    for name in names | {"trim"}:
        assert len(list((GOLDEN / name).glob("*.toml"))) >= 3, name


def test_syntax_scope_covers_every_language():
    covered = {tomllib.loads(p.read_text())["language"] for p in (GOLDEN / "syntax_scope").glob("*.toml")}
    assert CODE_LANGUAGES <= covered


def test_stop_strings():
    assert stop_strings("python", False) == ("\n",)
    assert "\ndef " in stop_strings("python", True) and "\n\n\n" in stop_strings("python", True)
    assert "\nfn " in stop_strings("rust", True) and "\nfunc " in stop_strings("go", True)
    assert stop_strings("text", True) == ("\n\n\n",)
    for language in CODE_LANGUAGES:
        assert all(s.startswith("\n") for s in stop_strings(language, True)), language


def _stop_point(ctx: TrimContext, completion: str) -> int | None:
    """Feed the completion to the predicate a few characters at a time, as decode rounds would."""
    closed = scope_closed(ctx)
    for end in range(3, len(completion) + 3, 3):
        if closed(completion[:end]):
            return min(end, len(completion))
    return None


def test_scope_closed_stops_once_the_block_closes():
    ctx = _context("#include <stdio.h>\nint f(int x) {█\n", "c")
    completion = "\n  int y = x;\n  return y;\n}\n\nint g(void) {\n  return 2;\n}\n"
    stop = _stop_point(ctx, completion)
    assert stop is not None and completion.index("}") < stop <= completion.index("}") + 6


def test_scope_closed_python_dedent():
    ctx = _context("def f(x):\n    █\n", "python")
    completion = "y = x\n    return y\nprint(f(1))\nprint(f(2))\nprint(f(3))\n"
    stop = _stop_point(ctx, completion)
    assert stop is not None and stop < completion.index("print(f(3))")  # one line past the block, not more


def test_scope_closed_stays_open_inside_the_block():
    ctx = _context("def f(x):\n    █\n", "python")
    assert _stop_point(ctx, "y = x\n    z = y\n    return z\n") is None


def test_scope_closed_parses_only_when_a_line_completes(monkeypatch):
    ctx = _context("int f(int x) {█\n", "c")
    calls = []
    real = syntax.parse
    monkeypatch.setattr(syntax, "parse", lambda *a: calls.append(1) or real(*a))
    closed = scope_closed(ctx)
    for text in (
        "\n  int",
        "\n  int y = 1;",
        "\n  int y = 1;\n",
        "\n  int y = 1;\n  ret",
        "\n  int y = 1;\n  return y;\n",
    ):
        closed(text)
    assert len(calls) == 2  # once per completed non-blank line, not once per call


def test_scope_closed_stops_a_loop_inside_the_line():
    """A single-line completion never completes a line: a phrase loop must stop it mid-line (phrase_repeat)."""
    ctx = _context("def empty?(cart) do\n  █\nend\n", "elixir")
    completion = "if Cart.price.is_zero? & Cart.quantity.is_zero?" + " & Cart.quantity.is_zero?" * 6
    stop = _stop_point(ctx, completion)
    assert stop is not None and stop < len("if Cart.price.is_zero?") + 3 * len(" & Cart.quantity.is_zero?") + 3


def test_scope_closed_without_grammar_uses_indentation():
    ctx = _context("section {█\n", "text")
    assert ctx.multiline and not ctx.has_grammar
    completion = "\n    a\n    b\n}\nother\nmore\n"
    assert _stop_point(ctx, completion) is not None
    assert trim(completion, ctx) == "\n    a\n    b\n}"
