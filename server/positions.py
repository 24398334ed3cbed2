"""LSP positions count UTF-16 code units; Python strings count code points."""

from __future__ import annotations

import re


class PositionError(ValueError):
    pass


_LINE_END = re.compile(r"\r\n|\r|\n")  # LSP's line terminators, and only those


def offset_at(text: str, line: int, character: int) -> int:
    """The string index of an LSP (line, character) position; raises PositionError past the end."""
    if line < 0 or character < 0:
        raise PositionError(f"negative position {line}:{character}")
    start = 0
    for counted in range(line):
        newline = _LINE_END.search(text, start)
        if newline is None:
            raise PositionError(f"line {line} is past the end of a {counted + 1}-line document")
        start = newline.end()
    found = _LINE_END.search(text, start)
    end = len(text) if found is None else found.start()
    units = 0
    for i in range(start, end):
        if units >= character:
            return i
        units += 2 if ord(text[i]) > 0xFFFF else 1
    if units >= character:
        return end
    raise PositionError(f"character {character} is past the end of line {line} ({units} UTF-16 units)")


def utf16_len(text: str) -> int:
    return sum(2 if ord(c) > 0xFFFF else 1 for c in text)
