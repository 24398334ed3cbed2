"""The greedy rows kernel (decoder/greedy_rows.py) against torch: the same argmax, ties and all, and the same
log-normalizers, on one thread and on two, and a greedy round decided with it equal to torch's verdict."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.kernels import assert_a_failed_build_falls_back

from speccomplete.decoder import greedy_rows, sampling

needs_kernel = pytest.mark.skipif(not greedy_rows.available(), reason="the greedy rows kernel does not run here")


@pytest.fixture(params=[1, 2], ids=["1 thread", "2 threads"])
def threads(request):
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def _rows(rows: int, vocab: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 4


@needs_kernel
@pytest.mark.parametrize("vocab", [7, 33, 4_095, 49_152, 262_144])
def test_first_maxima_are_torchs_argmax(threads, vocab):
    logits = _rows(6, vocab)
    top = logits.max() + 1
    logits[1, -1] = top  # the last position (past the vector loop where the vocabulary is no multiple of 32)
    logits[2, vocab // 2 :] = logits[2].max() + 1  # a tie from the middle on (across the threads' pieces)
    logits[3] = 0.25  # all equal: the first
    logits[4] = float("-inf")  # nothing but -inf: the first too
    logits[5, [vocab - 1, 0]] = top  # a tie of the first and the last
    index, maxima = greedy_rows.first_maxima(logits)
    assert index == logits.argmax(-1).tolist()
    assert maxima.tolist() == logits.max(-1).values.tolist()


@needs_kernel
@pytest.mark.parametrize("vocab", [33, 4_095, 262_144])
def test_log_normalizers_are_torchs(threads, vocab):
    logits = _rows(4, vocab, seed=1)
    logits[1] *= 20  # far apart: a few terms carry the sum
    logits[2, : vocab // 2] = -200.0  # exp under float's range: nothing
    _, maxima = greedy_rows.first_maxima(logits)
    got = torch.tensor(greedy_rows.log_normalizers(logits, maxima))
    torch.testing.assert_close(got, torch.logsumexp(logits, -1), atol=1e-5, rtol=1e-6)
    # the first rows only, as a round asks for those it commits
    assert greedy_rows.log_normalizers(logits[:2], maxima) == pytest.approx(got[:2].tolist(), abs=0)


@needs_kernel
def test_a_row_view_with_a_stride_is_read_as_rows():
    wide = _rows(3, 300)
    logits = wide[:, :256]  # rows 300 floats apart
    index, maxima = greedy_rows.first_maxima(logits)
    assert index == logits.argmax(-1).tolist()
    torch.testing.assert_close(
        torch.tensor(greedy_rows.log_normalizers(logits, maxima)), torch.logsumexp(logits, -1), atol=1e-5, rtol=1e-6
    )


@needs_kernel
def test_a_greedy_round_decided_by_the_kernel_is_torchs(monkeypatch):
    """sampling.greedy_verdict_on_host with the kernel and without it: the same n and token, and the
    log-probabilities of the rows committed to float32 rounding, at a vocabulary the size of Gemma-3's."""
    logits = _rows(5, 262_144, seed=2)
    top = logits.argmax(-1)
    for drafts in (top[:4], top[:2], torch.tensor([top[0], 1, top[2], top[3]]), top[1:4] + 1, top[:0]):
        rows = logits[: drafts.numel() + 1]
        assert greedy_rows.usable(rows)
        with_kernel = sampling.greedy_verdict_on_host(rows, drafts)
        monkeypatch.setattr(greedy_rows, "enabled", False)
        with_torch = sampling.greedy_verdict_on_host(rows, drafts)
        monkeypatch.setattr(greedy_rows, "enabled", True)
        assert with_kernel[:2] == with_torch[:2]
        assert with_kernel == pytest.approx(with_torch, abs=1e-5)


def test_without_avx2_torch_decides(monkeypatch, caplog):
    monkeypatch.setattr(greedy_rows.c_kernels, "cpu_flags", lambda: {"sse4_2"})
    greedy_rows._library.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger=greedy_rows.__name__):
            assert not greedy_rows.available()
        assert "no AVX2" in caplog.text
        logits = _rows(3, 100)
        assert not greedy_rows.usable(logits)
        with pytest.raises(RuntimeError, match="not available"):
            greedy_rows.first_maxima(logits)
        top = logits.argmax(-1)
        assert sampling.greedy_verdict_on_host(logits, top[:2])[:2] == [2, top[2].item()]  # torch's, as before
    finally:
        greedy_rows._library.cache_clear()


@pytest.mark.skipif(not greedy_rows.c_kernels.cpu_flags() >= {"avx2", "fma"}, reason="no AVX2 here")
def test_a_failed_build_falls_back_with_a_log_line(monkeypatch, tmp_path, caplog):
    assert_a_failed_build_falls_back(greedy_rows, monkeypatch, tmp_path, caplog)
