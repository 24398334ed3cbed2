"""`specdec stepcost`: the cost of target and draft forwards, by width."""

from helpers.tiny_models import tiny_llama

from speccomplete.harness.stepcost import WEIGHT_PRODUCTS, profile_passes, step_costs


def test_step_costs_report_ratios():
    row = step_costs(tiny_llama(seed=3), list(range(40)), widths=(1, 3), repeats=3)
    assert row["verify_3_ratio"] == row["target_3_ms"] / row["target_1_ms"]
    assert row["c"] == row["draft_1_ms"] / row["target_1_ms"] > 0


def test_profile_splits_a_pass_into_weight_products_and_the_rest():
    report = profile_passes(tiny_llama(seed=3), list(range(40)), widths=(1, 3), repeats=2)
    for row in report.values():
        products = sum(ms for name, (_, ms) in row["ops"].items() if name in WEIGHT_PRODUCTS)
        assert row["products_ms"] == products > 0 and row["other_ms"] > 0
        assert row["products_ms"] + row["other_ms"] <= row["ms"] * 1.5  # top-level ops only: nothing counted twice
