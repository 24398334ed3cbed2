"""tree-sitter parsing, and the two structural questions the prompt and the filters ask of a tree:
is this node a statement container, and which statement-level node begins on a row.

Grammars come from tree-sitter-language-pack 0.13.0 (bundled; 1.x downloads them at run time); each language's
grammar name is in speccomplete/languages.py.
Offsets into a tree are UTF-8 byte offsets: use `byte_len` to convert from string lengths.
"""

from __future__ import annotations

import logging
import threading
from typing import cast

from tree_sitter import Node, Parser, Tree
from tree_sitter_language_pack import SupportedLanguage, get_parser

from speccomplete.languages import language_named

log = logging.getLogger(__name__)

# Past this size a parse costs more than a keystroke can wait (docs/cpu.md, "Beside the decoder"), so documents get
# indentation rules instead.
MAX_PARSE_CHARS = 300_000

# Nodes whose children are statements or declarations, one after another (the root is one too).
CONTAINERS = frozenset(
    {
        "block",
        "Block",
        "ContainerDecl",
        "body",
        "body_statement",
        "chunk",
        "compound_statement",
        "declaration_list",
        "field_declaration_list",
        "statement_list",
        "statement_block",
        "then",
        "else",
        "do",
        "do_group",
        "declarations",
        "local_binds",
        "structure",
    }
)
CONTAINER_SUFFIXES = ("_block", "_body", "_declarations")  # do_block, class_body, class_declarations, ...

_local = threading.local()  # a Parser is not thread-safe: decodes run off the event loop


def parser(language: str) -> Parser | None:
    """The cached parser for a language, or None for "text", unknown names, or a grammar that fails to load."""
    record = language_named(language)
    grammar = record.tree_sitter if record is not None else None
    if grammar is None:
        return None
    cache = _local.__dict__.setdefault("parsers", {})
    if grammar not in cache:
        try:
            cache[grammar] = get_parser(cast(SupportedLanguage, grammar))
        except Exception:  # a broken grammar must not take the server down: fall back to indentation rules
            log.exception("tree-sitter grammar %r failed to load", grammar)
            cache[grammar] = None
    return cache[grammar]


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # lone surrogates can arrive from bad UTF-16 edits


def byte_len(text: str) -> int:
    return len(encode(text))


def parse(language: str, text: str) -> Tree | None:
    """A syntax tree, or None where there is no grammar, the text is too large, or the parse fails (logged)."""
    p = parser(language)
    if p is None:
        return None
    if len(text) > MAX_PARSE_CHARS:
        log.info("not parsing a %d-character %s document (limit %d)", len(text), language, MAX_PARSE_CHARS)
        return None
    try:
        return p.parse(encode(text))
    except Exception:
        log.exception("tree-sitter failed to parse a %s document", language)
        return None


def is_container(node: Node) -> bool:
    return node.parent is None or node.type in CONTAINERS or node.type.endswith(CONTAINER_SUFFIXES)


def statement_begun_on_row(leaf: Node, row: int) -> Node | None:
    """The largest non-container ancestor of `leaf` (inclusive) that starts on `row`: for the opener at the end of
    `def f(x):` or `int f() {` this is the whole definition, for `} else {` the else clause."""
    found = None
    node: Node | None = leaf
    while node is not None and node.start_point.row == row:
        if not is_container(node):
            found = node
        node = node.parent
    return found
