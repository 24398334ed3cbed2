"""Stopping a completion that arrives as text pieces from an engine we do not drive token by token.

The external backends get text, not token ids, so the stop strings and the syntax predicate
(`DecodeOptions.stop_when`) are checked on the text so far, as decoder/text.py does for ours, and
`on_text` gets only settled text: never the start of what may turn out to be a stop string.
"""

from __future__ import annotations

from ..engine import DecodeOptions, FinishReason


class TextStop:
    def __init__(self, options: DecodeOptions):
        self.options = options
        self.stop_strings = tuple(s for s in options.stop_strings if s)
        self.text = ""  # cut before the first stop string once one arrives
        self.emitted = 0  # characters of `text` handed to on_text
        self.finish: FinishReason | None = None

    def add(self, piece: str) -> bool:
        """Take the next piece; True when generation should stop (then `finish` says why)."""
        if self.finish is not None:
            return True
        if self.options.cancel is not None and self.options.cancel.is_set():
            self.finish = "cancelled"
            return True
        search_from = max(0, len(self.text) - max((len(s) for s in self.stop_strings), default=0))
        self.text += piece
        cut = min((i for s in self.stop_strings if (i := self.text.find(s, search_from)) >= 0), default=-1)
        if cut >= 0:
            self.text, self.finish = self.text[:cut], "stop"
        elif piece and self.options.stop_when is not None and self.options.stop_when(self.text):
            self.finish = "predicate"
        self._emit(settled=self.finish is not None)
        return self.finish is not None

    def close(self) -> str:
        """The text once the engine has ended the stream; flushes what on_text still holds back."""
        self._emit(settled=True)
        return self.text

    def _emit(self, settled: bool) -> None:
        end = len(self.text)
        if not settled:
            for s in self.stop_strings:
                for k in range(min(len(s) - 1, end - self.emitted), 0, -1):
                    if self.text[:end].endswith(s[:k]):
                        end -= k
                        break
        if end > self.emitted and self.options.on_text:
            self.options.on_text(self.text[self.emitted : end])
        self.emitted = max(self.emitted, end)


def finish_reason(reason: str | None, options: DecodeOptions) -> FinishReason:
    """Ours, from an OpenAI-style finish_reason of a stream the engine ended itself."""
    if reason == "length":
        return "length"
    # "stop" means an end-of-text token or a stop string the engine cut at: with stop strings sent, assume the latter
    return "stop" if reason == "stop" and any(options.stop_strings) else "eos"
