"""What the draft-training commands share (`specdec finetune`, `specdec train-eagle3`): the training loop's
options and the settings they give, and the run's summary (--summary)."""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
from pathlib import Path
from typing import Any

from speccomplete.decoder.training.corpus import parse_budgets

from .facts import write_summary


def add_training_loop_args(
    p: argparse.ArgumentParser, *, batch_size: int, eval_sequences: int, eval_tokens: int
) -> None:
    """The options every draft-training command shares (finetune, train-eagle3): sampling, optimizer,
    precision, evaluation, checkpoints and the time limit. Defaults that differ between them are arguments."""
    p.add_argument("--balance", default="natural", help="natural, uniform, or scdf (upweight worst-fitting languages)")
    p.add_argument("--batch-size", type=int, default=batch_size)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--warmup-tokens", default="100k")
    p.add_argument(
        "--precision",
        default="auto",
        help="auto (bf16 autocast on CUDA, fp32 on CPU: bf16 measured 3-30x slower on CPUs without AMX), fp32, bf16",
    )
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--eval-sequences", type=int, default=eval_sequences, help="dev sequences per language")
    p.add_argument("--eval-tokens", type=int, default=eval_tokens, help="positions scored per dev sequence")
    p.add_argument("--checkpoint-every", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-resume", action="store_true")
    p.add_argument(
        "--max-minutes",
        type=float,
        help="stop training after this much wall-clock time, checkpoint, and write the draft; "
        "running the same command again resumes (default: no limit)",
    )
    p.add_argument(
        "--log-every",
        type=int,
        default=1,
        help="optimizer steps between reading the losses back (each read waits for the GPU; 20+ there)",
    )
    p.add_argument(
        "--summary",
        help="write the run's summary JSON here (tokens, tokens/s, dev fitness before and after, the weights' sha256)",
    )


def loop_settings(args: argparse.Namespace, device) -> dict[str, Any]:
    """The training-loop settings that add_training_loop_args' options give, as keywords for a LoopConfig
    subclass that also has eval_sequences and eval_tokens (TrainConfig, Eagle3TrainConfig)."""
    return dict(
        balance=args.balance,
        batch_size=args.batch_size,
        grad_accum=args.grad_accum,
        lr=args.lr,
        warmup_tokens=token_count(args.warmup_tokens),
        bf16=_use_bf16(args.precision, device),
        seed=args.seed,
        eval_every=args.eval_every,
        eval_sequences=args.eval_sequences,
        eval_tokens=args.eval_tokens,
        checkpoint_every=args.checkpoint_every,
        max_seconds=args.max_minutes * 60 if args.max_minutes is not None else None,
        log_every=args.log_every,
    )


def write_training_summary(args, state: dict, folder: Path, startup_s: float) -> None:
    """--summary of a training command: the run's numbers, the sha256 of the draft's weights in `folder`, and the
    machine's facts (lib/facts.py)."""
    if not args.summary:
        return
    weights = folder / "model.safetensors"
    log_path = folder / "train_log.jsonl"
    records = (
        [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()] if log_path.exists() else []
    )
    steps = [r for r in records if "loss" in r]
    evals = state["evals"]
    seconds = state.get("seconds") or 0.0
    write_summary(
        args.summary,
        {
            "tokens": state["tokens"],
            "steps": state["step"],
            "complete": state.get("complete"),
            "tokens_this_run": state.get("tokens_this_run"),
            "seconds_training": seconds,  # the loop, evaluations and checkpoints included
            "tokens_per_s": state.get("tokens_this_run", 0) / seconds if seconds else None,
            "startup_s": startup_s,  # the command's start to the loop's: imports, the target, the corpus
            "first_step_s": state.get("first_step_s"),
            "last_train": steps[-1] if steps else None,
            "dev_before_step": evals[0]["step"] if evals else None,
            "dev_before": evals[0]["dev"] if evals else None,
            "dev_after_step": evals[-1]["step"] if evals else None,
            "dev_after": evals[-1]["dev"] if evals else None,
            "model_sha256": _sha256(weights) if weights.exists() else None,
            "command": "specdec " + shlex.join(args.argv),
        },
    )


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def token_count(count: str) -> int:
    """'256k' -> 256000."""
    return parse_budgets(count, [])["*"]


def _use_bf16(precision: str, device) -> bool:
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"--precision must be auto, fp32 or bf16, got {precision!r}")
    return precision == "bf16" or precision == "auto" and device.type == "cuda"


def special_ids(tokenizer) -> set[int]:
    """The tokenizer's end, start and padding ids: a draft's vocabulary keeps them whatever their frequency."""
    return {i for i in (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) if i is not None}
