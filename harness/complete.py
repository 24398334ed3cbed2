"""`specdec complete`: complete a file at a position and print the completion with its stats."""

from __future__ import annotations

import argparse
import json

from .lib.model_args import add_model_args, load


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("complete")
    p.add_argument("file")
    p.add_argument("--line", type=int, help="0-based LSP line (default: end of file)")
    p.add_argument("--character", type=int, default=0, help="UTF-16 column on that line")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stream", action="store_true", help="print text as it is decoded")
    add_model_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from speccomplete.decoder.engine import DecodeOptions
    from speccomplete.decoder.sampling import SamplingParams
    from speccomplete.server.positions import offset_at

    text = open(args.file, encoding="utf-8").read()
    if args.line is None:
        offset = len(text)
    else:
        offset = offset_at(text, args.line, args.character)
    decoder = load(args).decoder
    options = DecodeOptions(
        max_new_tokens=args.max_new_tokens,
        sampling=SamplingParams(args.temperature, args.top_k, args.top_p),
        seed=args.seed,
        on_text=(lambda t: print(t, end="", flush=True)) if args.stream else None,
    )
    generation = decoder.generate(text[:offset], options)
    if not args.stream:
        print(generation.text, end="")
    print("\n---")
    print(json.dumps(generation.stats.to_dict()))
    return 0
