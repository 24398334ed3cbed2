"""server/language.py (which language a document is in) and the records it reads, speccomplete/languages.py."""

from __future__ import annotations

import re
from collections import Counter

import pytest
from tree_sitter_language_pack import get_parser

from speccomplete.languages import LANGUAGES, TEXT, language_named
from speccomplete.server.language import UNKNOWN, detect_language, header_language


@pytest.mark.parametrize(
    "path, language_id, text, expected",
    [
        ("a.py", None, "", "python"),
        ("a.txt", "python", "", "python"),  # languageId wins over the extension
        ("lib.rs", None, "", "rust"),
        ("x.HPP", None, "", "cpp"),
        ("m.ml", None, "", "ocaml"),
        ("build.zig", None, "", "zig"),
        ("mix.exs", None, "", "elixir"),
        ("Main.hs", None, "", "haskell"),
        ("init.lua", None, "", "lua"),
        ("app.ts", None, "", "typescript"),
        ("script", None, "#!/usr/bin/env python3\nprint(1)\n", "python"),
        ("script", None, "#!/usr/bin/python3.12\n", "python"),
        ("script", None, "#!/usr/bin/ruby -w\n", "ruby"),
        ("script", None, "#!/bin/sh\n", "bash"),
        ("script", None, "#!/usr/bin/env node\n", "javascript"),
        ("script", None, "#!/usr/bin/env\n", UNKNOWN),
        ("notes.xyz", "plaintext", "hello", UNKNOWN),
        ("a.py", "plaintext", "", "python"),  # an id we do not know falls back to the extension
        ("", None, "", UNKNOWN),
        ("x.cpp", "c++", "", "cpp"),
        ("App.tsx", "typescriptreact", "", "tsx"),
        ("App.jsx", "javascriptreact", "", "javascript"),
        ("run", "shellscript", "", "bash"),
        ("X.CPP", "CPP", "", "cpp"),  # ids are compared in lower case
    ],
)
def test_detect_language(path, language_id, text, expected):
    assert detect_language(path, language_id, text) == expected


C_HEADER = """#ifndef LIST_H
#define LIST_H
#include <stddef.h>

struct list { struct list *next; void *item; };  /* a class of lists */
size_t list_length(const struct list *l);
#endif
"""

CPP_HEADERS = [
    "#pragma once\n#include <vector>\nint f(std::vector<int> v);\n",
    "#pragma once\nnamespace geometry {\nstruct Point { double x, y; };\n}\n",
    "template <typename T>\nT max(T a, T b) { return a > b ? a : b; }\n",
    "class Shape {\npublic:\n  virtual ~Shape();\n};\n",
    "#include <iostream>\nvoid log(const char* s);\n",
    '#ifdef __cplusplus\nextern "C" {\n#endif\nint g(void);\n#if __cplusplus > 199711L\nconstexpr int n = 1;\n#endif\n',
]


def test_a_c_header_is_c():
    assert header_language(C_HEADER) == "c"
    assert detect_language("include/list.h", None, C_HEADER) == "c"
    assert detect_language("list.h", "cpp", C_HEADER) == "c"  # VS Code calls every .h "cpp"


@pytest.mark.parametrize("text", CPP_HEADERS)
def test_a_cpp_header_is_cpp(text):
    assert header_language(text) == "cpp"
    assert detect_language("shape.h", None, text) == "cpp"
    assert detect_language("shape.h", "c", text) == "cpp"


def test_a_non_c_language_id_on_a_header_wins():
    assert detect_language("weird.h", "python", "class A {\npublic:\n};\n") == "python"


# ---------------------------------------------------------------------------------------- the records


def test_names_are_unique_and_lookup_finds_them():
    names = [language.name for language in LANGUAGES]
    assert len(names) == len(set(names)) and TEXT.name not in names
    assert all(language_named(name).name == name for name in names)
    assert language_named(TEXT.name) is TEXT and language_named("cobol") is None


def test_language_ids_are_unique_and_lower_case():
    ids = Counter(language_id for language in LANGUAGES for language_id in language.language_ids)
    assert [i for i, n in ids.items() if n > 1] == []
    assert all(i == i.lower() for i in ids)


@pytest.mark.parametrize(
    "language_id, name",
    [("typescriptreact", "tsx"), ("javascriptreact", "javascript"), ("shellscript", "bash"), ("c++", "cpp")],
)
def test_vscode_language_ids_resolve(language_id, name):
    assert detect_language("", language_id) == name


def test_every_language_is_detected_by_its_own_id_and_extensions():
    for language in LANGUAGES:
        assert detect_language("", language.name) == language.name  # events and enabledLanguages use the name
        for language_id in language.language_ids:
            assert detect_language("", language_id) == language.name
        for ext in language.extensions:
            assert ext == ext.lower() and ext.startswith(".")
            if ext != ".h":
                assert detect_language(f"file{ext}") == language.name


def test_extensions_are_unique_except_h():
    extensions = Counter(ext for language in LANGUAGES for ext in language.extensions)
    assert {ext for ext, n in extensions.items() if n > 1} == {".h"}
    assert {language.name for language in LANGUAGES if ".h" in language.extensions} == {"c", "cpp"}


@pytest.mark.parametrize("language", LANGUAGES, ids=lambda language: language.name)
def test_the_grammar_loads(language):
    assert language.tree_sitter is not None
    tree = get_parser(language.tree_sitter).parse(b"\n")
    assert tree.root_node is not None


@pytest.mark.parametrize("language", (*LANGUAGES, TEXT), ids=lambda language: language.name)
def test_patterns_compile_and_stops_start_a_line(language):
    re.compile(language.block_opener)
    if language.header is not None:
        re.compile(language.header)
    for pattern in language.comments_and_strings:
        re.compile(pattern)
    assert all(stop.startswith("\n") and stop.strip() for stop in language.stop_strings)


def test_groups():
    groups = {
        group: [language.name for language in LANGUAGES if language.group == group]
        for group in ("high", "medium", "low")
    }
    assert groups == {
        "high": ["python", "cpp", "java", "c", "javascript", "go"],
        "medium": ["lua", "haskell", "ruby", "rust", "typescript"],
        "low": ["zig", "elixir", "ocaml"],
    }
    assert {language.name for language in LANGUAGES if language.group is None} == {"tsx", "bash"}
