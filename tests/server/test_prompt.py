"""The prompt builder: single vs multi-line, cuts at syntactic boundaries within the budget, a start that stays put
while the user types, FIM formatting."""

from __future__ import annotations

import pytest
from helpers.languages import CODE_LANGUAGES

from speccomplete.server import syntax
from speccomplete.server.prompt import (
    FIM_STYLES,
    FimTokens,
    Prompt,
    build_prompt,
    fim_tokens,
    format_fim,
    select_lines,
)

# (language, document with █ at the cursor, multi-line?)
MULTILINE_CASES = [
    ("python", "def f(x):█\n", True),
    ("python", "def f(x):\n    █\n", True),
    ("python", "y = foo(█)\n", False),
    ("python", "x = 1  # note:█\n", False),
    ("python", "s = 'a:█'\n", False),
    ("c", "int f(void) {█\n", True),
    ("c", "int x = █;\n", False),
    ("c", "switch (x) {\n  case 1:█\n", True),
    ("cpp", "class A {\n public:█\n", True),
    ("cpp", "using std::█\n", False),
    ("java", "class A {█\n", True),
    ("java", "int x = █\n", False),
    ("go", "func f() {█\n", True),
    ("go", "x := █\n", False),
    ("rust", "fn f() {█\n", True),
    ("rust", "let x = █\n", False),
    ("rust", "use std::█\n", False),
    ("javascript", "function f() {█}\n", True),
    ("javascript", "foo(█)\n", False),
    ("typescript", "if (x) {█\n", True),
    ("typescript", "const x: number = █\n", False),
    ("lua", "function f(x)█\n", True),
    ("lua", "if x then█\n", True),
    ("lua", "local y = █\n", False),
    ("haskell", "main = do█\n", True),
    ("haskell", "f x = g █ y\n", False),
    ("ruby", "def f(x)█\n", True),
    ("ruby", "x.each do |y|█\n", True),
    ("ruby", "y = █\n", False),
    ("zig", "fn f() void {█\n", True),
    ("zig", "const x = █\n", False),
    ("elixir", "def f(x) do█\n", True),
    ("elixir", "fn x ->█\n", True),
    ("elixir", "y = █\n", False),
    ("ocaml", "let f x =█\n", True),
    ("ocaml", "match x with█\n", True),
    ("ocaml", "let y = f █ x\n", False),
    ("text", "  █\n", True),
    ("text", "word█ more\n", False),
]


def _prompt(doc: str, language: str, budget: int = 4000) -> Prompt:
    prefix, suffix = doc.split("█")
    return build_prompt(prefix + suffix, len(prefix), language, budget)


def _selected(doc: str, language: str, budget: int) -> Prompt:
    """The line selection for a cursor at █ (what a page's stable part is made of), as a Prompt."""
    prefix, suffix = doc.split("█")
    text = prefix + suffix
    before, after = select_lines(text, len(prefix), language, syntax.parse(language, text), budget)
    return Prompt(before, after, False, "", language)


@pytest.mark.parametrize(
    "language,doc,multiline", MULTILINE_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(MULTILINE_CASES)]
)
def test_single_or_multi_line(language, doc, multiline):
    assert _prompt(doc, language).multiline is multiline


def test_every_language_has_both_decisions():
    for language in CODE_LANGUAGES:
        decisions = {m for lang, _, m in MULTILINE_CASES if lang == language}
        assert decisions == {True, False}, language


def test_small_document_is_whole():
    p = _prompt("import os\n\ndef f():\n    █return 1\n", "python")
    assert (p.prefix, p.suffix, p.indent, p.language) == ("import os\n\ndef f():\n    ", "return 1\n", "    ", "python")
    assert p.multiline is False


def test_offset_outside_the_document():
    with pytest.raises(ValueError):
        build_prompt("abc", 4, "python")


PYTHON = """import os
from typing import (
    Any,
)


def far_away():
    return 1


def helper(x):
    # doubles
    return x * 2


class A:
    def m1(self):
        return 1

    def m2(self, y):
        z = y + 1
        █
        return z

    def m3(self):
        return 3


def after():
    pass
"""


def _whole_lines(p: Prompt, doc: str):
    """Every line of the prompt but the cursor line is a whole line of the document."""
    lines = set(doc.replace("█", "").split("\n"))
    assert all(line in lines for line in p.prefix.split("\n")[:-1])
    assert all(line in lines for line in p.suffix.split("\n")[1:])


@pytest.mark.parametrize("budget", [40, 80, 150, 250, 330])
def test_cuts_are_whole_lines_within_budget(budget):
    p = _prompt(PYTHON, "python", budget)
    assert len(p.prefix) + len(p.suffix) <= budget
    assert p.prefix.endswith("\n        ")
    if budget >= 80:  # the enclosing method fits
        assert p.prefix.endswith("        z = y + 1\n        ") and p.suffix.startswith("\n        return z")
    _whole_lines(p, PYTHON)


def test_enclosing_definition_and_header_kept_far_siblings_dropped():
    p = _selected(PYTHON, "python", 250)
    assert "    def m2(self, y):\n        z = y + 1\n" in p.prefix and "        return z" in p.suffix
    assert p.prefix.startswith("import os\nfrom typing import (\n    Any,\n)\n")  # a multi-line import whole
    assert "class A:\n" in p.prefix  # the signature of the enclosing class that did not fit whole
    assert "def m1(self):\n        return 1\n" in p.prefix and "def m3(self):\n        return 3" in p.suffix
    assert "def helper(x):\n    # doubles\n    return x * 2\n" in p.prefix  # the comment goes with its function
    assert "far_away" not in p.prefix and "after" not in p.suffix  # the farthest siblings go first


