"""How well a draft fits the target on real text, measured teacher-forced in one pass each.

- expected_acceptance: mean over positions of Σ_x min(p(x), q(x)), the probability that one
  sampled draft token is accepted (α in Leviathan et al.);
- top1_agreement: how often argmax q == argmax p, which is greedy acceptance;
- cross_entropy: -Σ p log q over the draft's vocabulary, the draft's fit to the target (nats).
"""

from __future__ import annotations

import torch


def fitness_from_logits(
    p_logits: torch.Tensor, q_logits: torch.Tensor, vocab_ids: torch.Tensor | None = None
) -> dict[str, float]:
    """Fitness from [positions, V] target logits and [positions, V'] draft logits.

    q covers target ids `vocab_ids` (a sub-vocabulary head), or ids 0..V'-1 (a head no wider than
    the target's). q is 0 elsewhere, which adds nothing to Σ min(p, q), as in the engine.
    """
    p = torch.softmax(p_logits.float(), -1)
    if vocab_ids is None:
        width = min(p.shape[-1], q_logits.shape[-1])
        vocab_ids = torch.arange(width, device=p.device)
        q_logits = q_logits[:, :width]
    log_q = torch.log_softmax(q_logits.float(), -1)
    p_on_q = p[:, vocab_ids]
    return {
        "expected_acceptance": float(torch.minimum(p_on_q, log_q.exp()).sum(-1).mean()),
        "top1_agreement": float((p.argmax(-1) == vocab_ids[log_q.argmax(-1)]).float().mean()),
        "cross_entropy": float(-(p_on_q * log_q).sum(-1).mean()),
        "positions": p.shape[0],
    }
