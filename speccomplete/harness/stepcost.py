"""`specdec stepcost`: what one target forward costs, by dtype and by tokens per pass.

The speculative speedup depends on c = draft step / target step and on how much more a verify
of γ+1 tokens costs than a single-token step, so this is the measurement behind the default
dtype and behind any γ choice. Same prompt, same cache state, median of repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from speccomplete.decoder.drafts import derive_draft
from speccomplete.decoder.kv_cache import forward_logits, new_cache
from speccomplete.decoder.models import DEFAULT_TARGET


def _prefilled(model, prompt: list[int], cache_factory=new_cache):
    cache = cache_factory()
    forward_logits(model, cache, prompt, keep=1)
    return cache


def _median_ms(model, cache, feed: list[int], repeats: int) -> float:
    """Median time to feed `feed` after the cached prompt; each pass is cropped off again."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward_logits(model, cache, feed, keep=len(feed))
        times.append((time.perf_counter() - start) * 1000)
        cache.crop(-len(feed))
    return statistics.median(times)


@torch.inference_mode()
def step_costs(
    model, prompt: list[int], widths=(1, 2, 3, 5, 9), draft_layers=(0, 1), repeats: int = 7, cache_factory=new_cache
) -> dict:
    """Median ms per forward of each width, with the decoder's cache unless `cache_factory` says otherwise."""
    cache = _prefilled(model, prompt, cache_factory)
    row = {f"target_{w}_ms": _median_ms(model, cache, prompt[-w:], repeats) for w in widths}
    draft = derive_draft(model, list(draft_layers))
    row["draft_1_ms"] = _median_ms(draft, _prefilled(draft, prompt, cache_factory), prompt[-1:], repeats)
    one = row["target_1_ms"]
    row.update({f"verify_{w}_ratio": row[f"target_{w}_ms"] / one for w in widths if w > 1})
    row["c"] = row["draft_1_ms"] / one
    return row


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("stepcost", help="median cost of target/draft forward passes by dtype and width")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtypes", default="float32,bfloat16", help="each also packed where decoder/kernels.py can")
    p.add_argument("--prompt-file", default=__file__, help="the prompt's text (default: this module's source)")
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--json")
    return p


def run(args: argparse.Namespace) -> int:
    from transformers import DynamicCache

    from speccomplete.decoder.kernels import pack_linear_weights
    from speccomplete.decoder.models import load_model

    from .bench import write_json

    prompt_text = open(args.prompt_file, encoding="utf-8").read()
    rows = {}
    for dtype in args.dtypes.split(","):
        model, tokenizer = load_model(args.target, device=args.device, dtype=dtype)
        prompt = tokenizer(prompt_text)["input_ids"][: args.prompt_tokens]
        rows[dtype] = step_costs(model, prompt)
        if pack_linear_weights(model):
            rows[f"{dtype}+packed"] = step_costs(model, prompt)
            # the cache lever: HF's DynamicCache (torch.cat per step) instead of decoder/kv_cache.py
            rows[f"{dtype}+packed+hf-cache"] = step_costs(model, prompt, cache_factory=DynamicCache)
        del model
    keys = list(next(iter(rows.values())))
    threads = f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
    print(
        f"target={args.target} device={args.device} prompt_tokens={args.prompt_tokens} {threads} "
        "(median ms; ratios to 1 token)"
    )
    print("weights".ljust(22) + "".join(k.rjust(15) for k in keys))
    for name, row in rows.items():
        print(name.ljust(22) + "".join(f"{row[k]:15.2f}" for k in keys))
    if args.json:
        write_json(
            {
                "target": args.target,
                "device": args.device,
                "prompt_tokens": args.prompt_tokens,
                "threads": threads,
                "weights": rows,
            },
            args.json,
        )
    return 0
