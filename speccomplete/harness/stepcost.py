"""`specdec stepcost`: what one target forward costs, by weights and by tokens per pass, and what a
draft step costs next to it.

The speculative speedup depends on c = draft step / target step and on how much more a verify
of γ+1 tokens costs than a single-token step, so this is the measurement behind the default
dtype and behind any γ choice. Same prompt, same cache state. The passes of one row of weights
are interleaved repeat by repeat, so that another job slowing the machine for a while slows each
of them alike and their ratios stay fair; each figure is the median of its repeats.

Drafts: the target's first layers as a draft (`draft_1_ms`, `c`), and where one ships for the
target, the EAGLE-3 draft: one chained step (the layer over one row, the head and its argmax) right
after a target pass, as a round's first draft token runs (`eagle3_1_ms`, `eagle3_c`), and four in a
row (`eagle3_4_ms`; `eagle3_4_c` per token). Its weights are packed or quantized with the target's,
in the same call, as the decoder's loader does (decoder/loader.py, use_cpu_kernels). On a busy
machine the fastest passes (`fastest_ms` in the JSON, printed under the table) are the better
estimate, since other jobs only ever add time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from speccomplete.decoder.drafts import derive_draft
from speccomplete.decoder.kv_cache import forward_logits, forward_tapped, new_cache
from speccomplete.decoder.models import DEFAULT_TARGET

WEIGHTS = ("plain", "packed", "hf-cache", "int8")  # the rows --weights picks from
EAGLE3_CHAIN = 4  # tokens drafted in a row in the eagle3_4_* columns
DRAFT_STEPS = ("draft_1_ms", "eagle3_1_ms")


def _prefilled(model, prompt: list[int], cache_factory=new_cache):
    cache = cache_factory()
    forward_logits(model, cache, prompt, keep=1)
    return cache


def _target_pass(model, cache, feed: list[int]) -> Callable[[], None]:
    """Feed `feed` after the cached prompt, then crop it off again."""

    def run() -> None:
        forward_logits(model, cache, feed, keep=len(feed))
        cache.crop(-len(feed))

    return run


def _eagle3_steps(drafter, model, prompt: list[int], tokens: int) -> Callable[[], None]:
    """`tokens` chained steps of an Eagle3Drafter's draft after the prompt's rows (built from the target's
    own states), as a round drafting that many tokens runs them: each the layer over one row, the head and
    its argmax, fed back."""
    from speccomplete.decoder.drafts.eagle3 import KVCache

    draft, embeddings = drafter.draft, drafter.embeddings
    device = embeddings.device
    _, features = forward_tapped(model, new_cache(), prompt, keep=1, taps=drafter.target_taps)
    assert features is not None
    rows = len(prompt) - 1
    cache = KVCache()
    ids = torch.tensor(prompt, device=device)
    out = draft.step(
        F.embedding(ids[1:], embeddings), draft.fuse(features[:rows]), torch.arange(1, rows + 1, device=device), cache
    )
    positions = torch.arange(rows + 1, rows + 1 + tokens, device=device)

    def run() -> None:
        state, token = out[-1:], ids[-1:]
        for i in range(tokens):
            state = draft.step(F.embedding(token, embeddings), state, positions[i : i + 1], cache)
            token = draft.logits(state).argmax(-1)
        cache.truncate(rows)

    return run


def _interleaved_ms(
    passes: dict[str, Callable[[], None]],
    repeats: int,
    cold: tuple[str, ...] = (),
    evict: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Each pass once per repeat, in turn: the ms each took. A pass named in `cold` runs right after an
    untimed `evict`."""
    for run in passes.values():  # first calls allocate and pick kernels
        run()
    times: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(repeats):
        for name, run in passes.items():
            if name in cold and evict is not None:
                evict()
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1000)
    return times


@torch.inference_mode()
def step_costs(
    model,
    prompt: list[int],
    widths=(1, 2, 3, 5, 9),
    draft_layers=(0, 1),
    repeats: int = 7,
    cache_factory=new_cache,
    eagle3=None,
) -> dict:
    """Median ms per forward of each width, with the decoder's cache unless `cache_factory` says otherwise;
    with `eagle3` (an Eagle3Drafter on `model`), its draft's step too."""
    cache = _prefilled(model, prompt, cache_factory)
    passes = {f"target_{w}_ms": _target_pass(model, cache, prompt[-w:]) for w in widths}
    draft = derive_draft(model, list(draft_layers))
    passes["draft_1_ms"] = _target_pass(draft, _prefilled(draft, prompt, cache_factory), prompt[-1:])
    cold: tuple[str, ...] = ()
    if eagle3 is not None:
        # Each right after a target pass, as a round's drafting runs: its first step reads the draft's weights
        # from memory; the later steps of a 4-token round may find them still cached.
        passes["eagle3_1_ms"] = _eagle3_steps(eagle3, model, prompt, 1)
        passes[f"eagle3_{EAGLE3_CHAIN}_ms"] = _eagle3_steps(eagle3, model, prompt, EAGLE3_CHAIN)
        cold = ("eagle3_1_ms", f"eagle3_{EAGLE3_CHAIN}_ms")
    times = _interleaved_ms(passes, repeats, cold, evict=passes["target_1_ms"])
    row: dict = {name: statistics.median(t) for name, t in times.items()}
    one = row["target_1_ms"]
    row.update({f"verify_{w}_ratio": row[f"target_{w}_ms"] / one for w in widths if w > 1})
    row["c"] = row["draft_1_ms"] / one
    if eagle3 is not None:
        row["eagle3_c"] = row["eagle3_1_ms"] / one
        row[f"eagle3_{EAGLE3_CHAIN}_c"] = row[f"eagle3_{EAGLE3_CHAIN}_ms"] / EAGLE3_CHAIN / one  # per token
    # Other jobs only ever add time: on a busy machine the fastest pass is the better estimate of each.
    row["fastest_ms"] = {name: min(t) for name, t in times.items()}
    return row


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("stepcost", help="median cost of target/draft forward passes by dtype and width")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--dtypes",
        default="float32,bfloat16",
        help="each also packed where decoder/kernels.py can, and float32 also in int8 where it runs",
    )
    p.add_argument("--prompt-file", default=__file__, help="the prompt's text (default: this module's source)")
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument(
        "--weights",
        default=",".join(WEIGHTS),
        help="which rows: plain, packed (oneDNN fp32), hf-cache (packed, HF's DynamicCache), int8 (float32 only)",
    )
    p.add_argument("--repeats", type=int, default=15, help="passes of each kind, interleaved; the median is kept")
    p.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own, one per core)")
    p.add_argument("--json")
    return p


