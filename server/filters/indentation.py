"""The fallback scope rule where there is no grammar ("text", or a grammar that fails to load): a multi-line
completion ends at the first line that dedents out of the cursor's block. After a block opener (the cursor line
has text), the block ends at a line back at the cursor line's indentation; a closing line there (`}`, `end`)
is kept. On an empty line, it ends at a line indented less than the cursor."""

from __future__ import annotations

import re

from speccomplete.server.filters.context import TrimContext

CLOSING_LINE = re.compile(r"[)\]}]|(?:end|fi|done|esac)\b")


def _width(whitespace: str) -> int:
    return len(whitespace.expandtabs(4))


def cut(completion: str, ctx: TrimContext) -> int | None:
    if ctx.has_grammar or not ctx.multiline:
        return None
    base = _width(ctx.indent)
    opened = bool(ctx.line_before.strip())
    lines = completion.split("\n")
    offset = len(lines[0]) + 1
    for line in lines[1:]:
        body = line.lstrip()
        if body:
            width = _width(line[: len(line) - len(body)])
            if opened and width == base and CLOSING_LINE.match(body):
                return offset + len(line)
            if width < base or (opened and width == base):
                return offset - 1
        offset += len(line) + 1
    return None
