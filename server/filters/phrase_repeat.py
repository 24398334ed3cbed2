"""Stop where a line repeats a phrase back to back: `a & b.c? & b.c? & b.c?`, `the the the`. Small models
loop inside a line too, and a single-line completion has no second line for self_repeat to see.

A phrase is 4 to 60 characters holding at least two letters, seen three times in a row; the completion
ends after its first time, at the next space if one comes before the phrase's second end (where a loop
starts mid-word, so that the kept words stay whole). Phrases of digits and punctuation (`0, 0, `, `== `)
are left alone: data and rulers repeat them on purpose. The cursor line's text before the cursor
counts, so a loop that began before the cursor is caught too (the completion is then empty).

A loop can also alternate: `a.starts(x) and a.ends(x) and a.ends(x) and a.starts(x) and ...`. A line whose
clauses (between `and`, `or`, `&&`, `||`, `&`, `|` or commas) of at least 6 characters and two letters repeat
earlier ones twice or more ends before the first repeat."""

from __future__ import annotations

import re

from speccomplete.server.filters.context import TrimContext

# every start of a phrase repeated three times (a lookahead, so overlapping candidates are all seen)
REPEATED = re.compile(r"(?=(.{4,60}?)\1\1)")
LETTER = re.compile(r"[^\W\d]")
SPACE = re.compile(r"\s")


SEPARATOR = re.compile(r"\s+(?:and|or|&&|\|\||&|\|)\s+|,\s*")


def cut(completion: str, ctx: TrimContext) -> int | None:
    before = ctx.line_before
    line_start = -len(before)  # offsets into the completion; the first line starts in the prefix
    for line in (before + completion).split("\n"):
        end = _repeated_phrase(line)
        end = _repeated_clauses(line) if end is None else end
        if end is not None:
            return max(0, line_start + end)
        line_start += len(line) + 1
    return None


def _repeated_phrase(line: str) -> int | None:
    for match in REPEATED.finditer(line):
        phrase = match.group(1)
        if len(LETTER.findall(phrase)) >= 2:
            end = match.start() + len(phrase)
            space = SPACE.search(line, end, end + len(phrase))
            return space.start() if space else end
    return None


def _repeated_clauses(line: str) -> int | None:
    """Where the first clause repeating an earlier one begins (its separator), if two or more repeat."""
    seen: set[str] = set()
    first_repeat, repeats, start, separator_start = None, 0, 0, 0
    for separator in [*SEPARATOR.finditer(line), None]:
        clause = line[start : separator.start() if separator else len(line)].strip()
        if len(clause) >= 6 and len(LETTER.findall(clause)) >= 2:
            if clause in seen:
                repeats += 1
                first_repeat = separator_start if first_repeat is None else first_repeat
            seen.add(clause)
        if separator is not None:
            separator_start, start = separator.start(), separator.end()
    return first_repeat if repeats >= 2 else None
