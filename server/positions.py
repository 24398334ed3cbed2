"""LSP positions count UTF-16 code units; Python strings count code points."""

from __future__ import annotations


class PositionError(ValueError):
    pass


def offset_at(text: str, line: int, character: int) -> int:
    """The string index of an LSP (line, character) position; raises PositionError past the end."""
    if line < 0 or character < 0:
        raise PositionError(f"negative position {line}:{character}")
    start = 0
    for _ in range(line):
        newline = text.find("\n", start)
        if newline < 0:
            raise PositionError(f"line {line} is past the end of a {text.count(chr(10)) + 1}-line document")
        start = newline + 1
    end = text.find("\n", start)
    end = len(text) if end < 0 else end
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
