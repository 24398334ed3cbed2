"""Our C kernels as torch operators (decoder/torch_ops.py): the same numbers as the kernels called through Python,
bit for bit; a compiled step's graph calls them, and is still its own AR where they cannot be built and it calls
the Python operators instead; a failed build is a log line, never an error."""

from __future__ import annotations

import copy
import logging
import zipfile
from types import SimpleNamespace

import pytest
import torch
from helpers.decoding import assert_compiled_ar_is_eager_ar, random_prompts
from helpers.kernels import COMPLAINT, broken_compiler

from speccomplete.decoder import attend_rows, compiled_step, int8_rows, torch_ops
from speccomplete.decoder.loader import use_cpu_kernels

needs_int8_op = pytest.mark.skipif(not torch_ops.int8_rows_op(), reason="no AVX2 or no C/C++ compiler here")
needs_attend_op = pytest.mark.skipif(not torch_ops.attend_rows_op(), reason="no AVX2 or no C/C++ compiler here")


@needs_int8_op
@pytest.mark.parametrize("rows", [1, 3, 9])
def test_int8_rows_is_the_kernels(rows):
    generator = torch.Generator().manual_seed(rows)
    x = torch.randint(-127, 128, (rows, 130), generator=generator).float()
    plain = torch.randint(-127, 128, (13, 130), dtype=torch.int8, generator=generator)
    weight, sums = int8_rows.laid_out(plain), plain.sum(1, dtype=torch.int32)
    assert torch.equal(torch.ops.specdec.int8_rows(x, weight, sums), int8_rows.products(x, weight, sums))
    with pytest.raises(RuntimeError, match="not laid out"):  # never read a weight as another layout
        torch.ops.specdec.int8_rows(x, plain, sums)


@needs_attend_op
@pytest.mark.parametrize(
    "heads, kv_heads, dim, start, parents, window, cap",
    [
        (4, 1, 256, 30, [-1], None, None),  # a step
        (4, 1, 64, 30, [-1, 0, 1, 2], 8, None),  # a chain past a window
        (8, 4, 72, 17, [-1, 0, 0, 1, 1, 2], None, 50.0),  # a tree, Gemma 2's cap
    ],
)
def test_attend_rows_is_the_kernels(heads, kv_heads, dim, start, parents, window, cap):
    generator = torch.Generator().manual_seed(dim)
    rows = len(parents)
    queries = torch.randn(1, heads, rows, dim, generator=generator)
    keys, values = (torch.randn(1, kv_heads, start + rows + 2, dim, generator=generator) for _ in range(2))
    got = torch.ops.specdec.attend_rows(queries, keys, values, start, torch.tensor(parents), window, 0.1, cap)
    assert torch.equal(got, attend_rows.attend(queries, keys, values, start, parents, window, 0.1, cap))


@needs_attend_op
def test_a_parent_after_its_row_is_refused():
    queries, keys, values = torch.randn(1, 2, 2, 8), torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    with pytest.raises(RuntimeError, match="parent comes after"):
        torch.ops.specdec.attend_rows(queries, keys, values, 3, torch.tensor([1, -1]), None, 0.1, None)


def package_text(report) -> str:
    with zipfile.ZipFile(report.path / compiled_step.PACKAGE) as package:
        return "".join(
            package.read(name).decode(errors="replace") for name in package.namelist() if name.endswith(".json")
        )


@needs_int8_op
@needs_attend_op
@pytest.mark.parametrize("operators", ["c++", "python"])
def test_the_compiled_step_on_either_operators_is_its_ar(operators, gemma3, tokenizer, tmp_path, monkeypatch):
    """The graph calls the C++ operators where they are built, and the Python ones where not: either way the
    compiled AR is the eager AR, token for token."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    if operators == "python":
        monkeypatch.setattr(torch_ops, "int8_rows_op", lambda: False)
        monkeypatch.setattr(torch_ops, "attend_rows_op", lambda: False)
    target = copy.deepcopy(gemma3)
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, int8=True)
    compiled, report = compiled_step.build_or_load(target, "int8", 6)
    text = package_text(report)
    calls_cpp = "specdec::int8_rows" in text and "specdec::attend_rows" in text
    assert calls_cpp == (operators == "c++")
    assert ("specdec::opaque_linear" in text) == (operators == "python")
    assert_compiled_ar_is_eager_ar(target, tokenizer, compiled, random_prompts(3))


def test_a_failed_build_falls_back_with_a_log_line(monkeypatch, tmp_path, caplog):
    broken_compiler(monkeypatch, tmp_path)
    torch_ops._loaded.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=torch_ops.__name__):
            assert not torch_ops.int8_rows_op() and not torch_ops.attend_rows_op()
        if int8_rows.available() or attend_rows.available():  # built before the compiler broke: the C++ was tried
            assert "failed" in caplog.text and COMPLAINT in caplog.text
    finally:
        torch_ops._loaded.cache_clear()
