"""`specdec stepcost`: the cost of target and draft forwards, by width."""

from conftest import tiny_llama

from speccomplete.harness.stepcost import step_costs


def test_step_costs_report_ratios():
    row = step_costs(tiny_llama(seed=3), list(range(40)), widths=(1, 3), repeats=3)
    assert row["verify_3_ratio"] == row["target_3_ms"] / row["target_1_ms"]
    assert row["c"] == row["draft_1_ms"] / row["target_1_ms"] > 0
