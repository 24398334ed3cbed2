"""Drop trailing whitespace-only lines, and a completion that is only whitespace. Where the cursor line goes on
after the cursor (`{|}`), a multi-line completion keeps its last line break, so that the rest lands on a line
of its own."""

from __future__ import annotations

import re

from speccomplete.server.filters.context import TrimContext

TRAILING_BLANK_LINES = re.compile(r"(?:\n[ \t\r]*)+\Z")


def cut(completion: str, ctx: TrimContext) -> int | None:
    if not completion.strip():
        return 0 if completion else None
    m = TRAILING_BLANK_LINES.search(completion)
    if m is None or (ctx.rest_of_line.strip() and "\n" in completion[: m.start()]):
        return None
    return m.start()
