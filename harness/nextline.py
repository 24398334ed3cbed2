"""`specdec nextline`: does the target write the next line of real code? (target quality, greedy)

The prompt ends at the start of the cursor's line, so no half-typed indentation splits a token;
the target's first line is compared with the real line, both stripped: exact match, and the
character-level similarity (difflib ratio) for a signal below exact.
"""

from __future__ import annotations

import argparse
import difflib
import time
from collections import defaultdict

from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.models import DEFAULT_TARGET

from .lib.cases import Case


def next_line_quality(
    decoder: SpeculativeDecoder, cases: list[Case], max_new_tokens: int = 32, max_prompt_tokens: int = 1024
) -> dict:
    per_language: defaultdict[str, dict[str, float]] = defaultdict(
        lambda: {"exact": 0, "similarity": 0.0, "cases": 0, "tokens": 0, "seconds": 0.0}
    )
    options = DecodeOptions(
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=max_prompt_tokens,
        stop_when=lambda text: "\n" in text.lstrip("\n"),
    )
    for case in cases:
        line_start = case.prefix.rfind("\n") + 1
        start = time.perf_counter()
        generation = decoder.generate(case.text[:line_start], options)
        seconds = time.perf_counter() - start
        got = generation.text.lstrip("\n").split("\n", 1)[0].strip()
        want = (case.text[line_start:].split("\n", 1)[0]).strip()
        row = per_language[case.language]
        row["exact"] += got == want
        row["similarity"] += difflib.SequenceMatcher(None, got, want).ratio()
        row["cases"] += 1
        row["tokens"] += len(generation.token_ids)
        row["seconds"] += seconds
    total = {k: sum(r[k] for r in per_language.values()) for k in ("exact", "similarity", "cases", "tokens", "seconds")}
    rows = dict(sorted(per_language.items())) | {"OVERALL": total}
    return {
        name: {
            "exact_match": r["exact"] / r["cases"],
            "similarity": r["similarity"] / r["cases"],
            "cases": r["cases"],
            "tokens_per_s": r["tokens"] / r["seconds"],
        }
        for name, r in rows.items()
    }


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("nextline")
    p.add_argument("--cases", required=True)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument(
        "--quantization",
        default="none",
        choices=("none", "int8"),
        help="int8: the target's linear weights in int8, as `--quantization int8` decodes (decoder/kernels.py)",
    )
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json")
    return p


def run(args: argparse.Namespace) -> int:
    from speccomplete.decoder.loader import use_cpu_kernels
    from speccomplete.decoder.models import load_model

    from .lib.cases import read_cases
    from .lib.output import write_json

    model, tokenizer = load_model(args.target, device=args.device, dtype=args.dtype)
    decoder = SpeculativeDecoder(model, tokenizer)
    if args.quantization == "int8":
        use_cpu_kernels(decoder.steps, model, int8=True)
    rows = next_line_quality(decoder, read_cases(args.cases), args.max_new_tokens)
    weights = "int8" if args.quantization == "int8" else str(model.dtype).removeprefix("torch.")
    print(f"target={args.target} device={model.device} weights={weights} (greedy next line, prompt cut at line start)")
    print("language".rjust(11) + "n".rjust(4) + "exact".rjust(8) + "similar".rjust(9) + "tok/s".rjust(8))
    for name, r in rows.items():
        print(f"{name:>11}{r['cases']:4d}{r['exact_match']:8.2f}{r['similarity']:9.2f}{r['tokens_per_s']:8.1f}")
    if args.json:
        write_json(
            {"target": args.target, "device": str(model.device), "weights": weights, "languages": rows}, args.json
        )
    return 0
