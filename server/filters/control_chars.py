"""End the completion at the first control character (NUL, escape, ...): models emit them when lost, and an
editor would insert them into source. Tab, newline and carriage return are text."""

from __future__ import annotations

import re

from speccomplete.server.filters.context import TrimContext

CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def cut(completion: str, ctx: TrimContext) -> int | None:
    m = CONTROL.search(completion)
    return m.start() if m else None
