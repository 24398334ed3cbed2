"""Requests to the server's own pipeline, run in-process (server/completion.py: prompt, decode, trim), as
`specdec replay` and `specdec quality` send them: where the user paused, the request there, and the warm-up
before anything is measured."""

from __future__ import annotations

import dataclasses
import threading
import time

from speccomplete.server.completion import Engine, Request, complete
from speccomplete.server.options import ServerOptions
from speccomplete.server.positions import utf16_len

# What the user had open before switching to the file: nothing of it is in any source file's prompt.
UNRELATED_PATH = "notes.txt"
UNRELATED_DOCUMENT = (
    "Meeting notes, Thursday\n\nAttendees: Ana, Bo, Chidi\nAgreed to move the release by one week so that the"
)


@dataclasses.dataclass(frozen=True)
class Pause:
    """One point where the user stops typing: the document so far and the cursor at its end."""

    text: str
    line: int
    character: int  # UTF-16 code units, as LSP counts

    @classmethod
    def at_end(cls, text: str) -> Pause:
        last = text[text.rfind("\n") + 1 :]
        return cls(text, text.count("\n"), utf16_len(last))


def request_at(pause: Pause, path: str, request_id: str) -> Request:
    return Request(request_id, pause.text, path, None, pause.line, pause.character, "automatic", time.perf_counter())


def warm_up(engine: Engine, options: ServerOptions) -> None:
    """One request of each kind on the unrelated document: allocators, kernels, compiled shapes."""
    for pause in (Pause.at_end(UNRELATED_DOCUMENT), Pause.at_end(UNRELATED_DOCUMENT + "\n\n")):
        complete(engine, options, request_at(pause, UNRELATED_PATH, "replay-warm-up"), threading.Event())
