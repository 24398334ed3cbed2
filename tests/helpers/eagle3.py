"""An EAGLE-3 draft for a tiny target, as the drafter tests build it."""

from __future__ import annotations

import torch

from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, init_from_target


def make_draft(target, vocab: str = "half", seed: int = 0, taps=None):
    """A draft over half the target's vocabulary (at random) or all of it, its weights scaled up."""
    rows = target.get_output_embeddings().out_features
    if vocab == "half":
        ids = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))[: rows // 2].sort().values
    else:
        ids = torch.arange(rows)
    shape = Eagle3Shape.for_target(target, draft_vocab=len(ids), aux_layers=taps)
    draft = init_from_target(shape, target, ids, seed=seed)
    with torch.no_grad():  # bigger weights than the init's: drafts then differ from step to step
        for p in draft.parameters():
            if p.requires_grad and p.dim() == 2:
                p.mul_(10)
    return draft.eval().requires_grad_(False)
