"""`specdec corpus` and `specdec finetune`: build a draft's training corpus, train it, write its model card."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from speccomplete.decoder.training.corpus import (
    NL,
    CorpusError,
    Document,
    build_corpus,
    local_documents,
    nl_documents,
    package_roots,
    parse_budgets,
    split_lists,
    stack_documents,
)
from speccomplete.decoder.training.packed import read_packed_index, tokenize_packed

from .lib.model_args import add_model_args
from .lib.training import add_training_loop_args, loop_settings, special_ids, token_count, write_training_summary

if TYPE_CHECKING:
    from speccomplete.decoder.drafts.trained import DraftMeta


def add_corpus_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("corpus")
    p.add_argument(
        "--out", required=True, help="output directory (shards + manifest.json; with --packed, train/ and dev/)"
    )
    p.add_argument("--splits", help="directory of <lang>.<split>.txt lists of source files")
    p.add_argument(
        "--packed",
        help="a packed text corpus (python -m tools.gpu.pack --splits; packed.json and <split>/<lang>.NNNN.jsonl.xz): "
        "every split of it is tokenized, into OUT/train and OUT/dev",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="with --packed: processes tokenizing files in parallel (default: every core); the output does not "
        "depend on it",
    )
    p.add_argument("--stack", help="The Stack dataset id or a local dataset in its layout (data/<lang>/...)")
    p.add_argument("--split", default="train")
    p.add_argument("--languages", help="comma-separated; default: every language the source has")
    p.add_argument("--nl-roots", help="ROOTS.txt of the corpus: READMEs and docs there become language 'nl'")
    p.add_argument(
        "--budget", help="tokens per language: '200k' or 'python=1M,*=200k' (default 200k; with --packed: all)"
    )
    p.add_argument("--seq-len", type=int, help="default 512; with --packed: the pack's")
    p.add_argument("--seed", type=int, help="default 0; with --packed: the pack's")
    p.add_argument("--tokenizer", default="gemma3-270m", help="model spec whose tokenizer to use")
    p.add_argument(
        "--self-distill",
        action="store_true",
        help="replace each document by target continuations (the tokenizer's model) of its prompts",
    )
    p.add_argument("--temperatures", default="0,0.3,0.7,1.0", help="self-distillation temperatures")
    p.add_argument("--distill-prompts", type=int, default=8, help="prompts per language for self-distillation")
    p.add_argument("--distill-new-tokens", type=int, default=128)
    return p


def cmd_corpus(args) -> int:
    from speccomplete.decoder.models import load_model, resolve

    if args.packed:
        return corpus_from_packed(args)
    if not args.splits and not args.stack:
        raise CorpusError("give a source: --splits DIR (file lists), --stack DATASET or --packed DIR")
    args.seq_len = args.seq_len or 512
    args.seed = args.seed or 0
    languages = [x for x in (args.languages or "").split(",") if x]
    documents: dict[str, Iterable[Document]] = {}
    if args.splits:
        for lang, listing in split_lists(args.splits, args.split, languages).items():
            documents[lang] = local_documents(listing, lang)
    else:
        if not languages:
            raise CorpusError("--stack needs --languages (one data_dir per language)")
        for lang in languages:
            if lang != NL:
                documents[lang] = stack_documents(args.stack, lang, "train")
    if args.nl_roots:
        documents[NL] = nl_documents(package_roots(args.nl_roots), args.split)
    budgets = parse_budgets(args.budget or "200k", sorted(documents))
    if args.self_distill:
        from speccomplete.decoder.training.distill import self_distilled

        model, tokenizer = load_model(args.tokenizer)
        temperatures = [float(t) for t in args.temperatures.split(",")]
        documents = {
            lang: self_distilled(
                model, tokenizer, docs, temperatures, args.distill_prompts, args.distill_new_tokens, seed=args.seed
            )
            for lang, docs in documents.items()
        }
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve(args.tokenizer), trust_remote_code=False)
    manifest = build_corpus(
        documents,
        tokenizer,
        args.out,
        budgets,
        args.seq_len,
        args.seed,
        tokenizer_name=args.tokenizer,
        command="specdec " + shlex.join(args.argv),
    )
    print(f"{'language':>11}{'docs':>8}{'tokens':>10}")
    for lang, row in manifest["per_language"].items():
        print(f"{lang:>11}{row['documents']:8d}{row['tokens']:10d}")
    print(f"wrote {manifest['sequences']} sequences x {manifest['seq_len']} tokens to {args.out}")
    return 0


def corpus_from_packed(args) -> int:
    """`specdec corpus --packed`: tokenize a packed text corpus on every core into OUT/train and OUT/dev."""
    from transformers import AutoTokenizer

    from speccomplete.decoder.models import resolve

    tokenizer = AutoTokenizer.from_pretrained(resolve(args.tokenizer), trust_remote_code=False)
    index = read_packed_index(args.packed)
    budgets = parse_budgets(args.budget, sorted(index["splits"].get("train", {}))) if args.budget else None
    bar = tqdm(unit="file", desc="tokenize", mininterval=5)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    started = time.monotonic()
    manifests = tokenize_packed(
        args.packed,
        tokenizer,
        args.out,
        seq_len=args.seq_len,
        seed=args.seed,
        workers=args.workers,
        budgets=budgets,
        tokenizer_name=args.tokenizer,
        command="specdec " + shlex.join(args.argv),
        progress=progress,
    )
    seconds = time.monotonic() - started
    bar.close()
    print(f"{'split':>6}{'language':>11}{'docs':>8}{'tokens':>12}")
    for split, manifest in manifests.items():
        for lang, row in manifest["per_language"].items():
            print(f"{split:>6}{lang:>11}{row['documents']:8d}{row['tokens']:12d}")
    tokens = sum(m["tokens"] for m in manifests.values())
    text = sum(row["text_bytes"] for split in index["splits"].values() for row in split.values())
    print(
        f"tokenized {text / 1e6:.1f} MB of text into {tokens} tokens in {seconds:.1f} s with {args.workers} workers "
        f"({tokens / seconds / 1e6:.2f}M tokens/s, {text / tokens:.2f} bytes a token); "
        + ", ".join(f"{split}: {m['sequences']} x {m['seq_len']}" for split, m in manifests.items())
        + f" in {args.out}"
    )
    return 0


def add_finetune_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("finetune")
    p.add_argument("--data", required=True, help="corpus directory (fine-tuning phase)")
    p.add_argument("--tokens", default="1M", help="tokens to train on in the fine-tuning phase")
    p.add_argument("--pretrain", help="corpus directory for a general first phase (pretrain, then fine-tune)")
    p.add_argument("--pretrain-tokens", default="0")
    p.add_argument("--dev", help="dev corpus directory for periodic per-language fitness")
    p.add_argument("--out", required=True, help="output folder: the draft, its model card, log and checkpoint")
    p.add_argument(
        "--init",
        default="derived",
        help="derived (copies of target layers), scratch (fresh layers), draft:FOLDER (go on training a trained "
        "draft: its layers and head), or model:SPEC (an HF model)",
    )
    p.add_argument("--layers", default="0,1", help="target layers the draft is made of (derived/scratch)")
    p.add_argument(
        "--draft-vocab",
        type=int,
        default=32768,
        help="restrict the draft head to this many frequent tokens (0: the target's full head)",
    )
    p.add_argument("--objective", default="kd", help="ce, kd or ce+kd")
    p.add_argument("--kd-topk", type=int, default=0, help="KL on the teacher's top-k only (0: full)")
    add_training_loop_args(p, batch_size=4, eval_sequences=4, eval_tokens=256)
    add_model_args(p)
    return p


def cmd_finetune(args) -> int:
    from speccomplete.decoder.drafts.trained import (
        DraftMeta,
        load_draft,
        owned_parameters,
        save_draft,
        target_signature,
    )
    from speccomplete.decoder.models import check_same_vocabulary, load_model
    from speccomplete.decoder.training.corpus import Shards
    from speccomplete.decoder.training.derived import Phase, TrainConfig, train
    from speccomplete.decoder.training.draft import build_draft, frequent_token_ids, token_counts

    command_started = time.perf_counter()
    objective = {"ce": (1.0, 0.0), "kd": (0.0, 1.0), "ce+kd": (0.5, 0.5)}.get(args.objective)
    if objective is None:
        raise ValueError(f"--objective must be ce, kd or ce+kd, got {args.objective!r}")
    phases = ([Phase(args.pretrain, token_count(args.pretrain_tokens))] if args.pretrain else []) + [
        Phase(args.data, token_count(args.tokens))
    ]
    target, tokenizer = load_model(args.target, device=args.device, dtype=args.dtype)
    data = Shards.load(args.data)
    if data.manifest["vocab_size"] != len(tokenizer):
        raise ValueError(
            f"corpus {args.data} was tokenized with a {data.manifest['vocab_size']}-token vocabulary, "
            f"the target has {len(tokenizer)}"
        )
    layers = [int(x) for x in args.layers.split(",")]
    if args.init.startswith("model:"):
        draft, draft_tokenizer = load_model(args.init[len("model:") :], device=args.device, dtype=args.dtype)
        check_same_vocabulary(tokenizer, draft_tokenizer)
        params = {n: p for n, p in draft.named_parameters() if p is not draft.get_input_embeddings().weight}
        for p in params.values():
            p.requires_grad_(True)
    elif args.init.startswith("draft:"):  # its layers and head, whatever --layers and --draft-vocab say
        draft = load_draft(args.init.removeprefix("draft:"), target)
        layers = DraftMeta.read(args.init.removeprefix("draft:")).layers
        args.draft_vocab = len(draft.vocab_ids) if draft.vocab_ids is not None else 0
        params = owned_parameters(draft)
        for p in params.values():
            p.requires_grad_(True)
    else:
        vocab_ids = None
        if args.draft_vocab:
            vocab_ids = frequent_token_ids(
                data.tokens, args.draft_vocab, sorted(special_ids(tokenizer)), target.config.vocab_size
            )
        draft = build_draft(target, layers, args.init, vocab_ids)
        params = owned_parameters(draft)
    # master weights in fp32 even when the target runs in bf16: AdamW updates are too small for bf16
    for p in params.values():
        p.data = p.data.float()
    cfg = TrainConfig(
        phases=phases,
        out=args.out,
        dev=args.dev,
        ce_weight=objective[0],
        kd_weight=objective[1],
        kd_topk=args.kd_topk,
        **loop_settings(args, target.device),
    )
    bar = tqdm(total=sum(p.tokens for p in phases), unit="tok", unit_scale=True, desc="finetune")

    def progress(record):
        bar.n = record["tokens"]
        bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", phase=record["phase"])

    startup_s = time.perf_counter() - command_started
    state = train(target, draft, params, cfg, progress=progress, resume=not args.no_resume)
    bar.close()
    draft.to(target.dtype)
    command = "specdec " + shlex.join(args.argv)
    if args.init.startswith("model:"):
        draft.save_pretrained(args.out, safe_serialization=True)
        tokenizer.save_pretrained(args.out)
    else:
        meta = DraftMeta(
            target_config=target_signature(target),
            layers=layers,
            target=args.target,
            init=args.init,
            draft_vocab=args.draft_vocab or target.config.vocab_size,
            objective=args.objective,
            kd_topk=args.kd_topk,
            balance=args.balance,
            tokens_seen=state["tokens"],
            steps=state["step"],
            corpus=[{"data": p.data, "tokens": p.tokens} for p in phases],
            dev_fitness=state["evals"][-1]["dev"] if state["evals"] else None,
            command=command,
        )
        counts = None if draft.vocab_ids is None else token_counts(data.tokens, draft.vocab_ids)
        save_draft(draft, args.out, meta, vocab_counts=counts)
        write_model_card(
            Path(args.out),
            meta,
            [Shards.load(p.data).manifest for p in phases],
            state["evals"][0]["dev"] if state["evals"] and state["evals"][0]["step"] == 0 else None,
        )
    write_training_summary(args, state, Path(args.out), startup_s)
    print(f"trained {state['tokens']} tokens in {state['step']} steps; draft in {args.out}")
    if not state["complete"]:
        print(f"stopped at --max-minutes {args.max_minutes:g}; the same command resumes from {args.out}/checkpoint")
    if state["evals"]:
        print(json.dumps(state["evals"][-1]["dev"].get("all", {})))
    return 0


def write_model_card(folder: Path, meta: DraftMeta, manifests: list[dict], first_eval: dict | None) -> None:
    lines = [
        f"# Draft for `{meta.target}`",
        "",
        f"- Base target: `{meta.target}` ({meta.target_config})",
        f"- Draft: target layers {meta.layers} (init `{meta.init}`), the target's embeddings (shared), "
        f"its own final norm, a head over the {meta.draft_vocab} most frequent corpus tokens",
        f"- Objective: `{meta.objective}`"
        + (f", KD on top-{meta.kd_topk}" if meta.kd_topk else "")
        + f"; language sampling `{meta.balance}`",
        f"- Tokens seen: {meta.tokens_seen:,} in {meta.steps} optimizer steps",
        "- Weights: `model.safetensors` (bf16, the draft's own layers and norm, plus `vocab_ids`), and `vocab_ids` "
        "alone in `vocab_ids.safetensors` with each id's count in the corpus (what the self draft reads, cut to the "
        "most frequent; an install without the weights keeps it); "
        "no optimizer state",
        "",
        "## Corpus and language mix",
        "",
    ]
    for phase, manifest in zip(meta.corpus, manifests):
        lines.append(
            f"Phase `{phase['data']}`: {phase['tokens']:,} tokens trained; corpus seq_len "
            f"{manifest['seq_len']}, seed {manifest['seed']}, built with `{manifest.get('command', '')}`"
        )
        lines += ["", "| language | documents | corpus tokens |", "|---|---|---|"]
        lines += [
            f"| {lang} | {row['documents']} | {row['tokens']:,} |" for lang, row in manifest["per_language"].items()
        ]
        lines.append("")
    if meta.dev_fitness:
        lines += [
            "## Dev fitness (teacher-forced, per language)",
            "",
            "| language | expected acceptance Σmin(p,q) | top-1 agreement | CE vs target (nats) |"
            + (" untrained exp. acc. |" if first_eval else ""),
            "|---|---|---|---|" + ("---|" if first_eval else ""),
        ]
        for lang, row in meta.dev_fitness.items():
            before = first_eval.get(lang, {}).get("expected_acceptance") if first_eval else None
            lines.append(
                f"| {lang} | {row['expected_acceptance']:.3f} | {row['top1_agreement']:.3f} | "
                f"{row['cross_entropy']:.3f} |" + (f" {before:.3f} |" if first_eval and before is not None else "")
            )
        lines.append("")
    lines += ["## Reproduce", "", "```bash", meta.command, "```", ""]
    (folder / "README.md").write_text("\n".join(lines))
