"""Log each kind of message a few times a minute, not thousands, and show the user fewer still: a misbehaving
client must not flood the log, nor a failing backend the editor.

Log records: a kind is the logger and the message's format string, so "framing error: %s" is one kind
whatever the reason. Past `burst` records of a kind in a window, the rest are counted, and the first record
of that kind in a later window says how many were left out.

Error popups (`PopupLimit`): at most POPUPS_PER_MINUTE, and the same text at most once in ten minutes (a
failing backend fails every completion alike). The log has every one.
"""

from __future__ import annotations

import logging
import time
from collections import deque

POPUPS_PER_MINUTE = 3  # a client sending bad settings in a loop must not bury the editor in popups
SAME_POPUP_AFTER_S = 600.0


class RateLimit(logging.Filter):
    def __init__(self, burst: int = 5, window_s: float = 60.0, clock=time.monotonic):
        super().__init__()
        self.burst, self.window_s, self.clock = burst, window_s, clock
        self.windows: dict[tuple[str, str], tuple[float, int]] = {}  # kind -> (window start, records seen)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, str(record.msg))
        now = self.clock()
        start, seen = self.windows.get(kind, (now, 0))
        if now - start >= self.window_s:
            if seen > self.burst:
                record.msg = f"{record.msg} [and {seen - self.burst} more like it in the last {now - start:.0f} s]"
            start, seen = now, 0
        self.windows[kind] = (start, seen + 1)
        return seen < self.burst


def limit_logging(burst: int = 5, window_s: float = 60.0) -> None:
    """Rate-limit every handler of the root logger (call after logging is configured)."""
    limit = RateLimit(burst, window_s)
    for handler in logging.getLogger().handlers:
        handler.addFilter(limit)
    # pygls logs every message whole at INFO: with -v the log would hold each document's text, each keystroke
    logging.getLogger("pygls.protocol.json_rpc").setLevel(logging.WARNING)


class PopupLimit:
    """At most POPUPS_PER_MINUTE error popups a minute, and the same text once in SAME_POPUP_AFTER_S."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.shown: deque[float] = deque()  # when popups were shown, within the last minute
        self.last_shown: dict[str, float] = {}  # popup text -> when it was last shown

    def allows(self, message: str) -> bool:
        """Whether `message` may be shown now; if so, it counts as shown."""
        now = self.clock()
        while self.shown and now - self.shown[0] > 60:
            self.shown.popleft()
        repeated = now - self.last_shown.get(message, -SAME_POPUP_AFTER_S) < SAME_POPUP_AFTER_S
        if len(self.shown) >= POPUPS_PER_MINUTE or repeated:
            return False
        self.shown.append(now)
        self.last_shown[message] = now
        return True
