"""The rows kernel (decoder/int8_rows.py): torch's exact int8 sums on every shape and row count, from both of its
paths; and where it cannot be built, a log line and torch's kernels, never an error."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.kernels import COMPLAINT, broken_compiler

from speccomplete.decoder import int8_rows

needs_kernel = pytest.mark.skipif(not int8_rows.available(), reason="no AVX-512 VNNI or no C compiler here")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 9, 12, 17])
@pytest.mark.parametrize("width, outputs", [(640, 1536), (64, 4), (130, 13), (2048, 7), (1, 1)])
def test_sums_are_torchs(rows, width, outputs):
    generator = torch.Generator().manual_seed(rows * 1000 + width + outputs)
    x = torch.randint(-127, 128, (rows, width), generator=generator).float()
    weight = torch.randint(-127, 128, (outputs, width), dtype=torch.int8, generator=generator)
    got = int8_rows.products(x, weight, weight.sum(1, dtype=torch.int32))
    assert got.dtype == torch.float32 and got.shape == (rows, outputs)
    assert torch.equal(got, (x.long() @ weight.t().long()).float())  # the exact sums, rounded once
    if hasattr(torch, "_int_mm") and rows > 16 and width % 8 == 0 and outputs % 8 == 0:
        assert torch.equal(got, torch._int_mm(x.to(torch.int8), weight.t()).float())


@needs_kernel
def test_extreme_values_sum_exactly():
    """-127 and 127 everywhere: the largest sums a row of 2,048 can reach, either sign."""
    x = torch.tensor([[127.0] * 2048, [-127.0] * 2048])
    weight = torch.tensor([[127] * 2048, [-127] * 2048], dtype=torch.int8)
    got = int8_rows.products(x, weight, weight.sum(1, dtype=torch.int32))
    largest = float(127 * 127 * 2048)  # 33,032,192: exact in float32 too
    assert got.tolist() == [[largest, -largest], [-largest, largest]]


def test_without_vnni_it_is_not_used(monkeypatch, caplog):
    monkeypatch.setattr(int8_rows.c_kernels, "cpu_flags", lambda: {"avx2", "fma"})
    int8_rows._library.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=int8_rows.__name__):
            assert not int8_rows.available()
        assert "no AVX-512 VNNI" in caplog.text
        weight = torch.zeros(4, 64, dtype=torch.int8)
        with pytest.raises(RuntimeError, match="not available"):
            int8_rows.products(torch.zeros(1, 64), weight, weight.sum(1, dtype=torch.int32))
    finally:
        int8_rows._library.cache_clear()


@pytest.mark.skipif(not int8_rows.c_kernels.cpu_flags() >= set(int8_rows._CPU_FLAGS), reason="no AVX-512 VNNI here")
def test_a_failed_build_falls_back_with_a_log_line(monkeypatch, tmp_path, caplog):
    broken_compiler(monkeypatch, tmp_path)
    int8_rows._library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=int8_rows.__name__):
            assert not int8_rows.available()
        assert "failed" in caplog.text and COMPLAINT in caplog.text
    finally:
        int8_rows._library.cache_clear()
