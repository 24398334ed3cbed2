"""Context from beyond the prompt's window, in one block before it:

- definitions from this file that the lines above the cursor name but the prompt left out (their
  signatures: a call's arguments are what the model most often has to guess);
- windows of other open documents in the same language most like those lines (an editor's other
  tabs, as Copilot's neighbouring tabs and Tabby's snippets from other files use them).

Each piece sits under a comment line saying where it is from, its lines commented out with the
language's line comment (speccomplete/languages.py), so the prompt still reads as one file.

The block is the start of the model's input, so it must not move while the user types: the decoder
reuses its cached prefix only up to the first changed token (server/prompt.py, on pages). The pieces
are chosen by the QUERY_LINES lines above the cursor's row rounded down to a multiple of
QUERY_STRIDE: typing on a line never changes them, and starting new lines changes them at most
every QUERY_STRIDE rows.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass

from tree_sitter import Node, Tree

from speccomplete.languages import language_named

from . import syntax
from .language import detect_language

# The contextBudgetChars default (server/options.py): off. With 500 characters (about 140 tokens) the
# default target's next lines were no better on dev and held-out cases with 3 open neighbours each
# (similarity +0.004 and +0.011, both inside their noise; docs/quality.md), and cold prompts were longer.
DEFAULT_CONTEXT_CHARS = 0
QUERY_LINES = 24  # the lines above the cursor the pieces are chosen by
QUERY_STRIDE = 4  # ...ending at a row that is a multiple of this: the block changes at most this often
WINDOW_LINES = 20  # an open document's windows, every WINDOW_LINES // 2 lines
MIN_SNIPPET_LINES = 4  # a window cut to the budget must keep this many
MIN_SIMILARITY = 0.15  # Jaccard of the identifiers below which a window is not worth its tokens
MAX_DOCUMENTS = 10  # open documents looked at, the most recently used first
MAX_DOCUMENT_CHARS = 200_000  # larger open documents are skipped (generated or minified)
SIGNATURE_CHARS = 200  # a definition's signature at most
DEFINITION_TYPES = re.compile(r"(definition|declaration|item|method|signature|function)$")

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# words too common to say what code is about
COMMON = frozenset(
    "if else for while return def class self this true false null none None True False var let const int "
    "void new in is not and or import from end do then fn pub function".split()
)


@dataclass(frozen=True)
class OpenDocument:
    """Another document the editor has open: where it is, and its text."""

    path: str
    text: str


def context_block(
    text: str,
    offset: int,
    language: str,
    tree: Tree | None,
    prompt_text: str,
    documents: tuple[OpenDocument, ...],
    budget: int,
) -> str:
    """The block to put before the prompt, within `budget` characters; "" when nothing is worth it.
    `prompt_text`: the prompt's prefix and suffix, whose lines need no repeating."""
    known = language_named(language)
    opener, closer = known.line_comment if known is not None else ("", "")
    if budget <= 0 or not opener:
        return ""
    lines = text.split("\n")
    query_rows = _query_rows(text, offset)
    query = _identifiers("\n".join(lines[query_rows.start : query_rows.stop]))
    if not query:
        return ""

    def commented(lines: list[str]) -> str:
        return "".join(f"{opener} {line}{closer}\n" if line.strip() else f"{opener}\n" for line in lines)

    pieces: list[str] = []
    used = 0
    signatures = []
    if tree is not None:
        signatures = _missing_signatures(tree, lines, text, offset, query_rows, query, prompt_text)
    while signatures and len(commented(["Definitions used below, from this file:", *signatures])) > budget:
        signatures.pop()  # the file's last first: nearer the cursor, more likely in the prompt already
    if signatures:
        pieces.append(commented(["Definitions used below, from this file:", *signatures]))
        used += len(pieces[-1])
    for path, lines in _similar_windows(documents, language, query):
        header = f"Compare this snippet from {_short(path)}:"
        while lines and used + len(commented([header, *lines])) > budget:
            lines = lines[:-1]  # a window cut to what is left, from its end
        if len(lines) >= MIN_SNIPPET_LINES:
            pieces.append(commented([header, *lines]))
            used += len(pieces[-1])
    return "".join(pieces)


def _query_rows(text: str, offset: int) -> range:
    """The QUERY_LINES rows above the cursor's row, ending at a multiple of QUERY_STRIDE."""
    row = text.count("\n", 0, offset)
    end = row - row % QUERY_STRIDE
    return range(max(0, end - QUERY_LINES), end)


def _identifiers(text: str) -> frozenset[str]:
    return frozenset(w for w in IDENTIFIER.findall(text) if len(w) > 1 and w not in COMMON)


# --------------------------------------------------------------------------- this file


