"""How long an automatic request waits for more typing before it decodes: at least `debounceMs`, longer for
a slower typist. A decode started between two keys is cancelled by the second, so a debounce shorter than the
user's own gap between keys spends CPU for nothing (docs/reliability.md, "Pauses as a typist makes them"). The
wait is PACE times the median of the recent gaps between keys, between the floor and CEILING times it; a gap of
a second or more is a pause, not typing, and does not count.
"""

from __future__ import annotations

import statistics
import time
from collections import deque

PACE = 1.5  # the wait, in gaps between keys: a key usually comes within it
CEILING = 3  # the wait is at most this many floors
RECENT = 20  # gaps kept
LEAST = 5  # gaps seen before the pace counts
PAUSE_S = 1.0  # a longer gap is a pause


class Debounce:
    def __init__(self) -> None:
        self.last: float | None = None  # when the last key came (time.monotonic())
        self.gaps: deque[float] = deque(maxlen=RECENT)  # seconds between keys, pauses left out

    def key(self, now: float | None = None) -> None:
        """A key came (a change to a document)."""
        now = time.monotonic() if now is None else now
        if self.last is not None and now - self.last < PAUSE_S:
            self.gaps.append(now - self.last)
        self.last = now

    def wait_ms(self, floor_ms: float) -> float:
        """The debounce for the next automatic request, given the `debounceMs` floor (0: none)."""
        if len(self.gaps) < LEAST:
            return floor_ms
        return max(floor_ms, min(PACE * statistics.median(self.gaps) * 1000, CEILING * floor_ms))
