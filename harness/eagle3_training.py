"""`specdec train-eagle3`: train an EAGLE-3 draft on the target's states (decoder/training/eagle3.py) and
write it as a speculators folder with a model card. On a GPU the target runs inside each training step
(online); on the CPU its states are extracted over a corpus once, to disk, and read back every epoch."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path

import torch
from tqdm import tqdm

from speccomplete.decoder.models import DEFAULT_TARGET

from .lib.training import add_training_loop_args, loop_settings, special_ids, token_count, write_training_summary


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("train-eagle3")
    p.add_argument("--target", default=DEFAULT_TARGET, help="packaged alias, local directory or HF id")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16 (the target's)")
    p.add_argument("--data", required=True, help="corpus directory from `specdec corpus`")
    p.add_argument("--dev", help="dev corpus directory: per-language fitness, and s-CDF weights")
    p.add_argument("--out", required=True, help="output folder: the draft, its model card, log and checkpoint")
    source = p.add_mutually_exclusive_group()
    source.add_argument(
        "--online",
        action="store_true",
        help="run the target inside every training step (the default on CUDA): no feature files",
    )
    source.add_argument(
        "--offline",
        action="store_true",
        help="extract the target's states to --features once and train on them (the default on the CPU)",
    )
    p.add_argument("--features", help="feature cache folder (default OUT/features; OUT/features-dev for --dev)")
    p.add_argument("--tokens", default="1M", help="offline: corpus tokens to extract features for (whole sequences)")
    p.add_argument("--train-tokens", default="4M", help="tokens to train on (epochs over the features)")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=32768,
        help="draft vocabulary size: the shipped trained draft's vocabulary for this target when it has this "
        "size, else the corpus's most frequent tokens",
    )
    p.add_argument("--aux-layers", help="comma-separated target layer ids the draft reads (default: low, mid, high)")
    p.add_argument("--ttt-steps", type=int, default=3, help="training-time-test steps (draft tokens trained per row)")
    p.add_argument("--decay", type=float, default=0.8, help="loss weight decay per TTT step")
    p.add_argument("--init", help="draft:FOLDER: go on training an EAGLE-3 folder (its vocabulary and aux layers)")
    add_training_loop_args(p, batch_size=8, eval_sequences=8, eval_tokens=128)
    p.add_argument(
        "--with-head",
        action="store_true",
        help="write lm_head.weight into the folder (vLLM and SGLang need it); without, loading takes the target's rows",
    )
    return p


def run(args) -> int:
    from speccomplete.decoder.drafts.eagle3.model import (
        Eagle3Shape,
        default_aux_layers,
        init_from_target,
        load_eagle3,
        save_eagle3,
        speculators_config,
    )
    from speccomplete.decoder.models import load_model
    from speccomplete.decoder.training.corpus import Shards
    from speccomplete.decoder.training.eagle3 import (
        Eagle3TrainConfig,
        FeatureShards,
        OnlineFeatures,
        extract_features,
        train_eagle3,
    )
    from speccomplete.decoder.training.teacher import softcap_of

    command_started = time.perf_counter()
    out = Path(args.out)
    target, tokenizer = load_model(args.target, device=args.device, dtype=args.dtype)
    text_config = target.config.get_text_config()
    corpus = Shards.load(args.data)
    if corpus.manifest["vocab_size"] != len(tokenizer):
        raise ValueError(
            f"corpus {args.data} was tokenized with a {corpus.manifest['vocab_size']}-token vocabulary, "
            f"the target has {len(tokenizer)}"
        )
    if args.init:
        if not args.init.startswith("draft:"):
            raise ValueError(f"--init takes draft:FOLDER, got {args.init!r}")
        draft = load_eagle3(args.init.removeprefix("draft:"), target)
        shape = draft.shape
    else:
        aux = (
            tuple(int(x) for x in args.aux_layers.split(","))
            if args.aux_layers
            else default_aux_layers(text_config.num_hidden_layers)
        )
        vocab_ids = _vocabulary(target, tokenizer, corpus, args.draft_vocab)
        shape = Eagle3Shape.for_target(target, len(vocab_ids), aux)
        draft = init_from_target(shape, target, vocab_ids, seed=args.seed)
    draft.float()  # master weights in fp32: AdamW updates are too small for bf16

    data: FeatureShards | OnlineFeatures
    dev: FeatureShards | OnlineFeatures | None = None
    if args.online or (not args.offline and target.device.type == "cuda"):
        data = OnlineFeatures(target, corpus, shape.aux_layers)
        dev = OnlineFeatures(target, Shards.load(args.dev), shape.aux_layers) if args.dev else None
        source = f"online, over a corpus of {corpus.manifest['tokens']:,} tokens"
    else:
        features = Path(args.features) if args.features else out / "features"
        sequences = max(1, -(-token_count(args.tokens) // corpus.tokens.shape[1]))
        bar = tqdm(total=min(sequences, len(corpus.tokens)), unit="seq", desc="features")
        extract_features(
            target, corpus, features, shape.aux_layers, sequences=sequences, seed=args.seed, progress=_set(bar)
        )
        bar.close()
        if args.dev:
            dev_corpus = Shards.load(args.dev)
            indices = torch.cat([dev_corpus.indices_of(lang)[: args.eval_sequences] for lang in dev_corpus.languages])
            extract_features(target, dev_corpus, Path(f"{features}-dev"), shape.aux_layers, indices=indices)
            dev = FeatureShards(Path(f"{features}-dev"))
        data = FeatureShards(features)
        source = f"extracted to disk for {data.manifest['tokens']:,} tokens"
    cfg = Eagle3TrainConfig(
        out=str(out),
        tokens=token_count(args.train_tokens),
        steps=args.ttt_steps,
        decay=args.decay,
        softcap=softcap_of(target),
        **loop_settings(args, target.device),
    )
    bar = tqdm(total=cfg.tokens, unit="tok", unit_scale=True, desc="train-eagle3")

    def progress(record):
        bar.n = record["tokens"]
        bar.set_postfix(
            loss=f"{record['loss']:.3f}", top1=f"{record['top1_0']:.2f}", tok_s=f"{record['tokens_per_s']:.0f}"
        )

    startup_s = time.perf_counter() - command_started
    state = train_eagle3(
        target.get_input_embeddings().weight,
        draft,
        cfg,
        data,
        dev,
        progress=progress,
        resume=not args.no_resume,
        target_head=target.get_output_embeddings().weight,
    )
    bar.close()

    command = "specdec " + shlex.join(args.argv)
    dev_fitness = state["evals"][-1]["dev"] if state["evals"] else None
    extra = {
        "tokens_seen": state["tokens"],
        "steps": state["step"],
        "ttt_steps": args.ttt_steps,
        "balance": args.balance,
        "corpus": args.data,
        "source": source,
        "dev_fitness": dev_fitness,
        "init": args.init or "fresh",
        "trained_on": _trained_on(target.device),
        "command": command,
    }
    config = speculators_config(
        shape,
        list(target.config.architectures or []),
        args.target,
        args.ttt_steps,
        head_from_target=not args.with_head,
        extra=extra,
    )
    save_eagle3(draft, out, config)
    write_model_card(out, args, shape, extra, corpus.manifest)
    write_training_summary(args, state, out, startup_s)
    print(f"trained {state['tokens']} tokens in {state['step']} steps; EAGLE-3 draft in {out}")
    if not state["complete"]:
        print(f"stopped at --max-minutes {args.max_minutes:g}; the same command resumes from {out}/checkpoint")
    if dev_fitness:
        print(json.dumps(dev_fitness.get("all", {})))
    return 0


def _vocabulary(target, tokenizer, data, size: int) -> torch.Tensor:
    """The shipped trained draft's vocabulary for this target when it has `size` ids (the engine's drafts
    then agree on what they can write), else the corpus's `size` most frequent tokens and the specials."""
    from speccomplete.decoder.drafts.build import default_draft_for
    from speccomplete.decoder.drafts.spec import TrainedDraft
    from speccomplete.decoder.drafts.trained import DraftLoadError, draft_vocabulary
    from speccomplete.decoder.training.draft import frequent_token_ids

    vocab = target.get_output_embeddings().out_features
    shipped = default_draft_for(target)
    if isinstance(shipped, TrainedDraft):
        try:
            ids = draft_vocabulary(shipped.folder, target)
            if len(ids) == min(size, vocab):
                return ids.sort().values
        except DraftLoadError:
            pass
    return frequent_token_ids(data.tokens, size, sorted(special_ids(tokenizer)), vocab)


