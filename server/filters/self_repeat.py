"""Stop where the completion repeats itself: a line three times in a row, a block of lines twice, or a block
three times in a row that differs only in its numbers (`if (args[0] ...`, `if (args[1] ...`, ...). Small models
loop; a line twice in a row is common in real code, so it takes three, and numbered blocks (enumerations) three.
The first time stays."""

from __future__ import annotations

import re

from speccomplete.server.filters.context import TrimContext

NUMBER = re.compile(r"\d+")


def cut(completion: str, ctx: TrimContext) -> int | None:
    lines = [line.rstrip() for line in completion.split("\n")]
    lines[0] = (ctx.line_before + lines[0]).rstrip()  # compare whole lines, with indentation
    shapes = [NUMBER.sub("0", line) for line in lines]
    starts = [0]
    for line in completion.split("\n"):
        starts.append(starts[-1] + len(line) + 1)
    for i, line in enumerate(lines):
        if line.strip() and lines[i + 1 : i + 3] == [line, line]:
            return starts[i + 1] - 1
        for size in range(2, (len(lines) - i) // 2 + 1):
            block = lines[i : i + size]
            if not any(s.strip() for s in block):
                continue
            if lines[i + size] == line and lines[i + size : i + 2 * size] == block:
                return starts[i + size] - 1
            if _numbered_thrice(shapes, i, size):
                # the loop is seen from its earliest line, which may be a block's middle (a closing brace):
                # end at the last rotation that still repeats, so the block kept is whole
                last = max(j for j in range(i, i + size) if _numbered_thrice(shapes, j, size))
                return starts[last + size] - 1
    return None


def _numbered_thrice(shapes: list[str], i: int, size: int) -> bool:
    shape = shapes[i : i + size]
    return len(shape) == size and shapes[i + size : i + 2 * size] == shape == shapes[i + 2 * size : i + 3 * size]
