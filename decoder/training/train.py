"""Fine-tuning a draft to agree with its target on code.

One loop, flat functions: sample a batch (language-balanced, natural, or s-CDF-weighted), run the
frozen target as teacher where the objective needs it, step the draft, evaluate per-language
fitness on the dev split now and then, checkpoint. Phases run in order ("pretrain then
fine-tune": a general mix first, then code), sharing one optimizer and one LR schedule.

Objectives (weights `ce_weight`, `kd_weight`):
- ce: next-token cross-entropy on the corpus tokens;
- kd: KL(p || q) to the target's distribution over the draft's vocabulary, full or top-k.
Sequence-level self-distillation is a corpus (decoder/training/distill.py: target continuations) trained with ce.

Checkpoints are safetensors + JSON (weights, AdamW moments, sampler state): resuming continues
exactly where the run stopped. Nothing is pickled.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from .corpus import Shards
from .fitness import fitness_from_logits

log = logging.getLogger(__name__)


@dataclass
class Phase:
    data: str  # a corpus directory from `specdec corpus`
    tokens: int  # tokens to train on in this phase


@dataclass
class TrainConfig:
    phases: list[Phase]
    out: str
    dev: str | None = None
    ce_weight: float = 0.0
    kd_weight: float = 1.0
    kd_topk: int = 0  # 0: KL over the whole draft vocabulary
    balance: str = "natural"  # natural | uniform | scdf
    scdf_strength: float = 0.5  # s-CDF: share of sampling mass moved toward the worst-fitting languages
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 3e-4
    warmup_tokens: int = 100_000
    weight_decay: float = 0.0
    bf16: bool = False  # autocast; pays on GPUs, and on CPUs with AMX (measured 3-30x slower without)
    seed: int = 0
    eval_every: int = 200  # optimizer steps
    eval_sequences: int = 4  # dev sequences per language
    eval_tokens: int = 256  # positions scored per dev sequence (the target's full head is costly on CPU)
    checkpoint_every: int = 200
    max_seconds: float | None = None  # wall-clock limit: stop, checkpoint mid-phase, and resume on the next run

    def __post_init__(self):
        if self.balance not in ("natural", "uniform", "scdf"):
            raise ValueError(f"balance must be natural, uniform or scdf, got {self.balance!r}")
        if self.ce_weight < 0 or self.kd_weight < 0 or self.ce_weight + self.kd_weight == 0:
            raise ValueError("need ce_weight >= 0, kd_weight >= 0 and at least one > 0")
        if not self.phases or any(p.tokens <= 0 for p in self.phases):
            raise ValueError("every phase needs a positive token budget")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be positive, got {self.max_seconds}")


# --------------------------------------------------------------------------- one step


def teacher_logits(target, draft, ids: torch.Tensor) -> torch.Tensor:
    """Target logits over the draft's vocabulary: the target's final states through the draft's head rows."""
    hidden = target.base_model(input_ids=ids, use_cache=False).last_hidden_state
    if getattr(draft, "vocab_ids", None) is not None:
        return draft.lm_head(hidden)  # the draft's head rows are the target's, frozen
    return target.lm_head(hidden)


def draft_labels(ids: torch.Tensor, vocab_ids: torch.Tensor | None, vocab_size: int) -> torch.Tensor:
    """Next-token labels in the draft's index space; tokens outside its vocabulary are ignored (-100)."""
    labels = ids[:, 1:]
    if vocab_ids is None:
        return labels
    index = torch.full((vocab_size,), -100, dtype=torch.long, device=ids.device)
    index[vocab_ids] = torch.arange(len(vocab_ids), device=ids.device)
    return index[labels]


