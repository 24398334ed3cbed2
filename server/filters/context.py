"""What the trimming filters know about a completion's place in the document."""

from __future__ import annotations

from dataclasses import dataclass

from speccomplete.server import syntax
from speccomplete.server.prompt import Prompt


@dataclass(frozen=True)
class TrimContext:
    language: str
    prefix: str  # the text before the cursor (the prompt's: bounded, so a parse of it stays cheap)
    suffix: str  # the text after the cursor
    multiline: bool
    indent: str  # the cursor line's indentation

    @classmethod
    def from_prompt(cls, prompt: Prompt) -> TrimContext:
        return cls(prompt.language, prompt.prefix, prompt.suffix, prompt.multiline, prompt.indent)

    @property
    def line_before(self) -> str:
        """The cursor line up to the cursor."""
        return self.prefix[self.prefix.rfind("\n") + 1 :]

    @property
    def rest_of_line(self) -> str:
        """The cursor line after the cursor."""
        end = self.suffix.find("\n")
        return self.suffix if end < 0 else self.suffix[:end]

    @property
    def has_grammar(self) -> bool:
        return syntax.parser(self.language) is not None
