"""kill -9 during telemetry writes (harness/stress/kill.py)."""

from __future__ import annotations

from speccomplete.harness.stress import kill
from speccomplete.harness.stress.check import CheckResult
from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import EventLog


def test_killed_writers_lose_at_most_the_event_being_written(tmp_path):
    result = kill.run(seed=0, full=False, workdir=tmp_path)
    m = result.metrics
    assert m["kills"] == 5
    assert m["events_acknowledged"] > 0 and m["events_read"] >= m["events_acknowledged"]
    assert m["acknowledged_events_lost"] == 0 and m["duplicate_events"] == 0, result.notes
    assert m["events_lost"] <= m["kills"] and m["max_lost_per_kill"] <= 1
    assert m["torn_lines"] <= m["kills"] and m["reader_skipped_lines"] == m["torn_lines"]
    assert m["reader_rows"] == m["events_read"]
    assert result.passed, result.targets


def test_the_check_fails_when_an_acknowledged_event_is_missing(tmp_path):
    """The verification itself: a log missing an acknowledged event, with a torn line, does not pass."""
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        for number in (0, 1, 3):  # run 0 acknowledged 0..3, but 2 never reached the file
            log.write(CompletionEvent(language="python", case_id=f"0-{number}"))
    with path.open("ab") as file:
        file.write(b'{"schema":1,"case_id":"0-4","te')  # the write the kill tore
    result = CheckResult("kill", 0, False)
    kill.verify(result, path, acknowledged=[4])
    m = result.metrics
    assert (m["events_read"], m["acknowledged_events_lost"], m["torn_lines"]) == (3, 1, 1)
    assert m["max_lost_per_kill"] == 2 and m["reader_skipped_lines"] == 1
    assert not result.passed
