"""The attention rows kernel (decoder/attend_rows.py): torch's attention to float32 rounding on steps, chains,
trees, windows, soft caps and grouped heads; each verify row the one-row step at its position bit for bit; and
where it cannot be built, a log line and SDPA, never an error."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import torch.nn.functional as F
from helpers.kernels import assert_a_failed_build_falls_back

from speccomplete.decoder import attend_rows

needs_kernel = pytest.mark.skipif(not attend_rows.available(), reason="no AVX2 or no C compiler here")


def tensors(heads, kv_heads, dim, positions, rows, seed):
    generator = torch.Generator().manual_seed(seed)
    queries = torch.randn(1, heads, rows, dim, generator=generator)
    keys, values = (torch.randn(1, kv_heads, positions, dim, generator=generator) for _ in range(2))
    return queries, keys, values


@needs_kernel
@pytest.mark.parametrize(
    "heads, kv_heads, dim, start, parents, window, cap",
    [
        (4, 1, 256, 300, [-1], None, None),  # Gemma-3-270M's step
        (4, 1, 256, 300, [-1], 128, None),  # its sliding layers past their window
        (4, 1, 256, 1500, [-1, 0, 1], None, None),  # a long context
        (4, 1, 256, 1500, [-1, 0], 512, None),  # a sliding layer's window at the end of it
        (14, 2, 64, 40, [-1, 0, 1, 2, 3], None, None),  # a Qwen2.5-0.5B verify
        (8, 4, 72, 17, [-1, 0, 0, 1, 1, 2], 6, 50.0),  # a tree, a window inside the paths, Gemma 2's cap
        (2, 2, 8, 0, [-1, 0, 1], None, None),  # nothing cached yet; a head narrower than one register
        (3, 3, 100, 5, [-1, 0, 1, 1], None, None),  # a head width with a tail
    ],
)
def test_attends_as_torch(heads, kv_heads, dim, start, parents, window, cap):
    queries, keys, values = tensors(heads, kv_heads, dim, start + len(parents) + 2, len(parents), seed=dim + start)
    scale = 1 / math.sqrt(dim)
    got = attend_rows.attend(queries, keys, values, start, parents, window, scale, cap)
    want = attend_rows.reference(queries, keys, values, start, parents, window, scale, cap)
    assert got.shape == queries.shape and got.is_contiguous()
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@needs_kernel
def test_a_one_row_step_is_sdpas():
    queries, keys, values = tensors(4, 1, 256, 400, 1, seed=1)
    got = attend_rows.attend(queries, keys, values, 299, [-1], None, 0.0625, None)
    want = F.scaled_dot_product_attention(queries, keys[:, :, :300], values[:, :, :300], scale=0.0625, enable_gqa=True)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@needs_kernel
@pytest.mark.parametrize("window, start", [(None, 50), (3, 50), (None, 254), (300, 254)])
def test_each_verify_row_is_the_one_row_step_at_its_position_bit_for_bit(window, start):
    """A chain's row r over the cache and rows 0..r, and a tree row over its path moved in place behind the cache,
    are what a one-row step at that position computes, with and without a window, at a short and a longer start."""
    queries, keys, values = tensors(4, 2, 96, start + 14, 5, seed=2)
    scale = 96**-0.5
    chain = attend_rows.attend(queries, keys, values, start, [-1, 0, 1, 2, 3], window, scale, None)
    for row in range(5):
        step = attend_rows.attend(queries[:, :, row : row + 1], keys, values, start + row, [-1], window, scale, None)
        assert torch.equal(chain[:, :, row : row + 1], step)
    parents = [-1, 0, 0, 2, 1]  # row 3's path: 0, 2, 3
    tree = attend_rows.attend(queries, keys, values, start, parents, window, scale, None)
    placed_keys, placed_values = keys.clone(), values.clone()
    for at, row in enumerate([0, 2, 3]):
        placed_keys[:, :, start + at], placed_values[:, :, start + at] = (
            keys[:, :, start + row],
            values[:, :, start + row],
        )
    step = attend_rows.attend(queries[:, :, 3:4], placed_keys, placed_values, start + 2, [-1], window, scale, None)
    assert torch.equal(tree[:, :, 3:4], step)


def test_without_avx2_it_is_not_used(monkeypatch, caplog):
    monkeypatch.setattr(attend_rows.c_kernels, "cpu_flags", lambda: {"sse4_2"})
    attend_rows._library.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=attend_rows.__name__):
            assert not attend_rows.available()
        assert "no AVX2" in caplog.text
        queries, keys, values = tensors(1, 1, 8, 4, 1, seed=3)
        assert not attend_rows.usable(queries, keys)
        with pytest.raises(RuntimeError, match="not available"):
            attend_rows.attend(queries, keys, values, 3, [-1], None, 1.0, None)
    finally:
        attend_rows._library.cache_clear()


@pytest.mark.skipif(not attend_rows.c_kernels.cpu_flags() >= {"avx2", "fma"}, reason="no AVX2 here")
def test_a_failed_build_falls_back_with_a_log_line(monkeypatch, tmp_path, caplog):
    assert_a_failed_build_falls_back(attend_rows, monkeypatch, tmp_path, caplog)


@needs_kernel
def test_a_short_cache_is_refused():
    queries, keys, values = tensors(2, 2, 8, 4, 2, seed=4)
    with pytest.raises(ValueError, match="hold fewer"):
        attend_rows.attend(queries, keys, values, 3, [-1, 0], None, 1.0, None)
