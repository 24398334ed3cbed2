"""How long an automatic request waits for more typing before it decodes.

A decode started between two keys is cancelled by the second: it cost its first prefill (START_S core-seconds:
that step runs on every thread and does not stop halfway) and the time from its start to that key. So the
wait is the shortest, at least `debounceMs` and at most CEILING times it, at which the decodes that this
typist's recent gaps between keys would have started cost at most BUDGET of a core. A decode in a pause
between words (WORD_PAUSE median gaps or more) serves that pause and is not counted. Until LEAST gaps are
known the wait is `debounceMs`; a gap of PAUSE_S or more is a pause, not typing, and does not count. A
regular typist's wait lies just past their longest usual gaps; an uneven typist's further out
(docs/reliability.md, "The wait after the last key").
"""

from __future__ import annotations

import statistics
import time
from collections import deque

BUDGET = 0.03  # of a core: what decodes between keys may cost (typing itself takes about 0.02)
START_S = 0.02  # core-seconds: what a decode costs before it can stop
CEILING = 3  # the wait is at most this many floors
RECENT = 20  # gaps and decodes kept
LEAST = 5  # gaps seen before the pace counts
PAUSE_S = 1.0  # a longer gap is a pause
WORD_PAUSE = 2  # a gap this many median gaps long is a pause between words: a decode there serves it
DECODE_S = 0.1  # seconds a decode runs to its answer, until one has been timed
STEP_MS = 5  # the waits tried, from the floor up


class Debounce:
    def __init__(self) -> None:
        self.last: float | None = None  # when the last key came (time.monotonic())
        self.gaps: deque[float] = deque(maxlen=RECENT)  # seconds between keys, pauses left out
        self.decodes: deque[float] = deque(maxlen=RECENT)  # seconds from a decode's start to its answer

    def key(self, now: float | None = None) -> None:
        """A key came (a change to a document)."""
        now = time.monotonic() if now is None else now
        if self.last is not None and now - self.last < PAUSE_S:
            self.gaps.append(now - self.last)
        self.last = now

    def decoded(self, seconds: float) -> None:
        """A decode ran to its answer in `seconds`."""
        self.decodes.append(seconds)

    def typing_share(self, wait_s: float) -> float:
        """The share of a core that decodes started `wait_s` after a key would have spent between keys, over
        the recent gaps (pauses between words left out)."""
        return self._typing_share(wait_s, *self._pace())

    def wait_ms(self, floor_ms: float) -> float:
        """The debounce for the next automatic request, given the `debounceMs` floor (0: none)."""
        if not floor_ms or len(self.gaps) < LEAST:
            return floor_ms
        ceiling_ms, pace = CEILING * floor_ms, self._pace()
        wait_ms = floor_ms
        while wait_ms < ceiling_ms and self._typing_share(wait_ms / 1000, *pace) > BUDGET:
            wait_ms += STEP_MS
        return min(wait_ms, ceiling_ms)

    def _pace(self) -> tuple[float, float]:
        """What a decode costs, and the shortest gap that is a pause between words."""
        decode_s = statistics.median(self.decodes) if self.decodes else DECODE_S
        return decode_s, WORD_PAUSE * statistics.median(self.gaps)

    def _typing_share(self, wait_s: float, decode_s: float, word_pause_s: float) -> float:
        spent = sum(min(gap - wait_s + START_S, decode_s) for gap in self.gaps if wait_s < gap < word_pause_s)
        return spent / sum(self.gaps)
