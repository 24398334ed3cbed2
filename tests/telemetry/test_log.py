"""Telemetry storage: the event schema, the JSONL writer, rotation, the off switch and torn lines."""

import json
import os
import stat
import threading

import pytest

from speccomplete.decoder.stats import GenerationStats
from speccomplete.telemetry.events import SCHEMA, CompletionEvent
from speccomplete.telemetry.log import EventLog, default_path, rotated_paths
from speccomplete.telemetry.read import UnreadableLineWarning, connect, expand_paths, read_events


def _event(**fields) -> CompletionEvent:
    stats = GenerationStats()
    stats.prompt_tokens, stats.new_tokens, stats.total_ms = 12, 5, 40.0
    stats.record_round(4, 2)
    stats.record_round(4, 4)
    return CompletionEvent.from_stats(stats.to_dict(), **({"language": "python", "target": "t", "draft": "d"} | fields))


def test_event_round_trips_through_dict_and_json():
    event = _event(settings={"gamma": "4", "temperature": 0.5}, case_id="py-0", source="bench", text="x = 1")
    back = CompletionEvent.from_dict(json.loads(json.dumps(event.to_dict())))
    assert back == event
    assert back.schema == SCHEMA == 1


def test_from_stats_maps_the_decoder_stats():
    event = _event()
    assert (event.prompt_tokens, event.generated_tokens, event.total_ms) == (12, 5, 40.0)
    assert (event.drafted, event.accepted, event.rounds, event.rejected_rounds) == (8, 6, 2, 1)
    assert event.gammas == [4, 4] and event.accepted_histogram == [0, 0, 1, 0, 1]
    assert event.text is None and event.outcome == "shown"  # no source text unless the caller opts in
    assert "alpha" not in event.to_dict()  # derived numbers are recomputed by the analysis, pooled


def test_from_dict_rejects_newer_schema_unknown_fields_and_bad_values():
    with pytest.raises(ValueError, match="newer"):
        CompletionEvent.from_dict({"schema": SCHEMA + 1})
    with pytest.raises(ValueError, match="unknown"):
        CompletionEvent.from_dict({"schema": SCHEMA, "colour": "red"})
    with pytest.raises(ValueError, match="outcome"):
        CompletionEvent(outcome="liked")
    with pytest.raises(ValueError, match="trigger"):
        CompletionEvent(trigger="sometimes")


def test_writes_one_line_per_event_with_mode_0600(tmp_path):
    path = tmp_path / "deep" / "events.jsonl"
    with EventLog(path) as log:
        for i in range(3):
            assert log.write(_event(case_id=str(i)))
    lines = path.read_text().splitlines()
    assert [json.loads(line)["case_id"] for line in lines] == ["0", "1", "2"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_disabled_log_writes_and_creates_nothing(tmp_path, monkeypatch):
    path = tmp_path / "off" / "events.jsonl"
    log = EventLog(path, enabled=False)
    assert log.write(_event()) is False
    assert log.update_outcome("r", "accepted") is False
    monkeypatch.setenv("SPECDEC_TELEMETRY", "0")
    log = EventLog(path)
    assert log.write(_event()) is False
    assert not (tmp_path / "off").exists()


def test_default_path_is_under_the_user_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_path() == tmp_path / "specdec" / "events.jsonl"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "share" / "specdec" / "events.jsonl"


def test_torn_last_line_is_skipped_with_a_warning_and_the_rest_counted(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        for i in range(5):
            log.write(_event(case_id=str(i)))
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[0][:37])  # a crash in the middle of a write
    with pytest.warns(UnreadableLineWarning, match="skipped 1 line"):
        df = read_events([path])
    assert sorted(df.case_id) == ["0", "1", "2", "3", "4"]


def test_writer_ends_a_torn_line_before_appending(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"schema":1,"language":"py')  # torn by a crash; the next run appends
    with EventLog(path) as log:
        log.write(_event(case_id="after"))
    with pytest.warns(UnreadableLineWarning):
        df = read_events([path])
    assert list(df.case_id) == ["after"]  # the new event was not glued onto the torn line


def test_rotation_keeps_every_event_across_threads(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path, max_bytes=4000)

    def writer(thread):
        for i in range(100):
            log.write(_event(case_id=f"{thread}-{i}"))

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    rotated = rotated_paths(path)
    assert len(rotated) > 10
    assert all(p.stat().st_size <= 4000 for p in rotated)
    assert [p.name for p in rotated[:2]] == ["events.1.jsonl", "events.2.jsonl"]
    df = read_events([path])  # a file brings its rotated siblings along
    assert len(df) == 400 and df.case_id.nunique() == 400
    assert expand_paths([str(tmp_path / "events*.jsonl")]) == expand_paths([tmp_path])


def test_latest_outcome_is_joined_onto_its_event(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        first, second = _event(), _event()
        log.write(first)
        log.write(second)
        log.update_outcome(first.request_id, "rejected")
        log.update_outcome(first.request_id, "partial", accepted_chars=7)
        with pytest.raises(ValueError):
            log.update_outcome(first.request_id, "loved")
    con = connect([path])
    rows = dict((r[0], r[1:]) for r in con.execute(
        "SELECT request_id, outcome, accepted_chars, has_feedback FROM events").fetchall())
    assert rows[first.request_id] == ("partial", 7, True)
    assert rows[second.request_id] == ("shown", None, False)


def test_write_errors_are_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = EventLog(blocker / "events.jsonl")  # its parent is a file: cannot be created
    assert log.write(_event()) is False
    assert "cannot write" in caplog.text
    assert not os.path.isdir(blocker)
