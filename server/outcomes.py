"""What became of each shown completion: accepted, typed along (partial) or rejected, recorded in its event.

One completion per document is shown at a time. The next request in that document settles it: if the user
has typed a prefix of it since, the rest of it is served again (`typed_along`, then completion.py's
`reuse`); otherwise it was rejected. A completion nobody accepts within `reject_after_s` is rejected too.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from speccomplete.telemetry.events import Outcome
from speccomplete.telemetry.log import EventLog

from .completion import Completion, Request
from .positions import PositionError, offset_at

SUPERSEDED_KEPT = 32  # superseded completions an accept may still name


@dataclass
class Shown:
    """The latest completion shown in a document, until the user accepts it or moves on."""

    key: str  # the document's (documents.document_key)
    request_id: str
    prefix: str  # the document before the cursor when it was requested
    suffix: str  # and after it
    completion: Completion
    tracked: bool  # whether its outcome is recorded (options.track_outcomes)
    outcome: Outcome | None = None  # the verdict recorded so far
    timer: asyncio.TimerHandle | None = None  # records "rejected" when nothing happens in time


def typed_along(previous_prefix: str, previous_suffix: str, completion: str, text: str, offset: int) -> str | None:
    """The rest of an earlier completion if the user has typed a prefix of it since, else None.

    The document must be the earlier one with some of the completion typed at the cursor: same
    text before the old cursor, same text after the cursor.
    """
    prefix = text[:offset]
    if not prefix.startswith(previous_prefix) or text[offset:] != previous_suffix:
        return None
    typed = prefix[len(previous_prefix) :]
    if not typed or len(typed) >= len(completion) or not completion.startswith(typed):
        return None
    return completion[len(typed) :]


class Outcomes:
    """The shown completions by document key, and the verdicts on them."""

    def __init__(self, events: Callable[[], EventLog | None]):
        self.events = events  # the server's current event log (settings may replace it)
        self.shown: dict[str, Shown] = {}  # by document key
        # completions another request superseded lately, by request id: an accept can still be on its way
        # (the other lane, or the client's own next request, replaced it a moment before the user took it)
        self.superseded: dict[str, Shown] = {}
        self.verdicts: deque[bool] = deque(maxlen=100)  # accepted (or typed along) vs rejected
        # by document key: the document around the cursor once a block's first lines were accepted there
        # (Completion.more), so the next request there asks for the block's next lines
        self.accepted_blocks: dict[str, tuple[str, str]] = {}

    def settle(self, key: str, request: Request) -> tuple[Completion, str] | None:
        """Resolve the document's previous completion as typed along or rejected. If typed along: that
        completion and what is left of it, for the request to serve."""
        previous = self.shown.get(key)
        if previous is None:
            return None
        rest = None
        try:
            offset = offset_at(request.text, request.line, request.character)
            rest = typed_along(previous.prefix, previous.suffix, previous.completion.text, request.text, offset)
        except PositionError:
            pass
        if rest is None:
            self.resolve(self.shown.pop(key), "rejected")
            return None
        # kept: the reuse serves the rest of it
        self.resolve(previous, "partial", len(previous.completion.text) - len(rest))
        return previous.completion, rest

    def show(self, key: str, request: Request, result: Completion, tracked: bool, reject_after_s: float) -> None:
        """`result` is shown in the document: track it until a verdict."""
        offset = offset_at(request.text, request.line, request.character)
        shown = Shown(key, result.event.request_id, request.text[:offset], request.text[offset:], result, tracked)
        if shown.tracked:
            shown.timer = asyncio.get_running_loop().call_later(reject_after_s, self.resolve, shown, "rejected")
        self.shown[key] = shown

    def accept(self, request_id: str) -> bool:
        """The user accepted the completion `request_id`. False if it is unknown."""
        for key, shown in self.shown.items():
            if shown.request_id == request_id:
                del self.shown[key]
                self.accepted(shown)
                return True
        late = self.superseded.pop(request_id, None)
        if late is not None:  # replaced a moment before the user took it: the accept overrides that verdict
            self.accepted(late)
            return True
        return False

    def accepted(self, shown: Shown) -> None:
        self.resolve(shown, "accepted", len(shown.completion.text))
        completion = shown.completion
        if completion.more and not completion.replaces:
            self.accepted_blocks[shown.key] = (shown.prefix + completion.text, shown.suffix)

    def continues_block(self, key: str, request: Request) -> bool:
        """Whether `request` is where the user accepted a block's first lines (and nothing changed since):
        it asks for the block's next lines. Asked once per request; any other request forgets the block."""
        accepted = self.accepted_blocks.pop(key, None)
        if accepted is None:
            return False
        try:
            offset = offset_at(request.text, request.line, request.character)
        except PositionError:
            return False
        return accepted == (request.text[:offset], request.text[offset:])

    def reject(self, key: str) -> None:
        """The document closed: its completion was not accepted."""
        self.accepted_blocks.pop(key, None)
        shown = self.shown.pop(key, None)
        if shown is not None:
            self.resolve(shown, "rejected")

    def end_session(self) -> None:
        """The client left: its completions were not accepted, and the next client cannot accept them."""
        for shown in self.shown.values():
            self.resolve(shown, "rejected")
        self.shown.clear()
        self.superseded.clear()
        self.accepted_blocks.clear()

    def resolve(self, shown: Shown, outcome: Outcome, accepted_chars: int | None = None) -> None:
        """Record the user's verdict on a shown completion (a later verdict overrides an earlier one)."""
        if outcome in ("rejected", "partial"):
            self.superseded[shown.request_id] = shown
            while len(self.superseded) > SUPERSEDED_KEPT:
                del self.superseded[next(iter(self.superseded))]  # the oldest
        if shown.timer is not None:
            shown.timer.cancel()
            shown.timer = None
        if not shown.tracked or shown.outcome == outcome:
            return
        shown.outcome = outcome
        events = self.events()
        assert events is not None  # configure() makes it at initialize, before any completion
        events.update_outcome(shown.request_id, outcome, accepted_chars)
        self.verdicts.append(outcome != "rejected")
