"""Linear layers on oneDNN-packed weights, for batch-1 decoding on the CPU.

MKL's fp32 GEMM, which `nn.Linear` uses on the CPU, is slow for the few-row inputs of decoding: a
5-row product with Gemma-3's 262k x 640 head costs several times a one-row one, so verifying γ drafts
would cost twice a plain step and more. With the weights reordered once into oneDNN's blocked layout
(what inductor does under `freezing`), one row runs near the memory-bandwidth bound and five rows cost
little more (docs/cpu.md has the figures). That is what makes verifying a few drafts nearly as cheap
as one step, the premise of speculative decoding.

Gated MLPs (LLaMA, Gemma, Qwen: down(act(gate(x)) * up(x))) get gate and up fused into one
packed product: one parallel region fewer per layer. So do the linears a module names as
`fusable_projections` (an EAGLE-3 draft's q, k and v), which its forward then reads from `projections`.

Packing is for inference only: packed weights have no gradient and no `.weight` to read, so it
is applied after every draft has been built from the target.

`Int8Linear` reads a quarter of those bytes: int8 weights with one scale per output row, int8
activations with one scale per input row, and an exact int32 product (`torch._int_mm`, oneDNN).
Each input row's result depends on that row alone, so a k-row verify computes what k one-row steps
compute, bit for bit, and greedy speculative output stays equal to its own AR. (fbgemm's dynamic
quantization, rejected in docs/benchmarks, scales a whole batch by one activation scale.)

Three kernels multiply, and all sum the same integer products exactly in int32, so they give the same numbers,
bit for bit (`INT8_KERNELS`). Wherever AVX2 and a C compiler are, `rows` (decoder/int8_rows.py, C built at first
use, with a VNNI variant and an AVX2 one) streams each weight row once for the few rows decoding feeds. Elsewhere
torch's: `torch._int_mm` reads the weights as they lie: a fast pass for one row, slower from two rows on (the
262k-row head: about 2x at 2 to 5 rows), which is what a verify feeds; so a weight big enough for that to matter
(`PREPACK_MIN_WEIGHTS`: the head) is reordered once into oneDNN's blocked int8 layout and multiplied by its int8
matmul (`onednn::qlinear_pointwise`), whose cost hardly grows with the rows. Where torch's products of 8-bit
weights saturate (oneDNN without VNNI adds pairs of them in 16 bits), weights on torch's kernels keep 7 bits
(`int8_full_range`); the rows kernel is exact at 8 bits everywhere.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import weakref
from collections.abc import Callable
from typing import cast

import torch

from . import int8_rows, lean_forward, torch_ops
from .families import FAMILIES, LEAN_ATTENTIONS

log = logging.getLogger(__name__)

# The packed layout depends a little on the expected row count; decoding feeds 1 to γ+1 rows.
_ROWS_HINT = 8


# Weights in oneDNN's blocked layouts are opaque to torch.compile (they have no strides to trace). A compiled
# step (decoder/compiled_step.py) reaches each through `specdec::opaque_linear`, which names the module by a
# key made from its weights: the same in every process that loads the same model, so the compile caches hit.
_OPAQUE: weakref.WeakValueDictionary[int, PackedLinear | Int8Linear] = weakref.WeakValueDictionary()


def weight_sample(weight: torch.Tensor) -> list:
    """About 4,096 of a weight's values, evenly strided: enough to tell one model's weights from another's."""
    return weight.detach().flatten()[:: max(1, weight.numel() // 4096)].tolist()


def _opaque_key(module: PackedLinear | Int8Linear, weight: torch.Tensor) -> int:
    sample = weight_sample(weight)
    digest = hashlib.blake2b(repr((type(module).__name__, tuple(weight.shape), sample)).encode(), digest_size=7)
    key = int.from_bytes(digest.digest(), "little")
    _OPAQUE[key] = module
    return key


@torch.library.custom_op("specdec::opaque_linear", mutates_args=())
def opaque_linear(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    """The eager product of the packed linear `key` names (PackedLinear's, or Int8Linear's sums)."""
    return _OPAQUE[key].opaque_product(x).to(torch.float32)


@opaque_linear.register_fake
def _(x: torch.Tensor, key: int, out_features: int) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], out_features)


class PackedLinear(torch.nn.Module):
    bias: torch.Tensor | None

    def __init__(self, *linears: torch.nn.Linear):
        """One linear, or several over the same input fused into one (outputs concatenated)."""
        super().__init__()
        self.in_features, self.out_features = linears[0].in_features, sum(m.out_features for m in linears)
        weight = torch.cat([m.weight.detach() for m in linears])
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT)
        self.key = _opaque_key(self, weight)
        biases = [m.bias for m in linears]
        bias = (
            None
            if all(b is None for b in biases)
            else torch.cat(
                [m.bias.detach() if m.bias is not None else m.weight.new_zeros(m.out_features) for m in linears]
            )
        )
        # buffers, not plain attributes: a compiled step's package names its constants by these paths
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return opaque_linear(x, self.key, self.out_features)
        return self.opaque_product(x)

    def opaque_product(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


# Weights (out x in) from which an Int8Linear on torch's kernels multiplies on oneDNN's blocked layout: the 262k x 640
# head of Gemma-3-270M and a 32k-row EAGLE-3 head; not the layers' products (at most 4096 x 640), where the call's
# own overhead outweighs the gain.
PREPACK_MIN_WEIGHTS = 1 << 24

# The exact int8 products an Int8Linear can multiply with (the module's docstring says which runs where).
INT8_KERNELS = ("rows", "int_mm", "onednn")


def default_int8_kernel(weights: int) -> str:
    """The rows kernel where it runs, else torch's (`torch_int8_kernel`)."""
    return "rows" if int8_rows.available() else torch_int8_kernel(weights)


def torch_int8_kernel(weights: int) -> str:
    """oneDNN's blocked matmul for a weight of PREPACK_MIN_WEIGHTS or more on VNNI (without VNNI it is slower
    than _int_mm: docs/cpu.md, "Number formats"); else _int_mm."""
    if weights >= PREPACK_MIN_WEIGHTS and can_prepack_int8() and int8_full_range():
        return "onednn"
    return "int_mm"


def can_prepack_int8() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qlinear_prepack")


@functools.cache
def int8_full_range() -> bool:
    """Whether torch's int8 products (`torch._int_mm`, and oneDNN's blocked matmul where torch has it) multiply
    full-range int8 exactly on this CPU, as oneDNN's VNNI and AMX kernels do. Where pairs of 8-bit products are
    added in 16 bits they saturate: under ONEDNN_MAX_CPU_ISA=AVX2 random full-range products were off by up to
    3e7, and on an AVX2-only EPYC `_int_mm` was exact but the blocked matmul was not; both are exact with
    weights in [-63, 63]."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (5, 512), dtype=torch.int8, generator=generator)
    w = torch.randint(-127, 128, (64, 512), dtype=torch.int8, generator=generator)
    for rows in (1, 5):
        want = x[:rows].long() @ w.t().long()
        if not torch.equal(torch._int_mm(x[:rows], w.t()).long(), want):
            return False
        if can_prepack_int8():
            prepacked = torch.ops.onednn.qlinear_prepack(w, [_ROWS_HINT, w.shape[1]])
            scales, zero_points = torch.ones(w.shape[0]), torch.zeros(w.shape[0], dtype=torch.long)
            if not torch.equal(_onednn_products(x[:rows].float(), prepacked, scales, zero_points), want.float()):
                return False
    return True


def _onednn_products(
    quantized: torch.Tensor, prepacked, unit_scales: torch.Tensor, zero_points: torch.Tensor
) -> torch.Tensor:
    """The exact sums by oneDNN's blocked int8 matmul, as float32. It takes unsigned activations: shifted by 128,
    with 128 as their zero point; with unit scales (and zero points of 0, one per output) its float output is the
    int32 sums converted to float."""
    return torch.ops.onednn.qlinear_pointwise(
        (quantized + 128).to(torch.uint8),
        1.0,
        128,
        prepacked,
        unit_scales,
        zero_points,
        None,
        1.0,
        0,
        torch.float32,
        "none",
        [],
        "",
    )


# Rows quantized at a time: a block's passes (abs, divide, round, clamp) stay in the cache, where passes over a whole
# weight would each go to memory (the 262k-row head's fp32 copy is 671 MB).
QUANTIZE_BLOCK_ROWS = 2048


def quantize_rows(
    weights: list[torch.Tensor], levels: int, with_sums: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The weights stacked by rows, quantized to int8 with one scale per row (its largest magnitude over `levels`):
    the scales, the int8 weights and, `with_sums`, each int8 row's sum (the rows kernel's correction)."""
    rows = sum(w.shape[0] for w in weights)
    scale = torch.empty(rows)
    quantized = torch.empty(rows, weights[0].shape[1], dtype=torch.int8)
    sums = torch.empty(rows, dtype=torch.int32) if with_sums else None
    start = 0
    for weight in weights:
        for begin in range(0, weight.shape[0], QUANTIZE_BLOCK_ROWS):
            block = weight[begin : begin + QUANTIZE_BLOCK_ROWS].float()
            end = start + block.shape[0]
            block_scale = block.abs().amax(dim=1).clamp_(min=1e-12).div_(levels)
            block_int8 = (block / block_scale[:, None]).round_().clamp_(-levels, levels).to(torch.int8)
            scale[start:end], quantized[start:end] = block_scale, block_int8
            if sums is not None:
                sums[start:end] = block_int8.sum(1, dtype=torch.int32)
            start = end
    return scale, quantized, sums


class Int8Linear(torch.nn.Module):
    """int8 weights (a scale per output row) times int8 activations (a scale per input row)."""

    weight_scale: torch.Tensor
    bias: torch.Tensor | None
    rows_weight: torch.Tensor | None
    rows_sums: torch.Tensor | None

    def __init__(self, *linears: torch.nn.Linear, kernel: str | Callable[[int], str] = default_int8_kernel):
        """One linear, or several over the same input fused into one (outputs concatenated).
        kernel: which of INT8_KERNELS multiplies, or a function of the weight's size that says which."""
        super().__init__()
        self.in_features, self.out_features = linears[0].in_features, sum(m.out_features for m in linears)
        self.kernel = kernel if isinstance(kernel, str) else kernel(self.out_features * self.in_features)
        if self.kernel not in INT8_KERNELS:
            raise ValueError(f"kernel must be one of {', '.join(INT8_KERNELS)}, not {self.kernel!r}")
        if self.kernel == "rows" and not int8_rows.available():
            raise ValueError("the rows kernel needs AVX2 and a C compiler (decoder/int8_rows.py)")
        # 7 bits where oneDNN's products of 8 would saturate (no VNNI); the rows kernel is exact at 8 everywhere
        levels = 127 if self.kernel == "rows" or int8_full_range() else 63
        weights = [m.weight.detach() for m in linears]
        scale, weight_int8, row_sums = quantize_rows(weights, levels, with_sums=self.kernel == "rows")
        onednn, rows_kernel = self.kernel == "onednn", row_sums is not None
        # one of three: the weights as the rows kernel lays them out (int8_rows.laid_out), as quantized for _int_mm
        # (its [in, out] view), or oneDNN's blocked copy
        self.weight_t = None if onednn or rows_kernel else weight_int8.t()
        self.prepacked = (
            torch.ops.onednn.qlinear_prepack(weight_int8, [_ROWS_HINT, self.in_features]) if onednn else None
        )
        self._unit_scales = scale.new_ones(self.out_features) if onednn else None
        self._zero_points = torch.zeros(self.out_features, dtype=torch.long) if onednn else None
        self.key = _opaque_key(self, weight_int8)
        biases = [m.bias for m in linears]
        bias = (
            None
            if all(b is None for b in biases)
            else torch.cat(
                [m.bias.detach() if m.bias is not None else scale.new_zeros(m.out_features) for m in linears]
            )
        )
        # buffers, not plain attributes: a compiled step's package names its constants by these paths
        self.register_buffer("weight_scale", scale, persistent=False)
        self.register_buffer("bias", bias, persistent=False)
        # the rows kernel's: the weights in its layout and the sums of their rows
        self.register_buffer("rows_weight", int8_rows.laid_out(weight_int8) if rows_kernel else None, persistent=False)
        self.register_buffer("rows_sums", row_sums, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A decode step calls this ~110 times and each op costs microseconds of dispatch, so no op runs
        # that changes nothing (reshapes of 2-d rows, casts of fp32), and the scale is one op, not abs and amax.
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32:
            rows = rows.float()
        scale = torch.linalg.vector_norm(rows, float("inf"), dim=1, keepdim=True).clamp_(min=1e-12).div_(127)
        quantized = (rows / scale).round_()
        out = torch.mul(self._int_products(quantized), scale * self.weight_scale)  # int32 sums promoted to fp32
        if self.bias is not None:
            out = out + self.bias
        out = out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def _int_products(self, quantized: torch.Tensor) -> torch.Tensor:
        """The exact int32 sums of products of int8 activations (as floats, [rows, in]) and weights."""
        if torch.compiler.is_compiling():  # compiled: one opaque call, which the graph does not trace into
            if self.rows_weight is not None and self.rows_sums is not None and torch_ops.int8_rows_op():  # from C++
                return torch.ops.specdec.int8_rows(quantized, self.rows_weight, self.rows_sums)
            return opaque_linear(quantized, self.key, self.out_features)
        return self.opaque_product(quantized)

    def opaque_product(self, quantized: torch.Tensor) -> torch.Tensor:
        """The exact sums, as int32 (`_int_mm`) or as float32 (the rows kernel, oneDNN's blocked matmul)."""
        if self.rows_weight is not None and self.rows_sums is not None:
            return int8_rows.products(quantized, self.rows_weight, self.rows_sums)
        if self.weight_t is not None:
            return torch._int_mm(quantized.to(torch.int8), self.weight_t)
        assert self._unit_scales is not None and self._zero_points is not None  # set with the oneDNN kernel
        return _onednn_products(quantized, self.prepacked, self._unit_scales, self._zero_points)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-row scales, {self.kernel}"


class PackedGatedMLP(torch.nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up as one packed product."""

    def __init__(self, mlp: torch.nn.Module, linear: Callable[..., PackedLinear | Int8Linear] = PackedLinear):
        super().__init__()
        # Module attributes type as Tensor | Module; _is_gated_mlp has checked that these are Linears.
        gate_proj, up_proj, down_proj = (
            cast(torch.nn.Linear, getattr(mlp, name)) for name in ("gate_proj", "up_proj", "down_proj")
        )
        self.gate_up = linear(gate_proj, up_proj)
        self.down_proj = linear(down_proj)
        self.act_fn = cast(Callable[[torch.Tensor], torch.Tensor], mlp.act_fn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class PackedProjections(torch.nn.Module):
    """Linears over the same input as one packed product, its output split back into theirs."""

    def __init__(self, linears: list[torch.nn.Linear], linear: Callable[..., PackedLinear | Int8Linear] = PackedLinear):
        super().__init__()
        self.product = linear(*linears)
        self.sizes = [m.out_features for m in linears]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.product(x).split(self.sizes, dim=-1)


def _fusable_projections(module: torch.nn.Module, lean_int8: bool) -> dict[str, torch.nn.Linear]:
    """The linears a module names in `fusable_projections`, by name (they read the same input, and its
    forward uses `projections` once set: an EAGLE-3 draft's q, k and v, drafts/eagle3/model.py); {} if none.
    With `lean_int8` (int8, in a model lean_forward runs) also the q, k and v of its attentions (which that
    forward then reads from `projections`, and HF's could not): one activation quantization instead of three,
    and the same numbers, since each output row has its own scale. Biases are concatenated with them."""
    names = getattr(module, "fusable_projections", ())
    if not names and lean_int8 and type(module).__name__ in LEAN_ATTENTIONS:
        names = ("q_proj", "k_proj", "v_proj")
    linears = {name: getattr(module, name, None) for name in names}
    if not linears or not all(isinstance(m, torch.nn.Linear) for m in linears.values()):
        return {}
    return cast(dict[str, torch.nn.Linear], linears)


def _is_gated_mlp(module: torch.nn.Module) -> bool:
    """The HF MLPs whose forward is exactly down_proj(act_fn(gate_proj(x)) * up_proj(x))."""
    gate, up, down = (getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj"))
    return (
        type(module).__name__ in _GATED_MLPS
        and hasattr(module, "act_fn")
        and isinstance(gate, torch.nn.Linear)
        and isinstance(up, torch.nn.Linear)
        and isinstance(down, torch.nn.Linear)
        and gate.weight.shape == up.weight.shape
    )


# Each forward is down_proj(act_fn(gate_proj(x)) * up_proj(x)): the families' (families.py) and an EAGLE-3
# draft's (drafts/eagle3/model.py).
_GATED_MLPS = {family.gated_mlp for family in FAMILIES if family.gated_mlp} | {"Eagle3MLP"}


def can_pack(model) -> bool:
    return (
        model.device.type == "cpu"
        and model.dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def can_int8(model) -> bool:
    return model.device.type == "cpu" and model.dtype == torch.float32 and hasattr(torch, "_int_mm")


def pack_linear_weights(*models, int8: bool = False, int8_kernel: Callable[[int], str] = default_int8_kernel) -> int:
    """Swap the gated MLPs and every other nn.Linear of these CPU fp32 models for packed ones
    (Int8Linear ones with `int8`, multiplying with the kernel `int8_kernel` picks for a weight's size); returns
    how many nn.Linear were replaced.

    Models may share modules (a derived draft shares the target's layers and head): a shared
    module is packed once and the pack is shared too.
    """
    # id -> (original, pack); holding the original keeps its id from being reused during the pass
    packed: dict[int, tuple[torch.nn.Module, torch.nn.Module]] = {}
    replaced = 0
    linear = functools.partial(Int8Linear, kernel=int8_kernel) if int8 else PackedLinear

    def swap_children(parent: torch.nn.Module, lean_int8: bool) -> None:
        nonlocal replaced
        for name, child in list(parent.named_children()):
            if id(child) not in packed:
                if _is_gated_mlp(child):
                    packed[id(child)] = (child, PackedGatedMLP(child, linear))
                    replaced += 3
                elif isinstance(child, torch.nn.Linear):
                    packed[id(child)] = (child, linear(child))
                    replaced += 1
                else:
                    if fused := _fusable_projections(child, lean_int8):
                        child.projections = PackedProjections(list(fused.values()), linear)
                        for projection in fused:
                            delattr(child, projection)
                        replaced += len(fused)
                    swap_children(child, lean_int8)
                    continue
            setattr(parent, name, packed[id(child)][1])

    for model in models:
        if model is not None and (can_int8(model) if int8 else can_pack(model)):
            # a model left on HF's forward (a draft of a config lean_forward refuses) keeps q, k and v apart
            swap_children(model, int8 and lean_forward.supports(model))
    if packed:
        log.info("packed %d linear layers for oneDNN%s", replaced, " in int8" if int8 else "")
    return replaced
