"""A flood of one kind of log message becomes a few lines and a count, and of error popups a few a minute
(server/log_limits.py)."""

from __future__ import annotations

import logging

from speccomplete.server.log_limits import POPUPS_PER_MINUTE, PopupLimit, RateLimit


def test_a_flood_is_cut_to_the_burst_and_counted():
    now = [0.0]
    limit = RateLimit(burst=3, window_s=60, clock=lambda: now[0])
    record = lambda msg: logging.LogRecord("x", logging.WARNING, __file__, 1, msg, ("arg",), None)  # noqa: E731
    passed = [limit.filter(record("framing error: %s")) for _ in range(100)]
    assert sum(passed) == 3
    assert limit.filter(record("another kind: %s")), "other kinds are counted apart"
    now[0] = 61.0
    later = record("framing error: %s")
    assert limit.filter(later) and "97 more like it" in later.getMessage()


def test_popups_are_limited_a_minute_and_the_same_text_for_ten_minutes():
    now = [0.0]
    limit = PopupLimit(clock=lambda: now[0])
    shown = [limit.allows(f"error {i}") for i in range(POPUPS_PER_MINUTE + 2)]
    assert shown == [True] * POPUPS_PER_MINUTE + [False] * 2
    now[0] = 61.0
    assert not limit.allows("error 0"), "the same text waits ten minutes"
    assert limit.allows("a new error"), "the minute's count starts again"
    now[0] = 601.0
    assert limit.allows("error 0")
