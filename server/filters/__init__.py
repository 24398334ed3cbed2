"""Post-processing of a completion, Tabby-style: one small filter per module, each `cut(completion, ctx)`
returning where to end the completion (None: keep it all), applied in this order:

1. control_chars: a lost model's control characters; decode_stops: per-language stop strings (the decoder
   stops at them already);
2. self_repeat, phrase_repeat, suffix_repeat, rest_of_line: line filters (the model loops, across lines or
   inside one, or rewrites what follows);
3. syntax_scope, brackets: end at the close of the node begun at the cursor; keep brackets balanced;
4. indentation: the scope rule where there is no grammar; trailing_blank: drop trailing blank lines.
"""

from __future__ import annotations

from collections.abc import Callable

from speccomplete.server.filters import (
    brackets,
    control_chars,
    decode_stops,
    indentation,
    phrase_repeat,
    rest_of_line,
    self_repeat,
    suffix_repeat,
    syntax_scope,
    trailing_blank,
)
from speccomplete.server.filters.context import TrimContext
from speccomplete.server.filters.decode_stops import stop_strings

FILTERS = (
    control_chars,
    decode_stops,
    self_repeat,
    phrase_repeat,
    suffix_repeat,
    rest_of_line,
    syntax_scope,
    brackets,
    indentation,
    trailing_blank,
)
# What can end a decode early: a loop, the next existing line, or the scope closing.
EARLY_STOPS = (self_repeat, suffix_repeat, syntax_scope, indentation)
# ... and checked every round, not only when a line completes: a loop inside the line (single-line
# completions never complete a line).
EVERY_ROUND = (phrase_repeat,)

__all__ = ["TrimContext", "trim", "scope_closed", "stop_strings", "FILTERS"]


def trim(completion: str, ctx: TrimContext) -> str:
    for f in FILTERS:
        end = f.cut(completion, ctx)
        if end is not None:
            completion = completion[:end]
    return completion


def scope_closed(ctx: TrimContext) -> Callable[[str], bool]:
    """A stop predicate for the decoder (DecodeOptions.stop_when), called with all text generated so far after
    each round: True once an early-stop filter would cut the completed lines. It parses only when a new line
    has completed, so most rounds cost a string count."""
    checked = 0

    def closed(text: str) -> bool:
        nonlocal checked
        if any(f.cut(text, ctx) is not None for f in EVERY_ROUND):
            return True
        lines = text.count("\n")
        if lines == checked:
            return False
        checked = lines
        done = text[: text.rfind("\n") + 1]
        return any(f.cut(done, ctx) is not None for f in EARLY_STOPS)

    return closed
