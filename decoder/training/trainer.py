"""The one training loop, for every kind of draft (speculators' `Trainer` is the model).

A kind of draft is an `Objective`: its trainable weights, the loss of a batch of corpus sequences
(whatever it runs to get there: a frozen target as teacher, or stored target features), and its
per-language dev fitness. The loop owns everything else: phases of corpora sampled by language
(natural, uniform or s-CDF), the LR schedule, AdamW with gradient accumulation and clipping, a
wall-clock limit, dev evaluations before, during and after, and checkpoints that resume exactly.

Built for a GPU as much as for the CPU: a step's losses stay on the device and are read back once
every `log_every` steps, so a step queues its kernels without waiting for them; a batch that does
not fit in the GPU's memory is split (half the rows, twice the accumulation) and the step retried.

Checkpoints are safetensors + JSON (weights, AdamW moments, sampler state). Nothing is pickled.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import load_file, save_file

log = logging.getLogger(__name__)

BALANCES = ("natural", "uniform", "scdf")


class Dataset(Protocol):
    """Corpus sequences the sampler draws from: corpus.py's Shards, eagle3.py's FeatureShards or OnlineFeatures."""

    tokens: torch.Tensor  # [N, L]
    languages: list[str]

    def indices_of(self, language: str) -> torch.Tensor: ...


class Objective(Protocol):
    """What a kind of draft supplies to the loop."""

    top1_key: str  # the key of its dev fitness that says greedy agreement, for the log line

    def parameters(self) -> dict[str, torch.nn.Parameter]: ...

    def loss(self, data: Any, indices: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of sequences `indices` of `data`, and its parts as detached device scalars."""
        ...

    def evaluate(self) -> dict[str, dict[str, float]] | None:
        """Per-language dev fitness (with an "all" row), or None without a dev set."""
        ...

    def train_mode(self, on: bool) -> None: ...


@dataclass
class Phase:
    data: Any  # a Dataset
    tokens: int  # tokens to train on in this phase


@dataclass(kw_only=True)
class LoopConfig:
    out: str
    balance: str = "natural"  # natural | uniform | scdf
    scdf_strength: float = 0.5  # s-CDF: share of sampling mass moved toward the worst-fitting languages
    batch_size: int = 4
    grad_accum: int = 1
    lr: float = 3e-4
    warmup_tokens: int = 100_000
    weight_decay: float = 0.0
    bf16: bool = False  # autocast; pays on GPUs and on CPUs with AMX, costs elsewhere (docs/cpu.md, "Number formats")
    seed: int = 0
    eval_every: int = 200  # optimizer steps
    checkpoint_every: int = 200
    log_every: int = 1  # optimizer steps between reading the losses back (one host sync each)
    max_seconds: float | None = None  # wall-clock limit: stop, checkpoint mid-phase, and resume on the next run

    def __post_init__(self):
        if self.balance not in BALANCES:
            raise ValueError(f"balance must be natural, uniform or scdf, got {self.balance!r}")
        if self.batch_size < 1 or self.grad_accum < 1 or self.log_every < 1:
            raise ValueError("need batch_size >= 1, grad_accum >= 1 and log_every >= 1")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be positive, got {self.max_seconds}")


# --------------------------------------------------------------------------- sampling


class BatchSampler:
    """Draws sequence indices: by the corpus mix, languages uniformly, or by s-CDF weights."""

    def __init__(self, data: Dataset, balance: str, seed: int):
        self.data = data
        self.balance = balance
        self.generator = torch.Generator().manual_seed(seed)
        self.by_language = [data.indices_of(lang) for lang in data.languages]
        present = torch.tensor([len(ix) > 0 for ix in self.by_language], dtype=torch.float)
        self.weights = present / present.sum()

    def set_fitness(self, fitness: dict[str, float], strength: float) -> None:
        """s-CDF-style reweighting: languages whose draft fits the target worst get sampled more.

        Each language's weight mixes uniform with its rank in the empirical CDF of misfit (1 - expected
        acceptance): w = (1 - s) / K + s * rank / sum(ranks), over the K languages present.
        """
        if self.balance != "scdf":
            return
        langs = [lang for lang, ix in zip(self.data.languages, self.by_language) if len(ix) and lang in fitness]
        if not langs:
            return
        order = sorted(langs, key=lambda lang: fitness[lang], reverse=True)  # best fit first, rank 1
        ranks = {lang: i + 1 for i, lang in enumerate(order)}
        total = sum(ranks.values())
        weights = torch.zeros(len(self.data.languages))
        for i, lang in enumerate(self.data.languages):
            if lang in ranks:
                weights[i] = (1 - strength) / len(langs) + strength * ranks[lang] / total
        self.weights = weights / weights.sum()

    def sample(self, n: int) -> torch.Tensor:
        if self.balance == "natural":
            return torch.randint(len(self.data.tokens), (n,), generator=self.generator)
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
                # a fused or capturable AdamW keeps its step count on the parameter's device
                step = torch.tensor(state["adam_steps"][str(i)], device=p.device if p.is_cuda else None)
                optimizer.state[p] = {
                    "step": step,
                    "exp_avg": moments[f"{i}.exp_avg"].to(p.device),
                    "exp_avg_sq": moments[f"{i}.exp_avg_sq"].to(p.device),
                }
    return state


