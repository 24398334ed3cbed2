"""tree-sitter parsing through tree-sitter-language-pack 0.13.0, for every language speccomplete/languages.py names."""

from __future__ import annotations

import logging
import threading

import pytest

from speccomplete.languages import LANGUAGES
from speccomplete.server import syntax

SNIPPETS = {
    "python": "import os\n\ndef f(x):\n    return x + 1\n",
    "c": "#include <stdio.h>\nint f(int x) {\n  return x + 1;\n}\n",
    "cpp": "#include <vector>\nclass A {\n public:\n  int f() { return 1; }\n};\n",
    "java": "package a;\nclass A {\n  int f(int x) {\n    return x + 1;\n  }\n}\n",
    "go": "package main\n\nfunc f(x int) int {\n\treturn x + 1\n}\n",
    "rust": "use std::io;\nfn f(x: i32) -> i32 {\n    x + 1\n}\n",
    "javascript": "import x from 'y';\nfunction f(a) {\n  return a + 1;\n}\n",
    "typescript": "function f(a: number): number {\n  return a + 1;\n}\n",
    "tsx": "const A = () => <div>{1}</div>;\n",
    "lua": "local m = require('m')\nfunction f(x)\n  return x + 1\nend\n",
    "haskell": "module Main where\nf :: Int -> Int\nf x = x + 1\n",
    "ruby": "require 'set'\ndef f(x)\n  x + 1\nend\n",
    "zig": 'const std = @import("std");\nfn f(x: i32) i32 {\n    return x + 1;\n}\n',
    "elixir": "defmodule A do\n  def f(x) do\n    x + 1\n  end\nend\n",
    "ocaml": "open Printf\nlet f x = x + 1\n",
    "bash": 'f() {\n  echo "$1"\n}\n',
}


def test_every_language_has_a_snippet():
    assert {language.name for language in LANGUAGES} == set(SNIPPETS)


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_parses_without_errors(language):
    tree = syntax.parse(language, SNIPPETS[language])
    assert tree is not None and not tree.root_node.has_error
    assert tree.root_node.end_byte == syntax.byte_len(SNIPPETS[language])
    assert tree.root_node.named_child_count >= 1


def test_no_grammar():
    assert syntax.parse("text", "anything") is None
    assert syntax.parse("cobol", "anything") is None
    assert syntax.parser("text") is None


def test_too_large_to_parse():
    assert syntax.parse("python", "x = 1\n" * (syntax.MAX_PARSE_CHARS // 6 + 1)) is None


def test_parser_cached_per_thread():
    assert syntax.parser("python") is syntax.parser("python")
    other = []
    t = threading.Thread(target=lambda: other.append(syntax.parser("python")))
    t.start()
    t.join()
    assert other[0] is not None and other[0] is not syntax.parser("python")


def test_grammar_failure_is_logged_and_gives_none(monkeypatch, caplog):
    def broken(name):
        raise RuntimeError("no grammar")

    monkeypatch.setattr(syntax, "get_parser", broken)
    monkeypatch.setattr(syntax, "_local", threading.local())
    with caplog.at_level(logging.ERROR, logger="speccomplete.server.syntax"):
        assert syntax.parse("python", "x = 1\n") is None
    assert "failed to load" in caplog.text


def test_byte_offsets_and_lone_surrogates():
    assert syntax.byte_len("é€😀") == 2 + 3 + 4
    assert syntax.parse("python", "x = '\ud800'\n") is not None  # an unpaired surrogate does not crash


def test_containers():
    tree = syntax.parse("python", SNIPPETS["python"])
    function = tree.root_node.named_children[1]
    assert syntax.is_container(tree.root_node) and function.type == "function_definition"
    assert not syntax.is_container(function) and syntax.is_container(function.child_by_field_name("body"))
    tree = syntax.parse("elixir", SNIPPETS["elixir"])
    assert any(syntax.is_container(n) for n in tree.root_node.named_children[0].named_children)  # do_block


@pytest.mark.parametrize(
    "language,text,opener,expected",
    [
        ("python", "def f(x):\n    return x\n", ":", "function_definition"),
        ("c", "int f(void) {\n  return 1;\n}\n", "{", "function_definition"),
        ("c", "void f(int x) {\n  if (x) {\n    g();\n  } else {\n    h();\n  }\n}\n", "else {", "else_clause"),
        ("ruby", "def f(x)\n  x\nend\n", ")", "method"),
        ("ocaml", "let f x =\n  x + 1\n", "=", "value_definition"),
    ],
)
def test_statement_begun_on_row(language, text, opener, expected):
    tree = syntax.parse(language, text)
    at = syntax.byte_len(text[: text.index(opener) + len(opener)]) - 1
    row = text[: text.index(opener)].count("\n")
    node = syntax.statement_begun_on_row(tree.root_node.descendant_for_byte_range(at, at + 1), row)
    assert node is not None and node.type == expected and node.start_point.row == row
