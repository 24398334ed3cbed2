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

`--shape`: a random-weight Qwen2 model in the shape of a coder users run (SHAPES) instead of `--target`:
acceptance means nothing there, step costs are real. Every row says what the memory bound is for its
weights (`bound_ms`: the time to read as many bytes as a step reads of them, timed among the passes, since
the machine's bandwidth drifts) and how near a one-token step comes to it (`of_bound`, `compiled_of_bound`).

`--profile`: where a target pass's time goes, by torch.profiler. For each weights row, a one-token step and
a verify of the widest width are run under the profiler, and the table gives each top-level operator's calls
and ms a pass (its children included: an `aten::rms_norm` counts the ops inside it), the weight products
(`_int_mm`, oneDNN's linears) summed apart from everything else.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from speccomplete.decoder.drafts import derive_draft
from speccomplete.decoder.kv_cache import forward_logits, forward_tapped, new_cache
from speccomplete.decoder.models import DEFAULT_TARGET

WEIGHTS = ("plain", "packed", "hf-cache", "int8", "int8-torch")  # the rows --weights picks from
EAGLE3_CHAIN = 4  # tokens drafted in a row in the eagle3_4_* columns
DRAFT_STEPS = ("draft_1_ms", "eagle3_1_ms", "eagle3_compiled_1_ms")

# Qwen2.5-Coder's shapes (their config.json), for --shape; all share rope_theta 1e6 and rms_norm_eps 1e-6
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-coder-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14),
    "qwen2.5-coder-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12),
    "qwen2.5-coder-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16),
    "qwen2.5-coder-7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
}


def shape_config(shape: str):
    """The Qwen2Config of `shape` (SHAPES)."""
    from transformers import Qwen2Config

    facts: dict[str, Any] = {"num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True} | SHAPES[
        shape
    ]
    return Qwen2Config(**facts, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, rms_norm_eps=1e-6)


def random_model(shape: str, seed: int = 0):
    """A Qwen2 causal LM of `shape` (SHAPES) with random weights, in fp32 on the CPU."""
    from transformers import Qwen2ForCausalLM

    from speccomplete.decoder.models import available_bytes, parameter_count

    config = shape_config(shape)
    need, have = parameter_count(config) * 4, available_bytes(torch.device("cpu")) or 0
    if need > have * 0.8:  # the int8 copy and the activations need the rest
        raise SystemExit(
            f"--shape {shape}: its fp32 weights take {need / 2**30:.1f} GiB before int8, and {have / 2**30:.1f} GiB "
            "is free; pick a smaller shape"
        )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval().requires_grad_(False)  # as load_model leaves a model


def _prefilled(model, prompt: list[int], cache_factory=new_cache):
    cache = cache_factory()
    forward_logits(model, cache, prompt, keep=1)
    return cache


def _target_pass(model, cache, feed: list[int], compiled=None) -> Callable[[], None]:
    """Feed `feed` after the cached prompt, then crop it off again; through `compiled` (a CompiledStep) if given."""

    def run() -> None:
        if compiled is None:
            forward_logits(model, cache, feed, keep=len(feed))
        else:
            compiled.logits(cache, feed, keep=len(feed))
        cache.crop(-len(feed))

    return run


