"""A typist's pauses against the real server, with a tiny random model (harness/stress/typist.py)."""

from __future__ import annotations

from speccomplete.harness.stress import typist


def test_every_pause_is_answered_on_both_settings(tmp_path):
    result = typist.run(seed=0, full=False, workdir=tmp_path)
    for setting in typist.RHYTHMS["steady"].settings:
        pauses = result.metrics["pauses"][setting]
        assert [p["first"] for p in pauses] == [True, False, False]  # three pauses in the one file
        assert all(p["latency_ms"] and p["multiline"] is not None for p in pauses), pauses
        summary = result.metrics[setting]
        assert summary["first pause, any"]["n"] == 1 and summary["later pause, any"]["n"] == 2
        assert summary["cores_while_typing"] is not None
    assert result.passed, result.targets


def test_the_typist_writes_a_line_that_is_there():
    text = "def f():\n" + "".join(f"    value_{i} = compute_something_long({i}, factor)\n" for i in range(6)) + "x\n"
    offset, keys = typist.typing_spot(text)
    assert text[offset:].startswith(keys)  # the line's text after its indentation, Enter, the next indentation
    assert keys.endswith("\n    ") and len(keys.strip()) >= typist.MIN_LINE and offset >= len(text) // 2
    assert typist.typing_spot("short\nlines\n") is None


def test_the_compiled_step_is_in_use_once_optimizing_ends():
    ready, optimizing = {"state": "ready", "optimizing": False}, {"state": "ready", "optimizing": True}
    loading = {"state": "loading", "optimizing": False}
    assert typist._compiled_in_use_s([loading, optimizing, ready], [10.0, 12.0, 55.5], started=9.0) == 46.5
    assert typist._compiled_in_use_s([loading, ready], [10.0, 12.0], started=9.0) is None  # never optimized
    assert typist._compiled_in_use_s([loading, optimizing], [10.0, 12.0], started=9.0) is None  # still at it


def test_the_rhythms_keys_come_as_stated():
    import random
    import statistics

    rng = random.Random(0)
    steady = [typist.RHYTHMS["steady"].key_gap(rng) for _ in range(2000)]
    assert 0.07 <= min(steady) and max(steady) <= 0.13
    uneven = [typist.RHYTHMS["uneven"].key_gap(rng) for _ in range(2000)]
    assert abs(statistics.median(uneven) - 0.12) < 0.01  # a median of 120 ms, and people's long tail
    assert statistics.quantiles(uneven, n=10)[-1] > 1.5 * 0.12
