"""TCP mode with a second local client (harness/stress/tcp.py)."""

from __future__ import annotations

from speccomplete.harness.stress import tcp


def test_a_second_client_can_neither_read_nor_steer_the_session(tmp_path):
    result = tcp.run(seed=0, full=False, workdir=tmp_path)
    m = result.metrics
    assert m["token_file_mode"] == "0o600"
    assert m["intruders_refused"] == m["intruders"] == 4 and m["messages_leaked_to_intruders"] == 0, result.notes
    assert not m["telemetry_path_changed"]
    assert m["first_answered_before"] and m["first_answered_after"]
    assert m["next_client_served"], "the server waits for the next client when one leaves"
    assert result.passed, result.targets