def _shipped_eagle3(model, tokenizer):
    """The Eagle3Drafter of the EAGLE-3 draft shipped for this target, on its plain weights; None if none ships."""
    from speccomplete.decoder.drafts import build_drafter
    from speccomplete.decoder.drafts.trained import DraftLoadError

    try:
        return build_drafter("eagle3", model, tokenizer)[0]
    except DraftLoadError:
        return None


def run(args: argparse.Namespace) -> int:
    from transformers import DynamicCache

    from speccomplete.decoder.kernels import can_int8, int8_full_range, pack_linear_weights
    from speccomplete.decoder.lean_forward import supports
    from speccomplete.decoder.loader import use_cpu_kernels
    from speccomplete.decoder.models import load_model
    from speccomplete.decoder.target_steps import EagerTarget

    from .bench import write_json
    from .returns import device_facts

    weights = set(args.weights.split(","))
    if unknown := weights - set(WEIGHTS):
        raise SystemExit(f"--weights: unknown {', '.join(sorted(unknown))}; choose from {', '.join(WEIGHTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    prompt_text = open(args.prompt_file, encoding="utf-8").read()
    rows = {}

    def measure(name: str, model, prompt, eagle3, **kwargs) -> None:
        rows[name] = step_costs(model, prompt, repeats=args.repeats, eagle3=eagle3, **kwargs)

    for dtype in args.dtypes.split(","):
        model, tokenizer = load_model(args.target, device=args.device, dtype=dtype)
        prompt = tokenizer(prompt_text)["input_ids"][: args.prompt_tokens]
        eagle3 = _shipped_eagle3(model, tokenizer)
        int8 = "int8" in weights and can_int8(model) and supports(model)
        if "plain" in weights:
            measure(dtype, model, prompt, eagle3)
        # the draft's linears go with the target's, in one call: what the loader does
        if weights & {"packed", "hf-cache"} and pack_linear_weights(model, *(eagle3.own_modules if eagle3 else ())):
            if "packed" in weights:
                measure(f"{dtype}+packed", model, prompt, eagle3)
            if "hf-cache" in weights:
                # the cache lever: HF's DynamicCache (torch.cat per step) instead of decoder/kv_cache.py
                measure(f"{dtype}+packed+hf-cache", model, prompt, None, cache_factory=DynamicCache)
        del model
        if int8:  # packing is one-way: int8 starts again from the plain weights
            model, _ = load_model(args.target, device=args.device, dtype=dtype)
            eagle3 = _shipped_eagle3(model, tokenizer)
            use_cpu_kernels(EagerTarget(model), model, *(eagle3.own_modules if eagle3 else ()), int8=True)
            measure(f"{dtype}+int8", model, prompt, eagle3)
            del model
    keys = list(dict.fromkeys(k for row in rows.values() for k in row if k != "fastest_ms"))
    facts = device_facts()
    threads = f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
    print(
        f"target={args.target} device={args.device} cpu={facts['cpu']} "
        f"int8 products exact at full range (VNNI/AMX): {int8_full_range()}"
    )
    print(
        f"prompt_tokens={args.prompt_tokens} {threads} "
        f"(median of {args.repeats}, interleaved; ms; ratios to 1 target token)"
    )
    print("weights".ljust(22) + "".join(k.rjust(15) for k in keys))
    for name, row in rows.items():
        print(name.ljust(22) + "".join(f"{row[k]:15.3f}" if k in row else "-".rjust(15) for k in keys))
    for name, row in rows.items():
        fastest = row["fastest_ms"]
        one = fastest["target_1_ms"]
        drafts = [f"{k} {fastest[k]:.3f} ({fastest[k] / one:.3f} of it)" for k in DRAFT_STEPS if k in fastest]
        print(f"{name}, fastest passes: target_1_ms {one:.3f}, " + ", ".join(drafts))
    if args.json:
        write_json(
            {
                "target": args.target,
                "device": args.device,
                "device_facts": facts,
                "int8_full_range": int8_full_range(),
                "prompt_tokens": args.prompt_tokens,
                "repeats": args.repeats,
                "threads": threads,
                "weights": rows,
            },
            args.json,
        )
    return 0
