"""The derived draft: some of the target's own layers (copied, or fresh) under a head cut to the
draft's vocabulary, fine-tuned to agree with the target (decoder/training/trainer.py runs the loop).

Objectives (weights `ce_weight`, `kd_weight`):
- ce: next-token cross-entropy on the corpus tokens;
- kd: KL(p || q) to the target's distribution over the draft's vocabulary, full or top-k, the frozen
  target running as teacher inside each step.
Sequence-level self-distillation is a corpus (decoder/training/distill.py: target continuations) trained with ce.
Phases run in order ("pretrain then fine-tune": a general mix first, then code).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import trainer
from .corpus import Shards
from .fitness import fitness_from_logits
from .teacher import softcap_of, teacher_logits
from .trainer import LoopConfig, Phase


@dataclass(kw_only=True)
class TrainConfig(LoopConfig):
    phases: list[Phase]  # each phase's data: a corpus directory from `specdec corpus`, or loaded Shards
    dev: str | None = None
    ce_weight: float = 0.0
    kd_weight: float = 1.0
    kd_topk: int = 0  # 0: KL over the whole draft vocabulary
    eval_sequences: int = 4  # dev sequences per language
    eval_tokens: int = 256  # positions scored per dev sequence (the target's full head is costly on CPU)

    def __post_init__(self):
        super().__post_init__()
        if self.ce_weight < 0 or self.kd_weight < 0 or self.ce_weight + self.kd_weight == 0:
            raise ValueError("need ce_weight >= 0, kd_weight >= 0 and at least one > 0")
        if not self.phases or any(p.tokens <= 0 for p in self.phases):
            raise ValueError("every phase needs a positive token budget")


# --------------------------------------------------------------------------- one step


def target_logits(target, draft, ids: torch.Tensor) -> torch.Tensor:
    """The teacher: the target's logits over the draft's vocabulary (the draft's head rows are the target's,
    frozen; a draft without a sub-vocabulary has the target's whole head)."""
    hidden = target.base_model(input_ids=ids, use_cache=False).last_hidden_state
    head = draft.lm_head if getattr(draft, "vocab_ids", None) is not None else target.lm_head
    return teacher_logits(head.weight, hidden, softcap_of(target))


def draft_labels(ids: torch.Tensor, vocab_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Next-token labels in the draft's index space; tokens outside its vocabulary are ignored (-100)."""
    labels = ids[:, 1:]
    if vocab_ids is None:
        return labels
    index = torch.full((vocab_size,), -100, dtype=torch.long, device=ids.device)
    index[vocab_ids] = torch.arange(len(vocab_ids), device=ids.device)
    return index[labels]


def draft_loss(target, draft, ids: torch.Tensor, cfg: TrainConfig) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    q_logits = draft(input_ids=ids, use_cache=False).logits[:, :-1].float()
    log_q = torch.log_softmax(q_logits, -1)
    loss = torch.zeros((), device=ids.device)
    parts: dict[str, torch.Tensor] = {}
    if cfg.ce_weight:
        labels = draft_labels(ids, getattr(draft, "vocab_ids", None), target.config.vocab_size)
        ce = F.nll_loss(log_q.flatten(0, 1), labels.flatten(), ignore_index=-100)
        loss = loss + cfg.ce_weight * ce
        parts["ce"] = ce.detach()
    if cfg.kd_weight:
        with torch.no_grad():
            p_logits = target_logits(target, draft, ids)[:, :-1].float()
            p_logits = p_logits[..., : q_logits.shape[-1]]
        if cfg.kd_topk:
            values, index = p_logits.topk(cfg.kd_topk, dim=-1)
            p = torch.softmax(values, -1)
            kd = -(p * log_q.gather(-1, index)).sum(-1).mean() + (p * p.clamp_min(1e-12).log()).sum(-1).mean()
        else:
            log_p = torch.log_softmax(p_logits, -1)
            kd = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
        loss = loss + cfg.kd_weight * kd
        parts["kd"] = kd.detach()
    return loss, parts


# --------------------------------------------------------------------------- evaluation


@torch.inference_mode()
def dev_fitness(target, draft, dev: Shards, sequences: int, positions: int = 512) -> dict[str, dict[str, float]]:
    """Per-language draft fitness on dev sequences: expected acceptance, CE vs target, top-1 agreement."""
    out = {}
    for lang in dev.languages:
        ix = dev.indices_of(lang)[:sequences]
        if not len(ix):
            continue
        rows = []
        for i in ix.tolist():
            ids = dev.tokens[i : i + 1, :positions].to(target.device)
            p_logits = target(input_ids=ids, use_cache=False).logits[0]
            q_logits = draft(input_ids=ids, use_cache=False).logits[0]
            rows.append(fitness_from_logits(p_logits, q_logits, getattr(draft, "vocab_ids", None)))
        out[lang] = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0] if k != "positions"}
    if out:
        out["all"] = {k: sum(v[k] for v in out.values()) / len(out) for k in next(iter(out.values()))}
    return out


# --------------------------------------------------------------------------- the objective and its run


class DerivedObjective:
    """The derived draft's part of the loop: its owned weights, draft_loss and dev_fitness."""

    top1_key = "top1_agreement"

    def __init__(self, target, draft, params: dict[str, torch.nn.Parameter], cfg: TrainConfig):
        self.target, self.draft, self.params, self.cfg = target, draft, params, cfg
        self.dev = Shards.load(cfg.dev) if cfg.dev else None

    def parameters(self) -> dict[str, torch.nn.Parameter]:
        return self.params

    def loss(self, data: Shards, indices: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return draft_loss(self.target, self.draft, data.tokens[indices].to(self.target.device), self.cfg)

    def evaluate(self) -> dict[str, dict[str, float]] | None:
        if self.dev is None:
            return None
        return dev_fitness(self.target, self.draft, self.dev, self.cfg.eval_sequences, self.cfg.eval_tokens)

    def train_mode(self, on: bool) -> None:
        self.draft.train(on)


def train(
    target,
    draft,
    params: dict[str, torch.nn.Parameter],
    cfg: TrainConfig,
    progress: Callable[[dict], None] | None = None,
    resume: bool = True,
) -> dict:
    """Train `params` of `draft` toward `target` over the phases (trainer.train); returns the final state."""
    phases = [Phase(Shards.load(p.data) if isinstance(p.data, str) else p.data, p.tokens) for p in cfg.phases]
    objective = DerivedObjective(target, draft, params, cfg)
    return trainer.train(objective, phases, cfg, progress, resume, device=target.device)
