"""Never leave brackets unbalanced that the document had balanced: end the completion at the last line end or
closing bracket where each of (), [] and {} is as balanced as it was without the completion, or has moved
toward balance (in `foo(` the completion may close the paren). A completion cut off inside
`if (x) {...} else {` keeps the whole `if (x) {...}`. Brackets in strings and comments do not count; the lexer is
a per-language approximation (no raw strings, no nested comments), from each language's `comments_and_strings` in
speccomplete/languages.py."""

from __future__ import annotations

import functools
import re

from speccomplete.languages import TEXT, language_named
from speccomplete.server.filters.context import TrimContext

KIND = {"(": 0, ")": 0, "[": 1, "]": 1, "{": 2, "}": 2}


@functools.cache
def _lexer(language: str) -> re.Pattern:
    skipped = "|".join((language_named(language) or TEXT).comments_and_strings)
    return re.compile(rf"(?:{skipped})|([()\[\]{{}}])", re.MULTILINE)


def _brackets(text: str, language: str) -> list[tuple[int, str]]:
    return [(m.start(1), m.group(1)) for m in _lexer(language).finditer(text) if m.group(1)]


def _add(total: list[int], bracket: str):
    total[KIND[bracket]] += 1 if bracket in "([{" else -1


def _no_worse(total: list[int], original: list[int]) -> bool:
    return all(min(0, o) <= t <= max(0, o) for t, o in zip(total, original))


def _scan(completion: str, ctx: TrimContext) -> tuple[list[int], list[tuple[int, str]]]:
    """The document's own bracket balance, and the completion's brackets (offsets into the completion)."""
    original = [0, 0, 0]
    for _, bracket in _brackets(ctx.prefix + ctx.suffix, ctx.language):
        _add(original, bracket)
    start = len(ctx.prefix)
    return original, [(pos - start, b) for pos, b in _brackets(ctx.prefix + completion, ctx.language) if pos >= start]


def balanced(completion: str, ctx: TrimContext) -> bool:
    original, events = _scan(completion, ctx)
    total = list(original)
    for _, bracket in events:
        _add(total, bracket)
    return _no_worse(total, original)


def cut(completion: str, ctx: TrimContext) -> int | None:
    original, events = _scan(completion, ctx)
    total, best, e = list(original), 0, 0
    ends = {i for i, ch in enumerate(completion) if ch == "\n"} | {pos + 1 for pos, b in events if b in ")]}"}
    for end in sorted(ends | {len(completion)}):
        while e < len(events) and events[e][0] < end:
            _add(total, events[e][1])
            e += 1
        if _no_worse(total, original):
            best = end
    return None if best == len(completion) else best