def draft_loss(target, draft, ids: torch.Tensor, cfg: TrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
    q_logits = draft(input_ids=ids, use_cache=False).logits[:, :-1].float()
    log_q = torch.log_softmax(q_logits, -1)
    loss = torch.zeros((), device=ids.device)
    parts: dict[str, float] = {}
    if cfg.ce_weight:
        labels = draft_labels(ids, getattr(draft, "vocab_ids", None), target.config.vocab_size)
        ce = F.nll_loss(log_q.flatten(0, 1), labels.flatten(), ignore_index=-100)
        loss = loss + cfg.ce_weight * ce
        parts["ce"] = ce.item()
    if cfg.kd_weight:
        with torch.no_grad():
            p_logits = teacher_logits(target, draft, ids)[:, :-1].float()
            p_logits = p_logits[..., : q_logits.shape[-1]]
        if cfg.kd_topk:
            values, index = p_logits.topk(cfg.kd_topk, dim=-1)
            p = torch.softmax(values, -1)
            kd = -(p * log_q.gather(-1, index)).sum(-1).mean() + (p * p.clamp_min(1e-12).log()).sum(-1).mean()
        else:
            log_p = torch.log_softmax(p_logits, -1)
            kd = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
        loss = loss + cfg.kd_weight * kd
        parts["kd"] = kd.item()
    parts["loss"] = loss.item()
    return loss, parts


# --------------------------------------------------------------------------- sampling


class BatchSampler:
    """Draws sequence indices: by the corpus mix, languages uniformly, or by s-CDF weights."""

    def __init__(self, shards: Shards, balance: str, seed: int):
        self.shards = shards
        self.balance = balance
        self.generator = torch.Generator().manual_seed(seed)
        self.by_language = [shards.indices_of(lang) for lang in shards.languages]
        present = torch.tensor([len(ix) > 0 for ix in self.by_language], dtype=torch.float)
        self.weights = present / present.sum()

    def set_fitness(self, fitness: dict[str, float], strength: float) -> None:
        """s-CDF-style reweighting: languages whose draft fits the target worst get sampled more.

        Each language's weight mixes uniform with its rank in the empirical CDF of misfit (1 - expected
        acceptance): w = (1 - s) / K + s * rank / sum(ranks), over the K languages present.
        """
        if self.balance != "scdf":
            return
        langs = [lang for lang, ix in zip(self.shards.languages, self.by_language) if len(ix) and lang in fitness]
        if not langs:
            return
        order = sorted(langs, key=lambda lang: fitness[lang], reverse=True)  # best fit first, rank 1
        ranks = {lang: i + 1 for i, lang in enumerate(order)}
        total = sum(ranks.values())
        weights = torch.zeros(len(self.shards.languages))
        for i, lang in enumerate(self.shards.languages):
            if lang in ranks:
                weights[i] = (1 - strength) / len(langs) + strength * ranks[lang] / total
        self.weights = weights / weights.sum()

    def sample(self, n: int) -> torch.Tensor:
        if self.balance == "natural":
            return torch.randint(len(self.shards.tokens), (n,), generator=self.generator)
        langs = torch.multinomial(self.weights, n, replacement=True, generator=self.generator)
        picks = []
        for lang in langs.tolist():
            pool = self.by_language[lang]
            picks.append(pool[torch.randint(len(pool), (1,), generator=self.generator)])
        return torch.cat(picks)

    def state(self) -> dict:
        return {"generator": self.generator.get_state().tolist(), "weights": self.weights.tolist()}

    def load_state(self, state: dict) -> None:
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        self.weights = torch.tensor(state["weights"])


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


# --------------------------------------------------------------------------- checkpoints


def save_checkpoint(folder: Path, params: dict[str, torch.nn.Parameter], optimizer, state: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    # Each file is written aside, then renamed into place, the state last: a crash while writing
    # (the slow part) leaves the previous checkpoint untouched.
    weights = {n: p.detach().cpu().contiguous() for n, p in params.items()}
    save_file(weights, str(folder / "weights.safetensors.tmp"))
    moments, steps = {}, {}
    for i, p in enumerate(params.values()):
        s = optimizer.state.get(p)
        if s:
            moments[f"{i}.exp_avg"] = s["exp_avg"].cpu().contiguous()
            moments[f"{i}.exp_avg_sq"] = s["exp_avg_sq"].cpu().contiguous()
            steps[str(i)] = float(s["step"])
    if moments:
        save_file(moments, str(folder / "optimizer.safetensors.tmp"))
    (folder / "state.json.tmp").write_text(json.dumps(state | {"adam_steps": steps}))
    for name in ("weights.safetensors", "optimizer.safetensors", "state.json"):
        if (folder / f"{name}.tmp").exists():
            (folder / f"{name}.tmp").replace(folder / name)


def load_checkpoint(folder: Path, params: dict[str, torch.nn.Parameter], optimizer) -> dict:
    state = json.loads((folder / "state.json").read_text())
    weights = load_file(str(folder / "weights.safetensors"))
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])
    if (folder / "optimizer.safetensors").exists():
        moments = load_file(str(folder / "optimizer.safetensors"))
        for i, p in enumerate(params.values()):
            if str(i) in state["adam_steps"]:
                optimizer.state[p] = {
                    "step": torch.tensor(state["adam_steps"][str(i)]),
                    "exp_avg": moments[f"{i}.exp_avg"].to(p.device),
                    "exp_avg_sq": moments[f"{i}.exp_avg_sq"].to(p.device),
                }
    return state


# --------------------------------------------------------------------------- the loop


