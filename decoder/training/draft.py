"""A trainable draft, and the sub-vocabulary its head is cut to. Saving and loading it is
decoder/drafts/trained.py, the one module that knows the draft's file format."""

from __future__ import annotations

import torch

from ..drafts.derived import layer_list_name
from ..drafts.trained import draft_with_own_layers, owned_parameters, restrict_head

INITS = ("derived", "scratch")


def build_draft(target, layers: list[int], init: str = "derived", vocab_ids: torch.Tensor | None = None):
    """A draft with its own copies of `layers` (init "derived") or fresh ones (init "scratch"), and
    with `vocab_ids` a head over those target ids; what it owns (`owned_parameters`) is trainable.

    Embeddings, rotary tables and (without `vocab_ids`) the head stay shared with the target and frozen.
    """
    if init not in INITS:
        raise ValueError(f"draft init must be derived or scratch, got {init!r}")
    draft = draft_with_own_layers(target, layers)
    if init == "scratch":
        for module in getattr(draft.base_model, layer_list_name(draft.base_model)).modules():
            target._init_weights(module)
    if vocab_ids is not None:
        restrict_head(draft, target, vocab_ids)
    for p in owned_parameters(draft).values():
        p.requires_grad_(True)
    return draft.eval()


def token_counts(tokens: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """How often each of `ids` occurs in `tokens` (a head's `vocab_counts`: trained.write_vocabulary)."""
    ids = ids.long().cpu()
    return torch.bincount(tokens.flatten().long(), minlength=int(ids.max()) + 1)[ids]


def frequent_token_ids(tokens: torch.Tensor, size: int, always: list[int], vocab_size: int) -> torch.Tensor:
    """The `size` most frequent ids in `tokens`, plus `always` (specials such as EOS), sorted."""
    counts = torch.bincount(tokens.flatten().long(), minlength=vocab_size)
    for i in always:
        counts[i] = counts.max() + 1
    ids = counts.topk(min(size, vocab_size)).indices
    return ids.sort().values
