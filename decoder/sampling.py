"""Turning logits into tokens, and the speculative acceptance rules.

The same `probabilities` transform is applied to target logits (p) and draft logits (q), so
temperature, top-k and top-p shape both identically; that is what keeps sampling lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0  # 1 means off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Rows of logits -> rows of probabilities after temperature, top-k and top-p (float32)."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))


def residual(p: torch.Tensor, q: torch.Tensor | None, drafted: int) -> torch.Tensor:
    """Chen et al.: after rejecting `drafted`, sample from norm(max(0, p - q)).

    q is None for a deterministic drafter (n-gram lookup), which is a one-hot q at `drafted`.
    """
    if q is None:
        out = p.clone()
        out[drafted] = 0.0
    else:
        out = (p - q).clamp_min(0.0)
    total = out.sum()
    # Only rounding can leave no mass (p == q exactly would have accepted); fall back to p.
    return out / total if total > 0 else p


def accept_sampled(
    p: torch.Tensor, q: torch.Tensor | None, drafts: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """Leviathan/Chen rejection sampling over one round.

    p: [k+1, V] target probabilities at the k draft positions plus the bonus position.
    q: [k, V] draft probabilities, or None for a deterministic drafter.
    Returns (number of accepted drafts n, the token that follows them).
    """
    k = drafts.numel()
    rows = torch.arange(k, device=p.device)
    p_d = p[rows, drafts]
    q_d = q[rows, drafts] if q is not None else torch.ones_like(p_d)
    u = torch.rand(k, generator=generator, device=p.device)
    rejected = (u * q_d >= p_d).nonzero()  # accept with probability min(1, p/q)
    if rejected.numel() == 0:
        return k, sample(p[k], generator)  # all accepted: a bonus token from the target
    n = int(rejected[0])
    return n, sample(residual(p[n], None if q is None else q[n], int(drafts[n])), generator)


def accept_greedy(target_logits: torch.Tensor, drafts: torch.Tensor) -> tuple[int, int]:
    """Accept the longest prefix of drafts equal to the target's argmax, then take its next argmax."""
    choice = target_logits.argmax(-1)  # [k+1]
    k = drafts.numel()
    mismatch = (choice[:k] != drafts).nonzero()
    n = int(mismatch[0]) if mismatch.numel() else k
    return n, int(choice[n])
