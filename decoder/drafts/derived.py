"""Drafts cut from the target itself: some of its decoder layers, and heads over some of its rows."""

from __future__ import annotations

import copy

import torch
from transformers import AutoModelForCausalLM


def layer_list_name(base) -> str:
    """The attribute of `base` (a model's base_model) that holds its decoder layers."""
    for name in ("layers", "h", "blocks"):
        if isinstance(getattr(base, name, None), torch.nn.ModuleList):
            return name
    raise ValueError(f"cannot find the decoder layers of {type(base).__name__}")


def derive_draft(target, layers: list[int]):
    """A draft made of some of the target's own decoder layers, sharing its embeddings, norm and head.

    Nothing is copied: the draft's modules are the target's, so it costs no memory. The draft
    keeps its own KV cache, indexed by the original layer numbers.
    """
    base = target.base_model
    layer_attr = layer_list_name(base)
    total = len(getattr(base, layer_attr))
    if not layers or any(not 0 <= i < total for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"draft layers must be distinct indices in [0, {total}), got {layers}")
    if 0 not in layers:
        # the cache reports its length from layer 0, and positions come from that length
        raise ValueError("draft layers must include layer 0")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)  # GPT-2 aliases n_layer to this
    if getattr(config, "layer_types", None):
        config.layer_types = [target.config.layer_types[i] for i in layers]
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(config)
    draft_base = draft.base_model
    for name, _ in list(draft_base.named_children()):
        if name == layer_attr:
            setattr(draft_base, name, torch.nn.ModuleList(getattr(base, layer_attr)[i] for i in layers))
        else:
            setattr(draft_base, name, getattr(base, name))
    for name, _ in list(draft.named_children()):
        if name != draft.base_model_prefix:
            setattr(draft, name, getattr(target, name))
    if any(t.is_meta for t in list(draft.parameters()) + list(draft.buffers())):
        raise ValueError(f"could not share every module of {type(target).__name__} with the draft")
    draft.generation_config = copy.deepcopy(target.generation_config)
    draft.eval().requires_grad_(False)
    return draft


def head_rows(head: torch.nn.Linear, ids: torch.Tensor) -> torch.nn.Linear:
    """A frozen copy of `head` that scores only the target ids `ids`: a reduced vocabulary's head."""
    ids = ids.to(device=head.weight.device, dtype=torch.long)
    # skip_init: the random initialization a Linear makes, about 0.5 s for 32k rows, is overwritten at once
    rows = torch.nn.utils.skip_init(
        torch.nn.Linear,
        head.in_features,
        len(ids),
        bias=head.bias is not None,
        device=head.weight.device,
        dtype=head.weight.dtype,
    )
    with torch.no_grad():
        rows.weight.copy_(head.weight[ids])
        if head.bias is not None:
            rows.bias.copy_(head.bias[ids])
    return rows.requires_grad_(False)
