"""The teacher every kind of draft learns from: the target's next-token logits over the draft's
vocabulary only, its head rows (the draft's frozen head) on its final normed states, soft-capped as
the target's own forward caps them (decoder/kv_cache.py, `head_logits`). A 32k-row teacher costs an
eighth of Gemma-3's 262k-row head, and it is all a draft can be trained toward."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def teacher_logits(head_weight: torch.Tensor, final_hidden: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """[..., V'] logits of final states [..., h] through head rows [V', h]."""
    logits = F.linear(final_hidden.to(head_weight.dtype), head_weight)
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def softcap_of(target) -> float | None:
    """The target's final_logit_softcapping (Gemma 2), or None."""
    return getattr(target.config.get_text_config(), "final_logit_softcapping", None)
