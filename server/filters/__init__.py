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

# Filters whose cut ends the completion at its scope: an empty answer they make is reported as "scope".
SCOPE = (syntax_scope, indentation)

__all__ = ["TrimContext", "trim", "trim_with_cause", "scope_closed", "stop_strings", "FILTERS"]


def trim(completion: str, ctx: TrimContext) -> str:
    return trim_with_cause(completion, ctx)[0]


def trim_with_cause(completion: str, ctx: TrimContext) -> tuple[str, str | None]:
    """The trimmed completion, and what cut it to nothing ("scope", or "filter:<module>"); None if something is
    left or nothing was there."""
    emptied = None
    for f in FILTERS:
        end = f.cut(completion, ctx)
        if end is not None:
            if completion and not completion[:end]:
                emptied = "scope" if f in SCOPE else f"filter:{f.__name__.rsplit('.', 1)[-1]}"
            completion = completion[:end]
    return completion, emptied


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