# --------------------------------------------------------------------------- the loop


def learning_rate(cfg: LoopConfig, tokens_seen: int, total: int, time_spent: float = 0.0) -> float:
    """Linear warmup, then a cosine down to a tenth of `cfg.lr` over the tokens, or over the time limit
    (`time_spent`, its share used so far) where that ends the run first: a lent GPU's run is cut by
    the clock long before its token budget, and should still end on a low learning rate."""
    if tokens_seen < cfg.warmup_tokens:
        return cfg.lr * (tokens_seen + 1) / cfg.warmup_tokens
    progress = max((tokens_seen - cfg.warmup_tokens) / max(1, total - cfg.warmup_tokens), time_spent)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def new_optimizer(params: dict[str, torch.nn.Parameter], cfg: LoopConfig) -> torch.optim.AdamW:
    on_gpu = any(p.is_cuda for p in params.values())
    # fused on a GPU: one kernel for every tensor; per tensor on the CPU, as the rehearsals were measured
    return torch.optim.AdamW(
        list(params.values()),
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        foreach=False if not on_gpu else None,
        fused=True if on_gpu else None,
    )


def train(
    objective: Objective,
    phases: list[Phase],
    cfg: LoopConfig,
    progress: Callable[[dict], None] | None = None,
    resume: bool = True,
    device: torch.device | str = "cpu",
) -> dict:
    """Train `objective`'s parameters over `phases`; returns the final state.

    `progress` receives a record every `cfg.log_every` optimizer steps (tokens, the mean loss and parts
    over those steps, tok/s, phase). With `cfg.max_seconds` the loop stops after the step that crosses
    it and checkpoints where it is (phase, sampler); the state's "complete" is then False, and a run
    with the same `cfg.out` resumes. The dev set is evaluated before the first step, every
    `cfg.eval_every` steps and at the end, also an end set by the clock.
    """
    if not phases or any(p.tokens <= 0 for p in phases):
        raise ValueError("every phase needs a positive token budget")
    device = torch.device(device)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    params = objective.parameters()
    optimizer = new_optimizer(params, cfg)
    checkpoint = out / "checkpoint"
    # JSON-shaped: saved to and resumed from state.json
    state: dict[str, Any] = {"phase": 0, "phase_tokens": 0, "tokens": 0, "step": 0, "sampler": None, "evals": []}
    if resume and (checkpoint / "state.json").exists():
        state = load_checkpoint(checkpoint, params, optimizer)
        log.info("resumed at step %d (%d tokens)", state["step"], state["tokens"])
    total = sum(p.tokens for p in phases)
    batch_size, grad_accum = cfg.batch_size, cfg.grad_accum
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16)
    deadline = time.perf_counter() + cfg.max_seconds if cfg.max_seconds else None
    out_of_time = False
    log_file = open(out / "train_log.jsonl", "a")
    started, tokens_at_start = time.perf_counter(), state["tokens"]
    objective.train_mode(True)
    try:
        if state["step"] == 0 and not state["evals"]:
            _evaluate(objective, None, cfg, state, log_file)  # the untrained (or initial) baseline
        for phase_index in range(state["phase"], len(phases)):
            phase = phases[phase_index]
            sampler = BatchSampler(phase.data, cfg.balance, cfg.seed + phase_index)
            if state["sampler"] and state["phase"] == phase_index:
                sampler.load_state(state["sampler"])
            step_tokens = batch_size * grad_accum * phase.data.tokens.shape[1]
            sums: dict[str, torch.Tensor] = {}
            logged_steps = 0
            while state["phase_tokens"] + step_tokens <= max(phase.tokens, step_tokens):
                time_spent = (time.perf_counter() - started) / cfg.max_seconds if cfg.max_seconds else 0.0
                lr = learning_rate(cfg, state["tokens"], total, time_spent)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                try:
                    parts = _accumulate(objective, phase.data, sampler, batch_size, grad_accum, autocast)
                except torch.OutOfMemoryError:
                    if batch_size == 1:
                        raise
                    optimizer.zero_grad(set_to_none=True)
                    torch.cuda.empty_cache()
                    batch_size, grad_accum = batch_size // 2, grad_accum * 2
                    step_tokens = batch_size * grad_accum * phase.data.tokens.shape[1]
                    log.warning("out of GPU memory: batches of %d sequences, %d accumulated", batch_size, grad_accum)
                    continue
                torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                state["step"] += 1
                state["tokens"] += step_tokens
                state["phase_tokens"] += step_tokens
                if state["tokens"] - tokens_at_start == step_tokens:  # this run's first step (queued, on a GPU)
                    state["first_step_s"] = time.perf_counter() - started
                for k, v in parts.items():
                    sums[k] = sums[k] + v if k in sums else v
                logged_steps += 1
                last_of_phase = state["phase_tokens"] + step_tokens > max(phase.tokens, step_tokens)
                if deadline is not None and time.perf_counter() >= deadline:
                    out_of_time = True
                if logged_steps == cfg.log_every or out_of_time or last_of_phase:
                    means = {k: float(v) / logged_steps for k, v in sums.items()}  # the one host sync
                    elapsed = time.perf_counter() - started
                    record = {
                        "step": state["step"],
                        "phase": phase_index,
                        "tokens": state["tokens"],
                        "lr": lr,
                        "tokens_per_s": (state["tokens"] - tokens_at_start) / elapsed if elapsed else 0.0,
                        **means,
                    }
                    log_file.write(json.dumps(record) + "\n")
                    if progress:
                        progress(record)
                    sums, logged_steps = {}, 0
                if state["step"] % cfg.eval_every == 0:
                    _evaluate(objective, sampler, cfg, state, log_file)
                if state["step"] % cfg.checkpoint_every == 0:
                    state["sampler"] = sampler.state()
                    save_checkpoint(checkpoint, params, optimizer, state)
                if out_of_time:
                    state["sampler"] = sampler.state()  # the final checkpoint below resumes inside this phase
                    break
            if out_of_time:
                break
            state.update(phase=phase_index + 1, phase_tokens=0, sampler=None)
        if not state["evals"] or state["evals"][-1]["step"] != state["step"]:
            _evaluate(objective, None, cfg, state, log_file)
        state["complete"] = not out_of_time
        state["seconds"] = time.perf_counter() - started
        state["tokens_this_run"] = state["tokens"] - tokens_at_start
        save_checkpoint(checkpoint, params, optimizer, state)
    finally:
        log_file.close()
        objective.train_mode(False)
    return state


