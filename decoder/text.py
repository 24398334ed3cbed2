"""Incremental detokenization with stop strings.

Decoding one token at a time breaks multi-byte characters and drops SentencePiece word-leading
spaces, so the whole generated suffix is decoded after a few prompt tokens of context each time
and the new text is the difference. Text that might still change (an incomplete UTF-8 character)
or might be the start of a stop string is held back until it is settled.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 4


class TextStream:
    def __init__(self, tokenizer, prompt_ids: list[int], stop_strings: tuple[str, ...] = (), healed: str = ""):
        """healed: prompt text the generated tokens start by writing again (decoder/healing.py): not part
        of the stream's text."""
        self.tokenizer = tokenizer
        self.context = list(prompt_ids[-CONTEXT_TOKENS:])
        self.context_text = self._decode(self.context) + healed
        self.healed = healed
        self.stop_strings = tuple(s for s in stop_strings if s)
        self.text = ""  # everything decoded so far, cut at a stop string once one is found
        self.emitted = 0  # characters of self.text handed to the caller
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def update(self, generated_ids: list[int]) -> str:
        """Re-decode after new tokens; returns the newly settled text (possibly empty)."""
        full = self._decode(self.context + generated_ids)
        if full.startswith(self.context_text):
            text = full[len(self.context_text) :]
        else:  # a decode that is not context-free (the context ends inside a character)
            text = self._decode(generated_ids).removeprefix(self.healed)
        search_from = max(0, len(self.text) - max((len(s) for s in self.stop_strings), default=0))
        self.text = text
        cut = min((i for s in self.stop_strings if (i := text.find(s, search_from)) >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped = text[:cut], True
        return self._settled()

    def _settled(self) -> str:
        end = len(self.text)
        if not self.stopped:
            while end > self.emitted and self.text[end - 1] == REPLACEMENT:
                end -= 1
            for s in self.stop_strings:  # hold back a possible start of a stop string
                for k in range(min(len(s) - 1, end - self.emitted), 0, -1):
                    if self.text[:end].endswith(s[:k]):
                        end -= k
                        break
        new = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return new

    def finish(self) -> str:
        """Everything not yet emitted; called once decoding has ended."""
        new = self.text[self.emitted :]
        self.emitted = len(self.text)
        return new
