"""Turning logits into tokens, and the speculative acceptance rules.

The same `probabilities` transform is applied to target logits (p) and draft logits (q), so
temperature, top-k and top-p shape both identically; that is what keeps sampling lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import greedy_rows


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


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw from each row of `probs` (unnormalized is fine), as a device tensor of ids.

    The Exponential race: argmax(p / E) with E ~ Exp(1) i.i.d. picks i with probability p_i / Σp,
    without multinomial's host-side checks. E = -log(U) with U in [0, 1) is never 0, so a token of
    probability 0 never wins.
    """
    race = torch.rand(probs.shape, generator=generator, device=probs.device).log_().neg_()
    return (probs / race).argmax(-1)


def draw_draft(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, min_confidence: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """A model draft's next token from its logits [1, V']: (its index [1], and its probabilities
    [1, V'] when sampling, the q of the acceptance test), or None where the draft's top
    probability is under `min_confidence`: its drafting stops there."""
    probs = probabilities(logits, params) if not params.greedy or min_confidence else None
    if probs is not None and min_confidence and float(probs.max()) < min_confidence:
        return None
    if params.greedy or probs is None:
        return logits.argmax(-1), None
    return sample(probs, generator), probs


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Chen et al.: after a rejection, sample from norm(max(0, p - q)) (left unnormalized for `sample`).

    q is one-hot for a deterministic drafter (n-gram lookup), which zeroes the rejected token;
    after every draft was accepted q is all zeros, and this is p itself, for the bonus token.
    """
    out = (p - q).clamp_min(0.0)
    # Only rounding can leave no mass (p == q exactly would have accepted); fall back to p.
    return torch.where(out.sum() > 0, out, p)


def accept_sampled(
    p: torch.Tensor, q: torch.Tensor | None, drafts: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Leviathan/Chen rejection sampling over one round, on the device (no host sync).

    p: [k+1, V] target probabilities at the k draft positions plus the bonus position.
    q: [k, V] draft probabilities, or None for a deterministic drafter.
    Returns [n, token]: the number of accepted drafts, and the token that follows them.
    """
    k, vocab = drafts.numel(), p.shape[-1]
    rows = torch.arange(k, device=p.device)
    p_d = p[rows, drafts]
    q_d = q[rows, drafts] if q is not None else torch.ones_like(p_d)
    u = torch.rand(k, generator=generator, device=p.device)
    n = (u * q_d < p_d).long().cumprod(0).sum()  # accept each with probability min(1, p/q), up to the first miss
    at = n.view(1)  # a 1-element index gathers on the device; a 0-dim one would be read back to the host
    # q where the round stopped; past the last draft it is zeros, leaving p for the bonus token
    if q is None:  # one-hot at the drafted token
        q_at = torch.zeros(vocab, device=p.device, dtype=p.dtype).scatter_(
            0, torch.cat([drafts, drafts.new_zeros(1)])[at], (n < k).to(p.dtype).view(1)
        )
    else:
        q_at = q[at.clamp_max(k - 1)][0] * (n < k)
    token = sample(residual(p[at][0], q_at), generator)
    return torch.stack([n, token])


def accept_greedy(
    target_logits: torch.Tensor, drafts: torch.Tensor, drafted: torch.Tensor | None = None
) -> torch.Tensor:
    """Accept the longest prefix of drafts equal to the target's argmax, then take its next argmax.
    drafted: how many of `drafts` are real (a device scalar), where the rest pad a fixed shape.

    Returns [n, token] on the device, like accept_sampled.
    """
    choice = target_logits.argmax(-1)  # [k+1]
    matches = choice[: drafts.numel()] == drafts
    if drafted is not None:
        matches &= torch.arange(drafts.numel(), device=drafts.device) < drafted
    n = matches.long().cumprod(0).sum()
    return torch.stack([n, choice[n.view(1)][0]])


def greedy_verdict_on_host(target_logits: torch.Tensor, drafts: torch.Tensor) -> list[float]:
    """`verdict` of a greedy round where reading a value back costs nothing (the CPU): the round is decided first
    (`accept_greedy`), and the log-normalizer taken only over the rows committed, not those past the first miss.
    `verdict(...).tolist()`'s values up to the rows committed: [n, token] and n + 1 log-probabilities. Float32
    logits go to the greedy rows kernel where it runs (greedy_rows.py), a few times faster than torch here."""
    if greedy_rows.usable(target_logits):
        choice, maxima = greedy_rows.first_maxima(target_logits)
        wanted = drafts.tolist()
        n = next((i for i, token in enumerate(wanted) if choice[i] != token), len(wanted))
        return [n, choice[n], *greedy_rows.log_probabilities(target_logits, [*wanted[:n], choice[n]], maxima)]
    decided = accept_greedy(target_logits, drafts)
    n = int(decided[0])
    return verdict(target_logits[: n + 1], drafts[:n], decided).tolist()


def verdict(target_logits: torch.Tensor, drafts: torch.Tensor, decided: torch.Tensor) -> torch.Tensor:
    """A round's outcome as one float64 tensor, read back in one transfer: [n, token] (`decided`) and the
    target's log-probability of the token each row commits (its draft; past the drafts, the decided token),
    under its raw logits. Float64 holds the token ids exactly; the log-probabilities are taken in float32
    (bf16 logits widened), 4x cheaper than float64 over a 262k vocabulary."""
    rows = torch.arange(target_logits.shape[0], device=target_logits.device)
    taken = torch.where(rows == decided[0], decided[1], torch.cat([drafts, decided[1:]]))
    logprob = target_logits.gather(-1, taken.view(-1, 1)).squeeze(-1).float() - torch.logsumexp(
        target_logits.float(), -1
    )
    return torch.cat([decided.double(), logprob.double()])
