"""The rows kernel (decoder/int8_rows.py): exact int8 sums on every shape and row count, from each variant this CPU
runs (AVX-512 VNNI, AVX2); and where it cannot be built, a log line and torch's kernels, never an error."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.kernels import COMPLAINT, broken_compiler

from speccomplete.decoder import int8_rows

needs_kernel = pytest.mark.skipif(not int8_rows.available(), reason="no AVX2 or no C compiler here")

# every variant this CPU runs (on a VNNI machine the AVX2 one too), each built and checked by itself
RUNNABLE = [
    pytest.param(variant, id=variant.name)
    for variant in int8_rows.VARIANTS
    if set(variant.cpu_flags) <= int8_rows.c_kernels.cpu_flags() and int8_rows.load(variant) is not None
]


def products(variant, x, weight):
    library = int8_rows.load(variant)
    return int8_rows._multiply(library, x, int8_rows.laid_out(weight, library), weight.sum(1, dtype=torch.int32))


@pytest.mark.skipif(not RUNNABLE, reason="no variant of the kernel runs here")
@pytest.mark.parametrize("variant", RUNNABLE)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 12, 17])
@pytest.mark.parametrize("width, outputs", [(640, 1536), (64, 4), (130, 13), (2048, 7), (1, 1)])
def test_sums_are_exact(variant, rows, width, outputs):
    generator = torch.Generator().manual_seed(rows * 1000 + width + outputs)
    x = torch.randint(-127, 128, (rows, width), generator=generator).float()
    weight = torch.randint(-128, 128, (outputs, width), dtype=torch.int8, generator=generator)
    got = products(variant, x, weight)
    assert got.dtype == torch.float32 and got.shape == (rows, outputs)
    assert torch.equal(got, (x.long() @ weight.t().long()).float())  # the exact sums, rounded once


@pytest.mark.skipif(not RUNNABLE, reason="no variant of the kernel runs here")
@pytest.mark.parametrize("variant", RUNNABLE)
def test_a_weight_in_another_layout_is_refused(variant):
    """A weight not as laid_out gives it would be read wrongly or past its end: a clear error instead, for a
    weight as it lies (even where its shape is whole tiles and chunks) or laid out for a narrower x."""
    library = int8_rows.load(variant)
    for weight in torch.ones(13, 130, dtype=torch.int8), torch.ones(16, 128, dtype=torch.int8):
        sums = weight.sum(1, dtype=torch.int32)
        with pytest.raises(ValueError, match="laid_out"):
            int8_rows._multiply(library, torch.ones(1, weight.shape[1]), weight, sums)
        with pytest.raises(ValueError, match="laid_out"):
            int8_rows._multiply(library, torch.ones(1, 300), int8_rows.laid_out(weight, library), sums)


@pytest.mark.skipif(not RUNNABLE, reason="no variant of the kernel runs here")
@pytest.mark.parametrize("variant", RUNNABLE)
def test_extreme_values_sum_exactly(variant):
    """-127 and 127 everywhere, and -128 in the weights: the largest sums a row of 2,048 reaches, either sign (where
    16-bit pairs of products of 8-bit ones would saturate)."""
    x = torch.tensor([[127.0] * 2048, [-127.0] * 2048])
    weight = torch.tensor([[127] * 2048, [-127] * 2048, [-128] * 2048], dtype=torch.int8)
    got = products(variant, x, weight)
    largest = 127 * 127 * 2048  # 33,032,192: exact in float32 too
    assert got.tolist() == [[largest, -largest, -127 * 128 * 2048], [-largest, largest, 127 * 128 * 2048]]


@needs_kernel
def test_the_best_variant_is_the_one_used():
    assert int8_rows._library() is int8_rows.load(int8_rows.variant())
    assert int8_rows.variant() == RUNNABLE[0].values[0]


def without_cached_libraries():
    int8_rows._library.cache_clear()
    int8_rows.load.cache_clear()


@pytest.mark.parametrize(
    "flags, variant", [({"avx2", "fma"}, "avx2"), ({"sse4_2"}, None)], ids=["avx2 without vnni", "no avx2"]
)
def test_the_variant_follows_the_cpu(flags, variant, monkeypatch, caplog):
    """Without VNNI the AVX2 variant (where ATen runs at AVX2 or above); without AVX2 none, with a log line and an
    error from products(), never wrong numbers."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512", "AMX"):
        pytest.skip("ATen runs below AVX2 here")
    monkeypatch.setattr(int8_rows.c_kernels, "cpu_flags", lambda: flags)
    without_cached_libraries()
    try:
        chosen = int8_rows.variant()
        assert (chosen.name if chosen else None) == variant
        if variant is None:
            with caplog.at_level(logging.INFO, logger=int8_rows.__name__):
                assert not int8_rows.available()
            assert "no AVX2" in caplog.text
            weight = torch.zeros(4, 64, dtype=torch.int8)
            with pytest.raises(RuntimeError, match="not available"):
                int8_rows.products(torch.zeros(1, 64), weight, weight.sum(1, dtype=torch.int32))
    finally:
        without_cached_libraries()


@needs_kernel
def test_a_failed_build_falls_back_with_a_log_line(monkeypatch, tmp_path, caplog):
    broken_compiler(monkeypatch, tmp_path)
    without_cached_libraries()
    try:
        with caplog.at_level(logging.WARNING, logger=int8_rows.__name__):
            assert not int8_rows.available()
        assert "failed" in caplog.text and COMPLAINT in caplog.text
    finally:
        without_cached_libraries()
