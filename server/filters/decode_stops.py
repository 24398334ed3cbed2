"""Strings that end a completion while it decodes: a line end for single-line completions; for multi-line ones,
two blank lines or the start of a new top-level definition (at column 0, so nested ones do not match): each
language's are its `stop_strings` in speccomplete/languages.py."""

from __future__ import annotations

from speccomplete.languages import TEXT, language_named
from speccomplete.server.filters.context import TrimContext


def stop_strings(language: str, multiline: bool) -> tuple[str, ...]:
    if not multiline:
        return ("\n",)
    return ("\n\n\n",) + (language_named(language) or TEXT).stop_strings


def cut(completion: str, ctx: TrimContext) -> int | None:
    """The decoder stops at these already; this covers text that reached us some other way."""
    found = [i for s in stop_strings(ctx.language, ctx.multiline) if (i := completion.find(s)) >= 0]
    return min(found) if found else None
