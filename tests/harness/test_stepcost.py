"""`specdec stepcost`: the cost of target and draft forwards, by width."""

from helpers.tiny_models import tiny_llama

from speccomplete.decoder.models import parameter_count
from speccomplete.harness.stepcost import (
    SHAPES,
    WEIGHT_PRODUCTS,
    profile_passes,
    shape_config,
    step_costs,
)


def test_step_costs_report_ratios():
    row = step_costs(tiny_llama(seed=3), list(range(40)), widths=(1, 3), repeats=3)
    assert row["verify_3_ratio"] == row["target_3_ms"] / row["target_1_ms"]
    assert row["c"] == row["draft_1_ms"] / row["target_1_ms"] > 0


def test_a_step_is_put_against_its_memory_bound():
    model = tiny_llama(seed=3)
    read = sum(p.numel() * p.element_size() for p in model.parameters())
    row = step_costs(model, list(range(40)), widths=(1,), repeats=3, read_bytes=read)
    assert row["of_bound"] == row["bound_ms"] / row["target_1_ms"] > 0
    assert row["read_gb_per_s"] == read / row["bound_ms"] / 1e6


def test_the_shapes_are_the_coders_sizes():
    """Qwen2.5-Coder's published parameter counts, in billions (tied embeddings once)."""
    published = {
        "qwen2.5-coder-0.5b": 0.49,
        "qwen2.5-coder-1.5b": 1.54,
        "qwen2.5-coder-3b": 3.09,
        "qwen2.5-coder-7b": 7.61,
    }
    assert set(published) == set(SHAPES)
    for shape, billions in published.items():
        assert abs(parameter_count(shape_config(shape)) / 1e9 - billions) < 0.01


def test_profile_splits_a_pass_into_weight_products_and_the_rest():
    report = profile_passes(tiny_llama(seed=3), list(range(40)), widths=(1, 3), repeats=2)
    for row in report.values():
        products = sum(ms for name, (_, ms) in row["ops"].items() if name in WEIGHT_PRODUCTS)
        assert row["products_ms"] == products > 0 and row["other_ms"] > 0
        assert row["products_ms"] + row["other_ms"] <= row["ms"] * 1.5  # top-level ops only: nothing counted twice
