"""Which language a document is in: LSP languageId first, then the file extension, then the shebang.

The names, ids, extensions and interpreters come from speccomplete/languages.py. A file we cannot place is
"text": it still gets completions, with indentation rules instead of syntax.

`.h` is both C's and C++'s. As GitHub's linguist does, the header's content decides: C++ constructs make it C++,
anything else is C. Editors only guess from the extension too (VS Code opens every `.h` as "cpp"), so a C or C++
languageId on a `.h` file is decided by content as well.
"""

from __future__ import annotations

import os
import re

from speccomplete.languages import LANGUAGES, TEXT

UNKNOWN = TEXT.name
AMBIGUOUS_HEADER = ".h"

_BY_LANGUAGE_ID = {language_id: language.name for language in LANGUAGES for language_id in language.language_ids}
_BY_EXTENSION = {ext: language.name for language in LANGUAGES for ext in language.extensions if ext != AMBIGUOUS_HEADER}
_BY_INTERPRETER = {program: language.name for language in LANGUAGES for program in language.interpreters}

# Constructs C does not have (after linguist's rule for `.h`): an extensionless standard header (<vector>, <cstdio>;
# C's all end in .h), templates, exceptions, constexpr, classes and namespaces, access specifiers, a __cplusplus
# version test, and the std namespace.
_CPP_HEADER_LINES = (
    r"^\s*#\s*include\s*<[\w/]+>",
    r"^\s*template\s*<",
    r"^[ \t]*(?:try|constexpr)\b",
    r"^[ \t]*catch\s*\(",
    r"^[ \t]*(?:class|(?:using[ \t]+)?namespace)\s+\w+",
    r"^[ \t]*(?:private|public|protected):\s*$",
    r"__has_cpp_attribute|__cplusplus\s*>",
    r"\bstd::\w+",
)
_CPP_HEADER = re.compile("|".join(_CPP_HEADER_LINES), re.MULTILINE)


def header_language(text: str) -> str:
    """The language of a `.h` file: "cpp" where it has C++ constructs, else "c"."""
    return "cpp" if _CPP_HEADER.search(text) else "c"


def detect_language(path: str = "", language_id: str | None = None, text: str = "") -> str:
    ext = os.path.splitext(path)[1].lower()
    if language_id:
        name = _BY_LANGUAGE_ID.get(language_id.lower())
        if name in ("c", "cpp") and ext == AMBIGUOUS_HEADER:
            return header_language(text)
        if name is not None:
            return name
    if ext == AMBIGUOUS_HEADER:
        return header_language(text)
    if ext in _BY_EXTENSION:
        return _BY_EXTENSION[ext]
    if text.startswith("#!"):
        return _shebang_language(text[2 : text.find("\n") if "\n" in text else None].split())
    return UNKNOWN


def _shebang_language(words: list[str]) -> str:
    """`#!/usr/bin/env python3 -u` or `#!/bin/sh`: the interpreter's language, a version suffix allowed."""
    if not words:
        return UNKNOWN
    program = os.path.basename(words[1] if os.path.basename(words[0]) == "env" and len(words) > 1 else words[0])
    for interpreter, name in _BY_INTERPRETER.items():
        version = program.removeprefix(interpreter)
        if program == interpreter or version != program and version.replace(".", "").isdigit():
            return name
    return UNKNOWN
