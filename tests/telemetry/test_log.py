"""The event writer: JSONL records, outcome records, rotation, the off switch and torn lines.

Reading the files back (torn lines skipped, outcomes joined) is tests/telemetry/analysis/test_read.py."""

import json
import os
import stat
import threading

import pytest

from speccomplete.telemetry.events import SCHEMA, CompletionEvent
from speccomplete.telemetry.log import EventLog, default_path, rotated_paths


def _event(**fields) -> CompletionEvent:
    return CompletionEvent(**({"language": "python", "target": "t", "draft": "d", "generated_tokens": 5} | fields))


def _records(*paths) -> list[dict]:
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()]


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


def test_writer_ends_a_torn_line_before_appending(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"schema":1,"language":"py')  # torn by a crash; the next run appends
    with EventLog(path) as log:
        log.write(_event(case_id="after"))
    torn, after = path.read_text().splitlines()
    assert torn == '{"schema":1,"language":"py'
    assert json.loads(after)["case_id"] == "after"  # the new event was not glued onto the torn line


def test_a_rotation_a_crash_interrupted_is_finished_without_duplicates(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        log.write(_event(case_id="before"))
    os.link(path, tmp_path / "events.1.jsonl")  # killed after the rotation's link, before its unlink
    with EventLog(path) as log:
        log.write(_event(case_id="after"))
    read = [r["case_id"] for r in _records(*rotated_paths(path), path)]
    assert read == ["before", "after"], "each event once, in order"


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
    case_ids = [record["case_id"] for record in _records(*rotated, path)]
    assert len(case_ids) == 400 and len(set(case_ids)) == 400


def test_outcome_records_name_their_event(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        event = _event()
        log.write(event)
        log.update_outcome(event.request_id, "partial", accepted_chars=7)
        with pytest.raises(ValueError, match="outcome"):
            log.update_outcome(event.request_id, "loved")
    written, outcome = _records(path)
    assert written == event.to_dict()
    assert outcome == {
        "schema": SCHEMA,
        "record": "outcome",
        "time": outcome["time"],
        "request_id": event.request_id,
        "outcome": "partial",
        "accepted_chars": 7,
    }


def test_write_errors_are_logged_not_raised(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = EventLog(blocker / "events.jsonl")  # its parent is a file: cannot be created
    assert log.write(_event()) is False
    assert "cannot write" in caplog.text
    assert not os.path.isdir(blocker)


def _rotated_file(path, n, size, age_days):
    rotated = path.with_name(f"events.{n}.jsonl")
    rotated.write_bytes(b"{}\n" * (size // 3))
    old = os.stat(rotated).st_mtime - age_days * 86400
    os.utime(rotated, (old, old))
    return rotated


def test_retention_deletes_rotated_files_past_their_age_at_open(tmp_path):
    path = tmp_path / "events.jsonl"
    old, recent = _rotated_file(path, 1, 300, age_days=100), _rotated_file(path, 2, 300, age_days=10)
    with EventLog(path, keep_days=90) as log:
        log.write(_event(case_id="new"))
    assert not old.exists() and recent.exists()
    with EventLog(path, keep_days=0) as log:  # 0: age alone deletes nothing
        assert log.prune() == []


def test_retention_keeps_all_files_under_the_size_budget_oldest_deleted_first(tmp_path):
    path = tmp_path / "events.jsonl"
    files = [_rotated_file(path, n, 3000, age_days=5 - n) for n in (1, 2, 3)]
    with EventLog(path, max_bytes=3000, keep_bytes=7000) as log:
        for i in range(40):  # rotates: each rotation prunes again
            log.write(_event(case_id=str(i)))
    rotated = rotated_paths(path)
    assert not files[0].exists(), "the oldest goes first"
    assert sum(p.stat().st_size for p in [*rotated, path]) <= 7000
    assert path.exists() and _records(path), "the live file is never deleted"
    assert [r["case_id"] for r in _records(*rotated, path)][-1] == "39"


def test_retention_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="keep_days"):
        EventLog(tmp_path / "e.jsonl", keep_days=-1)