def _eagle3_steps(drafter, model, prompt: list[int], tokens: int, compiled=None) -> Callable[[], None]:
    """`tokens` chained steps of an Eagle3Drafter's draft after the prompt's rows (built from the target's
    own states), as a round drafting that many tokens runs them: each the layer over one row, the head and
    its argmax, fed back. compiled: the draft's CompiledDraftStep, which runs the layer instead."""
    from speccomplete.decoder.drafts.eagle3.model import KVCache

    draft, embeddings = drafter.draft, drafter.embeddings
    device = embeddings.device
    _, features = forward_tapped(model, new_cache(), prompt, keep=1, taps=drafter.target_taps)
    assert features is not None
    rows = len(prompt) - 1
    cache = KVCache()
    if compiled is not None:
        compiled.reserve(cache)
    ids = torch.tensor(prompt, device=device)
    out = draft.step(
        F.embedding(ids[1:], embeddings), draft.fuse(features[:rows]), torch.arange(1, rows + 1, device=device), cache
    )
    positions = torch.arange(rows + 1, rows + 1 + tokens, device=device)

    def run() -> None:
        state, token = out[-1:], ids[-1:]
        for i in range(tokens):
            embeds = F.embedding(token, embeddings)
            if compiled is not None:
                state = compiled.step(embeds, state, cache)
            else:
                state = draft.step(embeds, state, positions[i : i + 1], cache)
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
    compiled=None,
    compiled_draft=None,
    read_bytes: int | None = None,
) -> dict:
    """Median ms per forward of each width, with the decoder's cache unless `cache_factory` says otherwise;
    with `eagle3` (an Eagle3Drafter on `model`), its draft's step too; with `compiled` (a CompiledStep of
    `model`), the same passes compiled (`compiled_{w}_ms`, for the widths it covers), interleaved with them, and
    with `compiled_draft` (the EAGLE-3 draft's CompiledDraftStep) its chained steps compiled (`eagle3_compiled_*`);
    with `read_bytes` (the weight bytes a step reads), the memory bound: the time to read that many bytes
    (`bound_ms`, interleaved with the passes), and each one-token step's share of it (`of_bound`)."""
    cache = _prefilled(model, prompt, cache_factory)
    passes = {f"target_{w}_ms": _target_pass(model, cache, prompt[-w:]) for w in widths}
    if compiled is not None:
        compiled_cache = _prefilled(model, prompt)
        for w in widths:
            if compiled.covers(w, compiled_cache):
                passes[f"compiled_{w}_ms"] = _target_pass(model, compiled_cache, prompt[-w:], compiled)
    draft = derive_draft(model, list(draft_layers))
    passes["draft_1_ms"] = _target_pass(draft, _prefilled(draft, prompt, cache_factory), prompt[-1:])
    if read_bytes is not None:
        weights_sized = torch.ones(read_bytes // 4)

        def read() -> None:
            weights_sized.sum().item()

        passes["bound_ms"] = read
    cold: tuple[str, ...] = ()
    if eagle3 is not None:
        # Each right after a target pass, as a round's drafting runs: its first step reads the draft's weights
        # from memory; the later steps of a 4-token round may find them still cached.
        passes["eagle3_1_ms"] = _eagle3_steps(eagle3, model, prompt, 1)
        passes[f"eagle3_{EAGLE3_CHAIN}_ms"] = _eagle3_steps(eagle3, model, prompt, EAGLE3_CHAIN)
        if compiled_draft is not None:
            passes["eagle3_compiled_1_ms"] = _eagle3_steps(eagle3, model, prompt, 1, compiled_draft)
            passes[f"eagle3_compiled_{EAGLE3_CHAIN}_ms"] = _eagle3_steps(
                eagle3, model, prompt, EAGLE3_CHAIN, compiled_draft
            )
        cold = tuple(name for name in passes if name.startswith("eagle3_"))
    times = _interleaved_ms(passes, repeats, cold, evict=passes["target_1_ms"])
    row: dict = {name: statistics.median(t) for name, t in times.items()}
    one = row["target_1_ms"]
    row.update({f"verify_{w}_ratio": row[f"target_{w}_ms"] / one for w in widths if w > 1})
    row.update(
        {
            f"compiled_{w}_speedup": row[f"target_{w}_ms"] / row[f"compiled_{w}_ms"]
            for w in widths
            if f"compiled_{w}_ms" in row
        }
    )
    row["c"] = row["draft_1_ms"] / one
    if read_bytes is not None:
        row["read_gb_per_s"] = read_bytes / row["bound_ms"] / 1e6
        row["of_bound"] = row["bound_ms"] / one
        if "compiled_1_ms" in row:
            row["compiled_of_bound"] = row["bound_ms"] / row["compiled_1_ms"]
    if eagle3 is not None:
        row["eagle3_c"] = row["eagle3_1_ms"] / one
        row[f"eagle3_{EAGLE3_CHAIN}_c"] = row[f"eagle3_{EAGLE3_CHAIN}_ms"] / EAGLE3_CHAIN / one  # per token
        if "eagle3_compiled_1_ms" in row and "compiled_1_ms" in row:  # the compiled draft to the compiled target
            row["eagle3_compiled_c"] = row["eagle3_compiled_1_ms"] / row["compiled_1_ms"]
            row[f"eagle3_compiled_{EAGLE3_CHAIN}_c"] = (
                row[f"eagle3_compiled_{EAGLE3_CHAIN}_ms"] / EAGLE3_CHAIN / row["compiled_1_ms"]
            )
    # Other jobs only ever add time: on a busy machine the fastest pass is the better estimate of each.
    row["fastest_ms"] = {name: min(t) for name, t in times.items()}
    return row


# the top-level operators that multiply by a layer's weights: what a pass at the memory bound would be made of
WEIGHT_PRODUCTS = (
    "specdec::int8_rows",  # decoder/int8_rows.PROFILED_AS
    "aten::_int_mm",
    "onednn::qlinear_pointwise",
    "mkldnn::_linear_pointwise",
    "aten::linear",
    "aten::addmm",
    "aten::mm",
)


@torch.inference_mode()
def profile_passes(model, prompt: list[int], widths=(1, 5), repeats: int = 10) -> dict[int, dict]:
    """For each width, the top-level operators of a target pass under torch.profiler: {width: {"ms": wall ms a
    pass, "ops": {name: (calls, ms) a pass}, "products_ms": ..., "other_ms": ..., "other_calls": ...}}."""
    from torch.profiler import ProfilerActivity, profile

    cache = _prefilled(model, prompt)
    report = {}
    for width in widths:
        run = _target_pass(model, cache, prompt[-width:])
        run()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as profiler:
            for _ in range(repeats):
                run()
        wall = (time.perf_counter() - start) * 1000 / repeats
        ops: dict[str, list[float]] = {}
        for event in profiler.events():
            if event.cpu_parent is None:  # top level: children are inside its time
                calls_ms = ops.setdefault(event.name, [0, 0.0])
                calls_ms[0] += 1
                calls_ms[1] += event.cpu_time_total / 1000
        per_pass = {name: (calls / repeats, ms / repeats) for name, (calls, ms) in ops.items()}
        products = [v for name, v in per_pass.items() if name in WEIGHT_PRODUCTS]
        others = [v for name, v in per_pass.items() if name not in WEIGHT_PRODUCTS]
        report[width] = {
            "ms": wall,
            "ops": dict(sorted(per_pass.items(), key=lambda item: -item[1][1])),
            "products_ms": sum(ms for _, ms in products),
            "other_ms": sum(ms for _, ms in others),
            "other_calls": sum(calls for calls, _ in others),
        }
    return report


def print_profile(name: str, report: dict[int, dict], top: int = 12) -> None:
    for width, row in report.items():
        print(
            f"{name}, {width}-token pass under the profiler: {row['ms']:.1f} ms; weight products "
            f"{row['products_ms']:.1f} ms, everything else {row['other_ms']:.1f} ms in {row['other_calls']:.0f} "
            "top-level ops"
        )
        print(f"  {'operator':<52}{'calls':>7}{'ms':>9}")
        for op, (calls, ms) in list(row["ops"].items())[:top]:
            print(f"  {op[:52]:<52}{calls:7.0f}{ms:9.2f}")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("stepcost")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument(
        "--shape",
        choices=list(SHAPES),
        help="instead of --target: random weights in this model's shape (step costs real, acceptance meaningless)",
    )
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
        help="which rows: plain, packed (oneDNN fp32), hf-cache (packed, HF's DynamicCache), int8 (float32 only), "
        "int8-torch (int8 on torch's kernels, not the rows kernel: decoder/int8_rows.py)",
    )
    p.add_argument("--repeats", type=int, default=15, help="passes of each kind, interleaved; the median is kept")
    p.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own, one per core)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile a 1-token step and a verify of the widest width: where their time goes, by operator",
    )
    p.add_argument("--widths", default="1,2,3,5,9", help="tokens a target pass feeds, one column each")
    p.add_argument(
        "--compiled",
        action="store_true",
        help="the packed and int8 rows also time their passes compiled (decoder/compiled_step.py; built or "
        "loaded from the model cache first: minutes the first time), interleaved with the eager ones",
    )
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

    from speccomplete.decoder import int8_rows
    from speccomplete.decoder.kernels import (
        can_int8,
        default_int8_kernel,
        int8_full_range,
        pack_linear_weights,
        torch_int8_kernel,
    )
    from speccomplete.decoder.lean_forward import supports
    from speccomplete.decoder.loader import use_cpu_kernels
    from speccomplete.decoder.models import load_model
    from speccomplete.decoder.target_steps import EagerTarget

    from .lib.facts import cpu_line, device_facts
    from .lib.output import write_json
    from .lib.roofline import weight_bytes_per_token

    weights = set(args.weights.split(","))
    if unknown := weights - set(WEIGHTS):
        raise SystemExit(f"--weights: unknown {', '.join(sorted(unknown))}; choose from {', '.join(WEIGHTS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = {}
    builds: dict[str, dict] = {}  # the compiled steps' build or load: --compiled
    profiles: dict[str, dict] = {}
    widths = tuple(int(w) for w in args.widths.split(","))
    if widths[0] != 1:
        raise SystemExit("--widths: the first width must be 1 (the ratios are to a one-token step)")

    def load(dtype: str):
        """The model, its prompt and its shipped EAGLE-3 draft (None where none ships, or for a --shape)."""
        if args.shape:
            model = random_model(args.shape)
            ids = torch.randint(
                model.config.vocab_size, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)
            )
            return model, ids.tolist(), None
        model, tokenizer = load_model(args.target, device=args.device, dtype=dtype)
        text = open(args.prompt_file, encoding="utf-8").read()
        return model, tokenizer(text)["input_ids"][: args.prompt_tokens], _shipped_eagle3(model, tokenizer)

    def built(report) -> dict:
        return {"from_cache": report.loaded, "seconds": report.seconds, "bytes": report.bytes}

    def measure(name: str, model, prompt, eagle3, weight_bytes: int, quantization: str | None = None, **kwargs) -> None:
        if args.compiled and quantization is not None:
            from speccomplete.decoder.compiled_step import build_or_load

            kwargs["compiled"], report = build_or_load(model, quantization, max(widths))
            builds[name] = built(report)
            if eagle3 is not None:
                from speccomplete.decoder.drafts.eagle3 import compiled as compiled_draft

                kwargs["compiled_draft"], report = compiled_draft.build_or_load(eagle3.draft, quantization, max(widths))
                builds[f"{name}, EAGLE-3 draft"] = built(report)
        rows[name] = step_costs(
            model, prompt, widths=widths, repeats=args.repeats, eagle3=eagle3, read_bytes=weight_bytes, **kwargs
        )
        if args.profile and "cache_factory" not in kwargs:
            profiles[name] = profile_passes(model, prompt, widths=(1, widths[-1]))

    for dtype in args.dtypes.split(","):
        model, prompt, eagle3 = load(dtype)
        int8_kinds = [row for row in ("int8", "int8-torch") if row in weights]
        int8_kinds = int8_kinds if can_int8(model) and supports(model) else []
        plain_bytes = weight_bytes_per_token(model)  # before packing: a packed linear keeps no .weight
        if "plain" in weights:
            measure(dtype, model, prompt, eagle3, plain_bytes)
        # the draft's linears go with the target's, in one call: what the loader does
        packed = weights & {"packed", "hf-cache"} and pack_linear_weights(
            model, *(eagle3.own_modules if eagle3 else ())
        )
        if packed:
            if "packed" in weights:
                measure(f"{dtype}+packed", model, prompt, eagle3, plain_bytes, quantization="none")
            if "hf-cache" in weights:
                # the cache lever: HF's DynamicCache (torch.cat per step) instead of decoder/kv_cache.py
                measure(f"{dtype}+packed+hf-cache", model, prompt, None, plain_bytes, cache_factory=DynamicCache)
        for kind in int8_kinds:
            if packed or kind != int8_kinds[0]:  # packing is one-way: int8 starts again from the plain weights
                del model
                model, prompt, eagle3 = load(dtype)
            int8_bytes = weight_bytes_per_token(model, int8=True)
            kernel = torch_int8_kernel if kind == "int8-torch" else default_int8_kernel
            drafts = eagle3.own_modules if eagle3 else ()
            use_cpu_kernels(EagerTarget(model), model, *drafts, int8=True, int8_kernel=kernel)
            measure(f"{dtype}+{kind}", model, prompt, eagle3, int8_bytes, quantization="int8")
        del model
    keys = list(dict.fromkeys(k for row in rows.values() for k in row if k != "fastest_ms"))
    facts = device_facts()
    rows_kernel = int8_rows.in_use()
    threads = f"{torch.get_num_threads()} threads, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
    print(
        f"target={f'random {args.shape}' if args.shape else args.target} device={args.device} cpu={cpu_line(facts)} "
        f"int8 rows kernel: {rows_kernel}; torch's int8 products exact at full range: {int8_full_range()}"
    )
    print(
        f"prompt_tokens={args.prompt_tokens} {threads} "
        f"(median of {args.repeats}, interleaved; ms; ratios to 1 target token)"
    )
    width = {k: max(15, len(k) + 2) for k in keys}
    print("weights".ljust(22) + "".join(k.rjust(width[k]) for k in keys))
    for name, row in rows.items():
        print(name.ljust(22) + "".join(f"{row[k]:{width[k]}.3f}" if k in row else "-".rjust(width[k]) for k in keys))
    for name, row in rows.items():
        fastest = row["fastest_ms"]
        one = fastest["target_1_ms"]
        drafts = [f"{k} {fastest[k]:.3f} ({fastest[k] / one:.3f} of it)" for k in DRAFT_STEPS if k in fastest]
        print(f"{name}, fastest passes: target_1_ms {one:.3f}, " + ", ".join(drafts))
    for name, build in builds.items():
        print(
            f"{name}, compiled step {'loaded from the cache' if build['from_cache'] else 'built'} in "
            f"{build['seconds']:.1f} s ({build['bytes'] / 1e6:.1f} MB)"
        )
    for name, report in profiles.items():
        print_profile(name, report)
    if args.json:
        write_json(
            {
                "target": args.target,
                "shape": args.shape,
                "device": args.device,
                "device_facts": facts,
                "int8_full_range": int8_full_range(),
                "int8_rows": rows_kernel,
                "prompt_tokens": args.prompt_tokens,
                "repeats": args.repeats,
                "threads": threads,
                "weights": rows,
                "compiled_builds": builds,
                "profiles": profiles,
            },
            args.json,
        )
    return 0
