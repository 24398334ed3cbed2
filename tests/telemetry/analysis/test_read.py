"""Reading event files back: globs, directories and rotated siblings, torn lines, outcomes joined,
older files without the fields added since."""

import json

import pytest
from helpers.events import read_events

from speccomplete.telemetry.analysis.read import UnreadableLineWarning, connect, expand_paths
from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import EventLog


def _event(**fields) -> CompletionEvent:
    return CompletionEvent(**({"language": "python", "target": "t", "draft": "d", "generated_tokens": 5} | fields))


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


def test_a_line_the_writer_ended_after_a_crash_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"schema":1,"language":"py')  # torn by a crash; the next run appends
    with EventLog(path) as log:
        log.write(_event(case_id="after"))
    with pytest.warns(UnreadableLineWarning):
        df = read_events([path])
    assert list(df.case_id) == ["after"]


def test_a_file_brings_its_rotated_siblings_along(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path, max_bytes=2000) as log:
        for i in range(20):
            log.write(_event(case_id=str(i)))
    assert (tmp_path / "events.2.jsonl").exists()
    df = read_events([path])
    assert sorted(df.case_id, key=int) == [str(i) for i in range(20)]
    assert expand_paths([str(tmp_path / "events*.jsonl")]) == expand_paths([tmp_path])
    with pytest.raises(FileNotFoundError):
        expand_paths([tmp_path / "missing.jsonl"])


def test_latest_outcome_is_joined_onto_its_event(tmp_path):
    path = tmp_path / "events.jsonl"
    with EventLog(path) as log:
        first, second = _event(), _event()
        log.write(first)
        log.write(second)
        log.update_outcome(first.request_id, "rejected")
        log.update_outcome(first.request_id, "partial", accepted_chars=7)
    con = connect([path])
    rows = dict(
        (r[0], r[1:])
        for r in con.execute("SELECT request_id, outcome, accepted_chars, has_feedback FROM events").fetchall()
    )
    assert rows[first.request_id] == ("partial", 7, True)
    assert rows[second.request_id] == ("shown", None, False)


def test_events_written_before_backends_existed_read_as_our_decoders(tmp_path):
    """Lines without `backend` and `draft_counts` (older files) get CompletionEvent's defaults, also
    next to newer lines in the same file and when the reader is asked for other columns only."""
    old = _event(case_id="old", accepted=3, rejected_rounds=1).to_dict()
    del old["backend"], old["draft_counts"]
    assert CompletionEvent.from_dict(old).backend == "local"  # the dataclass fills them the same way
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(old) + "\n")
    only_old = read_events([path])
    assert (only_old.backend[0], only_old.draft_counts[0]) == ("local", "rounds")
    with EventLog(path) as log:
        log.write(_event(case_id="new", backend="llamacpp", draft_counts="totals"))
    con = connect([path], columns=["language"])
    rows = con.execute("SELECT case_id, backend, draft_counts FROM events ORDER BY case_id").fetchall()
    assert rows == [("new", "llamacpp", "totals"), ("old", "local", "rounds")]


def test_lookup_rejected_rounds_of_events_written_before_the_field(tmp_path):
    """The study kept the count in its events' settings before the field existed; other older events have none."""
    study = _event(case_id="study", rejected_rounds=3, settings={"lookup_rejected_rounds": 2}).to_dict()
    other = _event(case_id="other", rejected_rounds=3).to_dict()
    for old in (study, other):
        del old["lookup_rejected_rounds"]
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(study) + "\n" + json.dumps(other) + "\n")
    with EventLog(path) as log:
        log.write(_event(case_id="new", rejected_rounds=3, lookup_rejected_rounds=1))
    con = connect([path], columns=["lookup_rejected_rounds"])
    rows = con.execute("SELECT case_id, lookup_rejected_rounds FROM events ORDER BY case_id").fetchall()
    assert rows == [("new", 1), ("other", 0), ("study", 2)]