def _accumulate(objective: Objective, data, sampler: BatchSampler, batch_size: int, grad_accum: int, autocast):
    """Forward and backward over `grad_accum` batches; returns the mean of their loss parts (on the device)."""
    parts_sum: dict[str, torch.Tensor] = {}
    for _ in range(grad_accum):
        with autocast:
            loss, parts = objective.loss(data, sampler.sample(batch_size))
        (loss / grad_accum).backward()
        for k, v in (parts | {"loss": loss.detach()}).items():
            parts_sum[k] = parts_sum[k] + v / grad_accum if k in parts_sum else v / grad_accum
    return parts_sum


def _evaluate(objective: Objective, sampler: BatchSampler | None, cfg: LoopConfig, state: dict, log_file) -> None:
    """A dev evaluation: it feeds s-CDF's language weights (the sampler's), the run's state and its log."""
    objective.train_mode(False)
    fitness = objective.evaluate()
    objective.train_mode(True)
    if fitness is None:
        return
    if sampler is not None:
        sampler.set_fitness({k: v["expected_acceptance"] for k, v in fitness.items() if k != "all"}, cfg.scdf_strength)
    entry = {"step": state["step"], "tokens": state["tokens"], "dev": fitness}
    state["evals"].append(entry)
    log_file.write(json.dumps(entry) + "\n")
    log_file.flush()
    if "all" in fitness:
        log.info(
            "step %d: dev expected acceptance %.3f, top-1 %.3f",
            state["step"],
            fitness["all"]["expected_acceptance"],
            fitness["all"][objective.top1_key],
        )
