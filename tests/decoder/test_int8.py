"""int8 linears with per-row scales: close to fp32, each row's result its own, and greedy speculative
output on them equal to their own AR, token for token (decoder/kernels.py, Int8Linear)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from helpers.decoding import assert_greedy_matches, random_prompts
from helpers.steps import verify_and_steps

from speccomplete.decoder import int8_rows, kernels, loader
from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.kernels import Int8Linear, PackedGatedMLP, can_int8
from speccomplete.decoder.loader import resolve_quantization, use_cpu_kernels

pytestmark = pytest.mark.skipif(not hasattr(torch, "_int_mm"), reason="no torch._int_mm in this torch")


def test_int8_linear_is_close_to_fp32():
    linear = torch.nn.Linear(256, 96, bias=True)
    x = torch.randn(7, 256)
    want = linear(x)
    got = Int8Linear(linear)(x)
    assert got.shape == want.shape
    assert ((got - want).norm() / want.norm()).item() < 0.02


def test_each_row_is_computed_alone():
    """A row's result is bit for bit the same whatever rows share its product: what makes a k-row
    verify equal k one-row steps."""
    layer = Int8Linear(torch.nn.Linear(640, 300, bias=False))
    x = torch.randn(17, 640) * torch.logspace(-2, 2, 17)[:, None]  # rows of very different scales
    together = layer(x)
    for rows in (1, 2, 5):
        for start in range(0, 17 - rows + 1, 3):
            assert torch.equal(layer(x[start : start + rows]), together[start : start + rows])


def runnable_kernels() -> list[str]:
    return [kernel for kernel in kernels.INT8_KERNELS if kernel != "rows" or int8_rows.available()]


@pytest.mark.skipif(not kernels.can_prepack_int8(), reason="no oneDNN int8 matmul in this torch")
@pytest.mark.parametrize("full_range", [True, False])
def test_every_kernel_gives_the_same_numbers(full_range, monkeypatch):
    """The rows kernel (where it runs), _int_mm and oneDNN's blocked matmul give the same numbers, bit for bit and
    row by row, with 8-bit and with 7-bit weights (torch's kernels on CPUs where their 8-bit products saturate; the
    rows kernel keeps 8 bits there); each row still its own."""
    if full_range and not kernels.int8_full_range():
        pytest.skip("torch's int8 products saturate at full range on this CPU")
    monkeypatch.setattr(kernels, "int8_full_range", lambda: full_range)
    linear = torch.nn.Linear(640, 3000, bias=False)
    x = torch.randn(17, 640) * torch.logspace(-2, 2, 17)[:, None]
    reference = Int8Linear(linear, kernel="int_mm")
    together = reference(x)
    for kernel in runnable_kernels() if full_range else ["int_mm", "onednn"]:
        layer = Int8Linear(linear, kernel=kernel)
        assert torch.equal(layer(x), together), kernel
        for rows in (1, 2, 5, 9):
            for start in range(0, 17 - rows + 1, 4):
                assert torch.equal(layer(x[start : start + rows]), together[start : start + rows]), (kernel, rows)


@pytest.mark.parametrize("full_range", [True, False])
def test_the_default_kernel(full_range, monkeypatch):
    """The rows kernel wherever it runs; elsewhere oneDNN's only for big weights and only with VNNI."""
    monkeypatch.setattr(kernels, "int8_full_range", lambda: full_range)
    big = Int8Linear(torch.nn.Linear(64, kernels.PREPACK_MIN_WEIGHTS // 64, bias=False))
    small = Int8Linear(torch.nn.Linear(64, 32, bias=False))
    if int8_rows.available():
        assert big.kernel == small.kernel == "rows"
    else:
        assert big.kernel == ("onednn" if kernels.can_prepack_int8() and full_range else "int_mm")
        assert small.kernel == "int_mm"
    with pytest.raises(ValueError, match="kernel must be one of"):
        Int8Linear(torch.nn.Linear(64, 32), kernel="fast")


def int8_pair(model):
    """An int8 copy of `model` and a one-layer draft derived from it, quantized with it."""
    target = copy.deepcopy(model)
    draft = derive_draft(target, [0])
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, draft, int8=True)
    return target, draft


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_every_linear_becomes_int8(family, request):
    target, draft = int8_pair(request.getfixturevalue(family))
    assert not any(isinstance(m, torch.nn.Linear) for m in target.modules())
    assert isinstance(target.lm_head, Int8Linear) and draft.lm_head is target.lm_head
    mlp = target.model.layers[0].mlp
    assert isinstance(mlp, PackedGatedMLP) and isinstance(mlp.gate_up, Int8Linear)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_verify_rows_equal_one_row_steps_bit_for_bit(family, request):
    """Past Gemma-3's sliding window (8 tokens in the tiny model) too."""
    target, _ = int8_pair(request.getfixturevalue(family))
    ids = torch.randint(3, 200, (30,)).tolist()
    together, alone = verify_and_steps(target, ids)
    assert torch.equal(together, alone)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("drafting", ["model", "lookup"])
def test_speculative_on_int8_matches_its_ar(family, drafting, tokenizer, request):
    target, draft = int8_pair(request.getfixturevalue(family))
    drafter = ModelDrafter(draft) if drafting == "model" else HybridDrafter(None)
    ar = SpeculativeDecoder(target, tokenizer)
    spec = SpeculativeDecoder(target, tokenizer, drafter, FixedGamma(4))
    assert_greedy_matches(ar, spec, random_prompts(16, seed=9), max_new_tokens=24)


def test_int8_needs_cpu_float32_eager_and_our_forward(llama, gpt2):
    assert not can_int8(copy.deepcopy(llama).to(torch.bfloat16))
    with pytest.raises(ValueError, match="int8"):
        use_cpu_kernels(SimpleNamespace(records_graphs=True), copy.deepcopy(llama), int8=True)
    with pytest.raises(ValueError, match="int8"):
        use_cpu_kernels(SimpleNamespace(records_graphs=False), copy.deepcopy(llama).to(torch.bfloat16), int8=True)
    with pytest.raises(ValueError, match="int8"):  # HF's forward attends batched: no bit-equal verify
        use_cpu_kernels(SimpleNamespace(records_graphs=False), copy.deepcopy(gpt2), int8=True)


def largest_weight(layer: Int8Linear) -> int:
    weights = layer.rows_weight if layer.rows_weight is not None else layer.weight_t
    return int(weights.abs().max())


@pytest.mark.parametrize("rows_kernel", [True, False])
def test_weights_keep_eight_bits_where_products_are_exact(rows_kernel, monkeypatch, llama):
    """Where torch's int8 products saturate (no VNNI) and the rows kernel does not run (no AVX2), weights stay in
    [-63, 63] and "auto" is fp32 (int8 is slower there). With the rows kernel (AVX2 or VNNI), or VNNI or AMX under
    torch's, weights have 8 bits and "auto" is int8 for a Llama or Gemma-3 target on eager steps."""
    if rows_kernel and not int8_rows.available():
        pytest.skip("the rows kernel does not run here")
    eager, compiled = SimpleNamespace(records_graphs=False), SimpleNamespace(records_graphs=True)
    monkeypatch.setattr(int8_rows, "available", lambda: rows_kernel)
    monkeypatch.setattr(kernels, "int8_full_range", lambda: False)
    monkeypatch.setattr(loader, "int8_full_range", lambda: False)
    layer = Int8Linear(torch.nn.Linear(64, 32))
    assert layer.kernel == ("rows" if rows_kernel else "int_mm")
    assert largest_weight(layer) == (127 if rows_kernel else 63)
    assert resolve_quantization("auto", llama, eager) == ("int8" if rows_kernel else "none")
    monkeypatch.setattr(kernels, "int8_full_range", lambda: True)
    monkeypatch.setattr(loader, "int8_full_range", lambda: True)
    assert largest_weight(Int8Linear(torch.nn.Linear(64, 32))) == 127
    assert resolve_quantization("auto", llama, eager) == "int8"
    assert resolve_quantization("auto", llama, compiled) == "none"
    assert resolve_quantization("none", llama, eager) == "none"