def _missing_signatures(
    tree: Tree, lines: list[str], text: str, offset: int, query_rows: range, query: frozenset[str], prompt_text: str
) -> list[str]:
    """Signatures of definitions whose name the query holds, not enclosing the cursor nor begun in the
    query's rows (where their own line names them), whose first line the prompt does not hold; in the
    file's order. Looks at statements only, not inside expressions."""
    source = tree.root_node.text or b""
    byte = syntax.byte_len(text[:offset])
    found: list[str] = []
    stack = list(reversed(tree.root_node.named_children))
    while stack:
        node = stack.pop()
        definition = _is_definition(node)
        encloses = node.start_byte <= byte <= node.end_byte
        if definition and not encloses and node.start_point.row not in query_rows and _name(node) in query:
            first_line = lines[node.start_point.row].strip()
            if first_line and first_line not in prompt_text:
                found.append(_signature(node, source))
        if definition or syntax.is_container(node):
            stack.extend(reversed(node.named_children))
    return found


def _is_definition(node: Node) -> bool:
    return bool(DEFINITION_TYPES.search(node.type)) and node.parent is not None


def _name(node: Node) -> str | None:
    """The defined name: the `name` field, the end of a chain of `declarator` fields (C, C++), or the
    `pattern` of a binding (OCaml's `let`); on the node or its first named child."""
    for holder in (node, node.named_children[0] if node.named_child_count else None):
        if holder is None:
            continue
        named = holder.child_by_field_name("name")
        pattern = holder.child_by_field_name("pattern")
        if named is None and pattern is not None and pattern.type.endswith(("name", "identifier")):
            named = pattern  # `let f x = ...`, not `let (a, b) = ...`
        if named is not None:  # `M.f` (Lua) is named by its last part, as a call to it is
            words = IDENTIFIER.findall((named.text or b"").decode(errors="replace"))
            return words[-1] if words else None
        declarator = holder.child_by_field_name("declarator")
        while declarator is not None:
            if declarator.type in ("identifier", "field_identifier", "type_identifier"):
                return (declarator.text or b"").decode(errors="replace")
            declarator = declarator.child_by_field_name("declarator") or declarator.child_by_field_name("name")
    return None


def _signature(node: Node, source: bytes) -> str:
    """The definition up to its body, on one line; its first line where it has no body."""
    body = node.child_by_field_name("body")
    end = body.start_byte if body is not None and body.start_byte > node.start_byte else node.end_byte
    head = source[node.start_byte : end].decode(errors="replace")
    if body is None:
        head = head.split("\n", 1)[0]
    head = " ".join(head.split()).rstrip("{ ")
    return head if len(head) <= SIGNATURE_CHARS else head[:SIGNATURE_CHARS] + " ..."


# --------------------------------------------------------------------------- other documents

# a document's windows and their identifiers, by its text: open documents are scored on every request
_windows: OrderedDict[tuple[str, int], list[tuple[list[str], frozenset[str]]]] = OrderedDict()
_windows_lock = threading.Lock()  # the server's lanes complete on threads of their own


def _similar_windows(
    documents: tuple[OpenDocument, ...], language: str, query: frozenset[str]
) -> list[tuple[str, list[str]]]:
    """The best window of each open document in `language` at or above MIN_SIMILARITY, best first."""
    best: list[tuple[float, str, list[str]]] = []
    for document in documents[:MAX_DOCUMENTS]:
        if len(document.text) > MAX_DOCUMENT_CHARS or detect_language(document.path, None, document.text) != language:
            continue
        scored = [
            (len(query & words) / len(query | words), lines) for lines, words in _document_windows(document) if words
        ]
        if scored:
            score, lines = max(scored, key=lambda s: s[0])
            if score >= MIN_SIMILARITY:
                best.append((score, document.path, lines))
    best.sort(key=lambda b: -b[0])
    return [(path, _trim_blank(lines)) for _, path, lines in best]


def _document_windows(document: OpenDocument) -> list[tuple[list[str], frozenset[str]]]:
    key = (document.path, hash(document.text))
    with _windows_lock:
        if key in _windows:
            _windows.move_to_end(key)
            return _windows[key]
    lines = document.text.split("\n")
    step = WINDOW_LINES // 2
    windows = [
        (lines[start : start + WINDOW_LINES], _identifiers("\n".join(lines[start : start + WINDOW_LINES])))
        for start in range(0, max(1, len(lines) - step), step)
    ]
    with _windows_lock:
        _windows[key] = windows
        while len(_windows) > 2 * MAX_DOCUMENTS:
            _windows.popitem(last=False)
    return windows


def _trim_blank(lines: list[str]) -> list[str]:
    start, end = 0, len(lines)
    while start < end and not lines[start].strip():
        start += 1
    while end > start and not lines[end - 1].strip():
        end -= 1
    return [line.rstrip() for line in lines[start:end]]


def _short(path: str) -> str:
    """The last two parts of a path: where it is, without the user's home."""
    return "/".join(path.replace("\\", "/").rstrip("/").split("/")[-2:])
