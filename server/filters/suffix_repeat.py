"""Stop where the completion reaches the document's next existing line (Cody's "next line" rule): the model
has written the gap and is now rewriting what follows. Lines compare with their indentation, so a nested
`}` does not match the function's closing `}`."""

from __future__ import annotations

from speccomplete.server.filters.context import TrimContext


def cut(completion: str, ctx: TrimContext) -> int | None:
    following = next((line.rstrip() for line in ctx.suffix.split("\n")[1:] if line.strip()), None)
    if following is None:
        return None
    offset = 0
    for i, line in enumerate(completion.split("\n")):
        if i == 0 and not ctx.line_before.strip() and (ctx.line_before + line).rstrip() == following:
            return 0
        if i > 0 and line.rstrip() == following:
            return offset - 1  # drop the newline before it too
        offset += len(line) + 1
    return None
