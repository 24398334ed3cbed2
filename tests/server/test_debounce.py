"""The debounce follows the typist (server/debounce.py): the shortest wait at which the decodes started between
keys cost at most BUDGET of a core on the recent gaps; the floor until the pace is known, never past the
ceiling; pauses between words and long pauses do not lengthen it."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

import pytest

from speccomplete.server.debounce import BUDGET, CEILING, LEAST, START_S, WORD_PAUSE, Debounce

FLOOR_MS = 100


def typed(gaps: Sequence[float], decodes: Sequence[float] = ()) -> Debounce:
    debounce, now = Debounce(), 100.0
    debounce.key(now)
    for gap in gaps:
        now += gap
        debounce.key(now)
    for seconds in decodes:
        debounce.decoded(seconds)
    return debounce


def steady(n: int, low: float = 0.07, high: float = 0.13, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(low, high) for _ in range(n)]


def test_a_regular_typist_waits_just_past_the_usual_gaps():
    """10 keys/s, gaps of 70-130 ms: a wait near the longest gaps, well under 1.5 median gaps."""
    gaps = steady(20)
    debounce = typed(gaps, decodes=[0.08] * 5)
    wait = debounce.wait_ms(FLOOR_MS)
    assert 100 < wait < max(gaps) * 1000 < 135
    assert debounce.typing_share(wait / 1000) <= BUDGET < debounce.typing_share((wait - 5) / 1000)


def test_gaps_under_the_floor_wait_the_floor():
    assert typed([0.08] * 10).wait_ms(FLOOR_MS) == FLOOR_MS


def test_pauses_between_words_do_not_lengthen_the_wait():
    """5 keys/s with a pause of 0.3-0.6 s after each word: the wait lies past the gaps inside a word, not past
    the pauses (a decode there serves the pause)."""
    rng = random.Random(1)
    gaps = [rng.uniform(0.15, 0.25) + (rng.uniform(0.3, 0.6) if i % 6 == 5 else 0) for i in range(20)]
    inside_words = [gap for i, gap in enumerate(gaps) if i % 6 != 5]
    wait = typed(gaps, decodes=[0.08] * 5).wait_ms(FLOOR_MS)
    assert 190 < wait < max(inside_words) * 1000
    assert wait < CEILING * FLOOR_MS


def test_an_uneven_typist_waits_longer_than_a_regular_one_of_the_same_pace():
    rng = random.Random(2)
    uneven = [0.1 * rng.lognormvariate(0, 0.45) for _ in range(20)]
    regular = steady(20, 0.09, 0.11)
    assert typed(uneven, [0.08] * 5).wait_ms(FLOOR_MS) > typed(regular, [0.08] * 5).wait_ms(FLOOR_MS) + 20


def test_quicker_decodes_wait_less():
    """A decode a key cancels costs at most its own time: cheap decodes may start sooner."""
    gaps = steady(20, 0.15, 0.25, seed=3)
    assert typed(gaps, decodes=[0.01] * 5).wait_ms(FLOOR_MS) < typed(gaps, decodes=[0.2] * 5).wait_ms(FLOOR_MS)


@pytest.mark.parametrize(
    "gaps, wait",
    [
        ([0.4] * (LEAST - 1), FLOOR_MS),  # too few gaps yet: the floor, though these would reach the ceiling
        ([0.4] * 10, FLOOR_MS * CEILING),  # a very slow typist: the ceiling
        ([0.08] * 10 + [2.0, 5.0], FLOOR_MS),  # long pauses are not typing
    ],
)
def test_the_floor_and_the_ceiling(gaps, wait):
    assert typed(gaps).wait_ms(FLOOR_MS) == pytest.approx(wait)


def test_no_floor_no_wait():
    """A client that waits for the pause itself (Neovim's displays) sets debounceMs 0: nothing is added."""
    assert typed([0.2] * 10).wait_ms(0) == 0


@pytest.mark.parametrize(
    "next_gap",
    [
        lambda rng: rng.uniform(0.07, 0.13),
        lambda rng: rng.uniform(0.15, 0.25),
        lambda rng: 0.12 * rng.lognormvariate(0, 0.3),
        lambda rng: 0.15 * rng.lognormvariate(0, 0.45),
    ],
    ids=["10 keys/s", "5 keys/s", "uneven", "more uneven"],
)
def test_what_decodes_between_keys_cost_stays_near_the_budget(next_gap):
    """The promise, over 4,000 keys: the decodes started between keys (not in pauses between words) cost about
    BUDGET of the typing's time (estimated from 20 gaps, so near it rather than under it)."""
    rng, debounce, now, decode_s = random.Random(4), Debounce(), 0.0, 0.08
    debounce.key(now)
    debounce.decoded(decode_s)
    spent = 0.0
    for _ in range(4000):
        wait_s, gap = debounce.wait_ms(FLOOR_MS) / 1000, next_gap(rng)
        if debounce.gaps and wait_s < gap < WORD_PAUSE * statistics.median(debounce.gaps):
            spent += min(gap - wait_s + START_S, decode_s)
        now += gap
        debounce.key(now)
    assert spent / now < 1.5 * BUDGET


def test_the_server_hands_the_debounce_the_time_of_each_decode_that_answered():
    """What a decode costs caps what a cancelled one can: the server records each answered decode's time, and
    not that of a decode the user typed over."""
    from lsprotocol import types
    from pygls.workspace import Workspace

    from speccomplete.decoder.stats import GenerationStats
    from speccomplete.server.completion import Completion
    from speccomplete.server.lsp import SpecdecServer
    from speccomplete.telemetry.events import CompletionEvent

    server = SpecdecServer()
    server.protocol._workspace = Workspace(None, types.TextDocumentSyncKind.Incremental)
    server.configure({"telemetry": False})
    server.protocol.notify = lambda method, params: None
    stats = GenerationStats()
    stats.prompt_tokens = 300
    for outcome, latency_ms in (("empty", 80.0), ("cancelled", 5.0), ("empty", 60.0)):
        event = CompletionEvent.from_stats(stats.to_dict(), language="python", latency_ms=latency_ms, outcome=outcome)
        server.deliver(("file:///a.py", "/a.py", 1), None, Completion("", "python", False, event))
    assert list(server.debounce.decodes) == [0.08, 0.06]
