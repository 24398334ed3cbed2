"""A typing storm against the real server, with a tiny random model (harness/stress/storm.py)."""

from __future__ import annotations

from pygls.lsp.client import LanguageClient

from speccomplete.harness.stress import storm


def test_typing_storm_gets_no_stale_completion_and_every_request_answered(tmp_path):
    result = storm.run(seed=0, full=False, workdir=tmp_path)
    m = result.metrics
    assert m["keystrokes"] == m["requests_answered"] == storm.SHORT.keystrokes
    assert m["stale_completions"] == 0 and m["request_errors"] == 0, result.notes
    assert m["answered_cancelled"] > 0, "typing on cancels the request before"
    assert m["pauses"] == storm.SHORT.keystrokes // storm.SHORT.pause_every
    assert m["completion_events"] > m["pauses"] and m["server_alive_at_end"]
    assert len(m["rss_kib"]) == m["pauses"] + 1 and all(kib > 0 for _, kib in m["rss_kib"])
    assert result.passed, result.targets


def test_a_completion_answered_well_after_the_document_changed_is_stale():
    """The classification: an answer counts as stale when the change it missed was sent STALE_GRACE_S or more
    before it arrived, as crossing in flight when less, and not at all when it offers nothing."""
    session = storm.StressSession(LanguageClient("test", "0"))
    requests = [
        storm.Sent("missed", version=1, sent=0.0, before_pause=False, answered=1.0, text="x", newer_change_sent=0.5),
        storm.Sent("crossed", version=1, sent=0.0, before_pause=False, answered=1.0, text="x", newer_change_sent=0.99),
        storm.Sent("empty", version=1, sent=0.0, before_pause=False, answered=1.0, text="", newer_change_sent=0.1),
        storm.Sent("current", version=2, sent=0.0, before_pause=True, answered=0.3, text="x"),
    ]
    result = storm.report(storm.Storm(session, requests), [], True, seed=0, full=False)
    assert (result.metrics["stale_completions"], result.metrics["answers_crossing_a_change"]) == (1, 1)
    assert result.notes[0].startswith("stale: missed")
    assert not result.passed
