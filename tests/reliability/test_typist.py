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
