"""Linear layers on oneDNN-packed weights, for batch-1 decoding on the CPU.

MKL's fp32 GEMM, which `nn.Linear` uses on the CPU, is slow for the few-row inputs of decoding:
on the 2-core EPYC of docs/benchmarks, a 5-row product with Gemma-3's 262k x 640 head took
145 ms against 51 ms for one row, so verifying γ drafts cost 2.2x a plain step. With the weights
reordered once into oneDNN's blocked layout (what inductor does under `freezing`), one row
takes 27 ms, near the memory-bandwidth bound, and five rows 37 ms. That is what makes verifying
a few drafts nearly as cheap as one step, the premise of speculative decoding.

Packing is for inference only: packed weights have no gradient and no `.weight` to read, so it
is applied after every draft has been built from the target.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)

# The packed layout depends a little on the expected row count; decoding feeds 1 to γ+1 rows.
_ROWS_HINT = 8


class PackedLinear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), _ROWS_HINT)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed=oneDNN"


def can_pack(model) -> bool:
    return (model.device.type == "cpu" and model.dtype == torch.float32
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def pack_linear_weights(*models) -> int:
    """Swap every nn.Linear of these CPU fp32 models for a PackedLinear; returns how many were swapped.

    Models may share modules (a derived draft shares the target's layers and head): a shared
    Linear is packed once and the pack is shared too.
    """
    packed: dict[int, PackedLinear] = {}
    for model in models:
        if model is None or not can_pack(model):
            continue
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    if id(child) not in packed:
                        packed[id(child)] = PackedLinear(child)
                    setattr(parent, name, packed[id(child)])
    if packed:
        log.info("packed %d linear layers for oneDNN", len(packed))
    return len(packed)