def test_enclosing_definition_too_big_keeps_its_signature_and_nearest_lines():
    body = "".join(f"    x{i} = {i}\n" for i in range(200))
    doc = "import os\n\ndef big():\n" + body[:1400] + "    █\n" + body[1400:]
    p = _selected(doc, "python", 600)
    assert p.prefix.startswith("import os\n\ndef big():\n")
    assert len(p.prefix) + len(p.suffix) <= 600
    assert p.prefix.endswith(body[:1400].split("\n")[-2] + "\n    ")
    assert len(p.prefix) > 2 * len(p.suffix)  # most of the budget goes before the cursor
    _whole_lines(p, doc)


JAVA = (
    """package a;
import java.util.List;

class A {
  int one() {
    return 1;
  }

  int two() {
    return 2;
  }

  int three(int x) {
    █
  }

  int four() {
    return 4;
  }
"""
    + "".join(f"\n  int far{i}() {{\n    return {i};\n  }}\n" for i in range(20))
    + "}\n"
)


def test_java_siblings_within_the_class():
    p = _selected(JAVA, "java", 260)
    assert p.prefix.startswith("package a;\nimport java.util.List;\n")
    assert "class A {\n" in p.prefix and "  int three(int x) {\n    " in p.prefix
    assert "  int two() {\n    return 2;\n  }\n" in p.prefix and "int four()" in p.suffix
    assert "far19" not in p.suffix
    _whole_lines(p, JAVA)


def test_unknown_language_keeps_nearest_lines():
    doc = "".join(f"line {i}\n" for i in range(100)) + "now █here\n" + "".join(f"after {i}\n" for i in range(100))
    p = _selected(doc, "text", 200)
    assert p.prefix.endswith("line 99\nnow ") and p.suffix.startswith("here\nafter 0\n")
    assert len(p.prefix) + len(p.suffix) <= 200 and len(p.prefix) > len(p.suffix)


def test_overlong_cursor_line_is_cut_at_word_boundaries():
    words = " ".join(f"w{i}" for i in range(3000))
    doc = words + " █" + words
    p = _prompt(doc, "javascript", 1000)
    assert len(p.prefix) + len(p.suffix) <= 1000
    assert p.prefix.endswith("w2999 ") and p.prefix.split(" ")[0] in words.split(" ")
    assert p.suffix.startswith("w0 w1") and p.suffix.split(" ")[-1] in words.split(" ")


def test_huge_document():
    doc = "x = 1\n" * 900_000 + "def f():\n    █\n" + "y = 2\n" * 10
    p = _prompt(doc, "python", 2000)  # 5 MB: past the parse limit, indentation and nearest lines only
    assert p.multiline and p.prefix.endswith("def f():\n    ") and len(p.prefix) + len(p.suffix) <= 2000


def test_fim_tokens():
    assert fim_tokens({"<fim_prefix>", "<fim_suffix>", "<fim_middle>", "a"}) == FIM_STYLES[0]
    assert fim_tokens({"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}) == FIM_STYLES[1]
    assert fim_tokens({"<fim_prefix>", "<fim_suffix>"}) is None  # incomplete
    assert fim_tokens({"<bos>", "<start_of_turn>"}) is None
    assert fim_tokens({"<fim_prefix>": 1, "<fim_suffix>": 2, "<fim_middle>": 3}.keys()) == FIM_STYLES[0]


def test_format_fim():
    p = Prompt("def f():\n    ", "\n\nx = 1\n", True, "    ", "python")
    text = format_fim(p, FimTokens("<P>", "<S>", "<M>"))
    assert text == "<P>def f():\n    <S>\n\nx = 1\n<M>"


def _typed_file(functions: int = 60) -> str:
    return "import os\nimport sys\n\n\n" + "".join(
        f"def f{i}(x, y):\n    z = x * {i} + y\n    if z > {i}:\n        return z - 1\n    return z\n\n\n"
        for i in range(functions)
    )


def test_typing_down_a_file_only_appends_to_the_prompt_inside_a_page():
    """The user types the file from the top and pauses at each new line: a request's prompt starts with the
    last one's, except when the cursor's line enters the next page (a quarter of the budget)."""
    text, budget = _typed_file(), 800
    starts = [i + 1 for i, c in enumerate(text) if c == "\n"]
    prompts = [build_prompt(text[:at], at, "python", budget) for at in starts]
    appended = sum(b.prefix.startswith(a.prefix) for a, b in zip(prompts, prompts[1:]))
    past_budget = sum(at > budget for at in starts)
    assert appended >= len(prompts) - 1 - (len(text) // (budget // 4) + 1)  # at most one new start per page
    assert past_budget > 100 and appended / (len(prompts) - 1) > 0.8
    for p in prompts:
        assert len(p.prefix) + len(p.suffix) <= budget
        _whole_lines(p, text)


def test_typing_along_a_line_only_appends():
    text, budget = _typed_file(), 800
    line = text.index("    z = x * 40 + y")
    prompts = [build_prompt(text, at, "python", budget) for at in range(line, line + 18)]
    assert all(b.prefix.startswith(a.prefix) for a, b in zip(prompts, prompts[1:]))
    assert prompts[0].prefix.startswith("import os\nimport sys\n")  # the header, in the stable part
    assert prompts[0].prefix.endswith("def f40(x, y):\n")  # the page's lines up to the cursor, whole


def test_the_stable_part_ignores_edits_below_it():
    text, budget = _typed_file(), 800
    at = text.index("    return z\n", text.index("def f30("))
    edited = text[:at] + "    # a new comment\n" + text[at:]
    a, b = build_prompt(text, at, "python", budget), build_prompt(edited, at + 20, "python", budget)
    assert b.prefix.startswith(a.prefix)
