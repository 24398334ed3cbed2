"""Drop a tail that repeats the rest of the cursor's line: in `foo(|)` the model often writes `a, b)`, and the
`)` is already there; in `x = |;`, `foo();` repeats the `;`. Only where the cut leaves the brackets balanced,
and where the rest of the line has brackets only if the whole completion would unbalance them: in `foo(|)`,
`bar()` keeps its `)`."""

from __future__ import annotations

from speccomplete.server.filters import brackets
from speccomplete.server.filters.context import TrimContext


def cut(completion: str, ctx: TrimContext) -> int | None:
    rest = ctx.rest_of_line.strip()
    body = completion.rstrip()
    if not rest or not body.endswith(rest):
        return None
    end = len(body) - len(rest)
    if not brackets.balanced(completion[:end], ctx):
        return None
    if any(b in rest for b in "()[]{}") and brackets.balanced(completion, ctx):
        return None
    return end
