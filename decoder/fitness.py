"""How well a draft fits the target on real text, measured teacher-forced in one pass each.

- expected_acceptance: mean over positions of Σ_x min(p(x), q(x)), the probability that one
  sampled draft token is accepted (α in Leviathan et al.);
- top1_agreement: how often argmax q == argmax p, which is greedy acceptance;
- cross_entropy: -Σ p log q, the draft's fit to the target's full distribution (nats).
"""

from __future__ import annotations

import torch


@torch.inference_mode()
def draft_fitness(target, draft, ids: list[int]) -> dict[str, float]:
    input_ids = torch.tensor([ids], device=target.device)
    p_logits = target(input_ids=input_ids, use_cache=False).logits[0].float()
    # no cache: a draft made of non-adjacent layers would index a config-sized cache out of range
    q_logits = draft(input_ids=input_ids, use_cache=False).logits[0].float()
    # p over the target's whole vocabulary; a narrower draft head has q = 0 beyond its width,
    # which adds nothing to Σ min(p, q) (the engine pads q with zeros the same way)
    p = torch.softmax(p_logits, -1)
    width = min(p.shape[-1], q_logits.shape[-1])
    log_q = torch.log_softmax(q_logits[:, :width], -1)
    p = p[:, :width]
    return {
        "expected_acceptance": float(torch.minimum(p, log_q.exp()).sum(-1).mean()),
        "top1_agreement": float((p_logits.argmax(-1) == log_q.argmax(-1)).float().mean()),
        "cross_entropy": float(-(p * log_q).sum(-1).mean()),  # over the draft's vocabulary
        "positions": len(ids),
    }
