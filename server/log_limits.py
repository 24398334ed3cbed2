"""Log each kind of message a few times a minute, not thousands: a misbehaving client must not flood the log.

A kind is the logger and the message's format string, so "framing error: %s" is one kind whatever the
reason. Past `burst` records of a kind in a window, the rest are counted, and the first record of that
kind in a later window says how many were left out.
"""

from __future__ import annotations

import logging
import time


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
