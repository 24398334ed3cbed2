"""Bad settings, at initialize and later (harness/stress/configs.py)."""

from __future__ import annotations

from speccomplete.harness.stress import configs


def test_bad_settings_are_reported_and_the_server_keeps_serving(tmp_path):
    result = configs.run(seed=0, full=False, workdir=tmp_path)
    m = result.metrics
    assert m["cases"] == len(m["cases_run"]) >= 12
    assert m["crashes"] == 0 and m["cases_answered"] == m["cases"], result.notes
    assert m["cases_with_a_clear_message"] == m["cases_due_a_message"] >= 8, result.notes
    assert m["recovered_from_a_failed_initialize"] and m["cases_undone_by_good_settings"] == m["cases"]
    assert m["completions_failing_after_a_case"] == 0, result.notes
    assert result.passed, result.targets
