"""Closing brackets and quotes right after the cursor, which the completion may retype.

Editors close brackets and quotes as they are typed (VS Code by default, Neovim with an auto-pairs
plugin), so `println!(` becomes `println!(█)` before the user pauses. The answer the user wants runs
past that `)`: `name);`. As Copilot does, the server prompts as if the closers were not there and
lets the completion replace them: the item's range covers them, and they must come back, in order,
in the completion's first line (a subsequence of it, so the editor can draw the ghost text around
the existing characters). A completion that does not retype them is trimmed against the real
document instead and inserted before them.
"""

from __future__ import annotations

CLOSERS = ")]}\"'`"


def closers_after(text: str, offset: int) -> str:
    """The closing brackets and quotes from the cursor to the end of its line, if that is all the line
    holds after the cursor (trailing spaces aside, which stay); "" otherwise."""
    end = text.find("\n", offset)
    rest = (text[offset:] if end < 0 else text[offset:end]).rstrip(" \t\r")
    return rest if rest and all(ch in CLOSERS for ch in rest) else ""


def retypes(completion: str, closers: str) -> bool:
    """Whether the completion's first line holds the closers in order (what replacing them keeps)."""
    first_line = iter(completion.split("\n", 1)[0])
    return all(ch in first_line for ch in closers)
