"""The debounce follows the typist's pace (server/debounce.py): the floor for a fast typist, longer for a slow
one, pauses left out, never past its ceiling."""

from __future__ import annotations

import pytest

from speccomplete.server.debounce import CEILING, LEAST, Debounce


def typed(gaps: list[float]) -> Debounce:
    debounce, now = Debounce(), 100.0
    debounce.key(now)
    for gap in gaps:
        now += gap
        debounce.key(now)
    return debounce


@pytest.mark.parametrize(
    "gaps, wait",
    [
        ([0.1] * 10, 150),  # 10 keys/s: 1.5 gaps is the floor
        ([0.2] * 10, 300),  # 5 keys/s: 1.5 gaps
        ([0.2] * 10 + [0.5, 2.0, 5.0], 300),  # word pauses barely move the median; long pauses do not count
        ([0.4] * 10, 150 * CEILING),  # a very slow typist: the ceiling
        ([0.2] * (LEAST - 1), 150),  # too few keys yet: the floor
    ],
)
def test_the_wait_is_one_and_a_half_gaps_between_the_floor_and_the_ceiling(gaps, wait):
    assert typed(gaps).wait_ms(150) == pytest.approx(wait)


def test_no_floor_no_wait():
    """A client that waits for the pause itself (Neovim's displays) sets debounceMs 0: nothing is added."""
    assert typed([0.2] * 10).wait_ms(0) == 0
