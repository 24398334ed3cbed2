"""Stop where the completion repeats itself: a line three times in a row, or a block of lines twice.
Small models loop; a line twice in a row is common in real code, so it takes three."""

from __future__ import annotations

from speccomplete.server.filters.context import TrimContext


def cut(completion: str, ctx: TrimContext) -> int | None:
    lines = [line.rstrip() for line in completion.split("\n")]
    lines[0] = (ctx.line_before + lines[0]).rstrip()  # compare whole lines, with indentation
    starts = [0]
    for line in completion.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    for i, line in enumerate(lines):
        if line.strip() and lines[i + 1 : i + 3] == [line, line]:
            return starts[i + 1] - 1
        for size in range(2, (len(lines) - i) // 2 + 1):
            block = lines[i : i + size]
            if lines[i + size] == line and lines[i + size : i + 2 * size] == block and any(s.strip() for s in block):
                return starts[i + size] - 1
    return None