def _trained_on(device: torch.device) -> str:
    """The machine, for the model card: the GPU where training ran on one, else the CPU."""
    from .lib.facts import device_facts

    facts = device_facts()
    machine = facts["gpu"] if device.type == "cuda" and facts["gpu"] else facts["cpu"] or "a CPU"
    return f"{machine} ({facts['date_utc'][:10]}, torch {facts['torch']})"


def _set(bar: tqdm):
    def update(done: int) -> None:
        bar.n = done
        bar.refresh()

    return update


def write_model_card(folder: Path, args, shape, extra: dict, manifest: dict) -> None:
    lines = [
        f"# EAGLE-3 draft for `{args.target}`",
        "",
        "One Llama decoder layer that drafts from the target's own hidden states (layers "
        f"{list(shape.aux_layers)}), in the `speculators` format (config.json + model.safetensors).",
        "",
        f"- Draft vocabulary: {shape.draft_vocab} target tokens (`d2t`, `t2d`); the head is the target's rows, frozen",
        f"- Layer: hidden {shape.hidden_size}, {shape.num_heads} heads ({shape.num_kv_heads} KV) of {shape.head_dim}, "
        f"MLP {shape.intermediate_size}",
        f"- Trained: {extra['tokens_seen']:,} tokens in {extra['steps']} optimizer steps, {extra['ttt_steps']} "
        f"training-time-test steps, language sampling `{extra['balance']}`, init `{extra['init']}`; the last run "
        f"on {extra['trained_on']}",
        f"- Corpus `{args.data}` (seq_len {manifest.get('seq_len')}); the target's states: {extra['source']}",
        "",
    ]
    if manifest.get("per_language"):
        lines += ["| language | documents | corpus tokens |", "|---|---|---|"]
        lines += [f"| {lang} | {r['documents']} | {r['tokens']:,} |" for lang, r in manifest["per_language"].items()]
        lines.append("")
    fitness = extra.get("dev_fitness")
    if fitness:
        steps = sorted(int(k.split("_")[1]) for k in next(iter(fitness.values())) if k.startswith("top1_"))
        lines += [
            "## Dev fitness (per language, on teacher-forced target features)",
            "",
            "Against the target's full next-token distribution, as the engine accepts: Σmin(p,q) is the chance "
            "one sampled draft token is accepted; top-1 step s is how often the draft's greedy token s+1 of a round "
            "is the target's, the tokens before it being right.",
            "",
            "| language | expected acceptance Σmin(p,q), step 0 | "
            + " | ".join(f"top-1 step {s}" for s in steps)
            + " |",
            "|---|---|" + "---|" * len(steps),
        ]
        for lang, row in fitness.items():
            lines.append(
                f"| {lang} | {row['expected_acceptance']:.3f} | "
                + " | ".join(f"{row[f'top1_{s}']:.3f}" for s in steps)
                + " |"
            )
        lines.append("")
    head_note = (
        "This folder includes `lm_head.weight`, so it serves as is."
        if args.with_head
        else "This folder leaves out `lm_head.weight` (`head_from_target`: it is the target's rows); specdec "
        "rebuilds it on load, but vLLM needs it: rerun with `--with-head` to write it in before serving elsewhere."
    )
    lines += [
        "## Serving",
        "",
        f"With specdec: `specdec complete --target {args.target} --draft {folder}` (a folder holding a speculators "
        "config.json is an EAGLE-3 draft: decoder/drafts/spec.py).",
        "",
        "With vLLM:",
        "",
        "```bash",
        f"vllm serve {args.target} --speculative-config "
        f'\'{{"method": "eagle3", "model": "{folder}", "num_speculative_tokens": {args.ttt_steps}}}\'',
        "```",
        "",
        head_note,
        "",
        "`features/`, `features-dev/` (the target's states, bf16), `checkpoint/` and `train_log.jsonl` are training "
        "state: leave them out when copying the draft elsewhere.",
        "",
        "## Reproduce",
        "",
        "```bash",
        extra["command"],
        "```",
        "",
    ]
    (folder / "README.md").write_text("\n".join(lines))