def learning_rate(cfg: TrainConfig, tokens_seen: int, total: int) -> float:
    if tokens_seen < cfg.warmup_tokens:
        return cfg.lr * (tokens_seen + 1) / cfg.warmup_tokens
    progress = (tokens_seen - cfg.warmup_tokens) / max(1, total - cfg.warmup_tokens)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def train(
    target,
    draft,
    params: dict[str, torch.nn.Parameter],
    cfg: TrainConfig,
    progress: Callable[[dict], None] | None = None,
    resume: bool = True,
) -> dict:
    """Train `params` of `draft` toward `target` over the phases; returns the final state.

    `progress` receives a record after every optimizer step (tokens, loss, tok/s, phase). With
    `cfg.max_seconds`, the loop stops after the step that crosses it and checkpoints where it is
    (phase, sampler); the returned state's "complete" is then False and a resumed run goes on.
    """
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    device = target.device
    optimizer = torch.optim.AdamW(list(params.values()), lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=False)
    dev = Shards.load(cfg.dev) if cfg.dev else None
    checkpoint = out / "checkpoint"
    # JSON-shaped: saved to and resumed from state.json
    state: dict[str, Any] = {"phase": 0, "phase_tokens": 0, "tokens": 0, "step": 0, "sampler": None, "evals": []}
    if resume and (checkpoint / "state.json").exists():
        state = load_checkpoint(checkpoint, params, optimizer)
        log.info("resumed at step %d (%d tokens)", state["step"], state["tokens"])
    total = sum(p.tokens for p in cfg.phases)
    log_file = open(out / "train_log.jsonl", "a")
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16)
    deadline = time.perf_counter() + cfg.max_seconds if cfg.max_seconds else None
    out_of_time = False
    draft.train()
    try:
        if dev is not None and state["step"] == 0:
            _evaluate(target, draft, dev, cfg, None, state, log_file)  # the untrained baseline
        for phase_index in range(state["phase"], len(cfg.phases)):
            phase = cfg.phases[phase_index]
            shards = Shards.load(phase.data)
            sampler = BatchSampler(shards, cfg.balance, cfg.seed + phase_index)
            if state["sampler"] and state["phase"] == phase_index:
                sampler.load_state(state["sampler"])
            seq_len = shards.tokens.shape[1]
            step_tokens = cfg.batch_size * cfg.grad_accum * seq_len
            started, tokens_at_start = time.perf_counter(), state["tokens"]
            while state["phase_tokens"] + step_tokens <= max(phase.tokens, step_tokens):
                lr = learning_rate(cfg, state["tokens"], total)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                parts_sum: dict[str, float] = {}
                for _ in range(cfg.grad_accum):
                    ids = shards.tokens[sampler.sample(cfg.batch_size)].to(device)
                    with autocast:
                        loss, parts = draft_loss(target, draft, ids, cfg)
                    (loss / cfg.grad_accum).backward()
                    for k, v in parts.items():
                        parts_sum[k] = parts_sum.get(k, 0.0) + v / cfg.grad_accum
                torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                state["step"] += 1
                state["tokens"] += step_tokens
                state["phase_tokens"] += step_tokens
                elapsed = time.perf_counter() - started
                record = {
                    "step": state["step"],
                    "phase": phase_index,
                    "tokens": state["tokens"],
                    "lr": lr,
                    "tokens_per_s": (state["tokens"] - tokens_at_start) / elapsed if elapsed else 0.0,
                    **parts_sum,
                }
                log_file.write(json.dumps(record) + "\n")
                if progress:
                    progress(record)
                if dev is not None and state["step"] % cfg.eval_every == 0:
                    _evaluate(target, draft, dev, cfg, sampler, state, log_file)
                if state["step"] % cfg.checkpoint_every == 0:
                    state["sampler"] = sampler.state()
                    save_checkpoint(checkpoint, params, optimizer, state)
                if deadline is not None and time.perf_counter() >= deadline:
                    out_of_time = True
                    state["sampler"] = sampler.state()  # the final checkpoint below resumes inside this phase
                    break
            if out_of_time:
                break
            state.update(phase=phase_index + 1, phase_tokens=0, sampler=None)
        if dev is not None:
            _evaluate(target, draft, dev, cfg, None, state, log_file)
        state["complete"] = not out_of_time
        save_checkpoint(checkpoint, params, optimizer, state)
    finally:
        log_file.close()
        draft.eval()
    return state


def _evaluate(
    target, draft, dev: Shards, cfg: TrainConfig, sampler: BatchSampler | None, state: dict, log_file
) -> None:
    draft.eval()
    fitness = dev_fitness(target, draft, dev, cfg.eval_sequences, cfg.eval_tokens)
    draft.train()
    record_evaluation(fitness, sampler, cfg.scdf_strength, state, log_file, top1_key="top1_agreement")


def record_evaluation(
    fitness: dict[str, dict[str, float]],
    sampler: BatchSampler | None,
    scdf_strength: float,
    state: dict,
    log_file,
    top1_key: str,
) -> None:
    """What a dev evaluation feeds: s-CDF's language weights (the sampler's), the run's state and its
    log file. Shared with decoder/training/eagle3.py, whose fitness names top-1 per TTT step."""
    if sampler is not None:
        sampler.set_fitness({k: v["expected_acceptance"] for k, v in fitness.items() if k != "all"}, scdf_strength)
    entry = {"step": state["step"], "tokens": state["tokens"], "dev": fitness}
    state["evals"].append(entry)
    log_file.write(json.dumps(entry) + "\n")
    log_file.flush()
    if "all" in fitness:
        log.info(
            "step %d: dev expected acceptance %.3f, top-1 %.3f",
            state["step"],
            fitness["all"]["expected_acceptance"],
            fitness["all"][top1_key],
        )
