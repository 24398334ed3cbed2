"""Where the EAGLE-3 draft's CPU step goes, and what a smaller draft vocabulary would save: measured, not
built (docs/eagle3.md, "CPU cost"). From the repository root, in its .venv:

    python docs/benchmarks/scripts/eagle3_step.py parts [REPEATS]
    python docs/benchmarks/scripts/eagle3_step.py vocab [REPEATS]
    python docs/benchmarks/scripts/eagle3_step.py coverage SPLITS

The shipped draft for gemma3-270m and the target in int8, quantized in one call as the loader does
(decoder/loader.py, use_cpu_kernels), 2 threads, a 300-token prompt. Every timed pass comes right
after a target step, as a round's drafting does.

`parts`: ms per step of 4 chained steps (each the layer over one row, the head and its argmax), split
by module with forward hooks: q/k/v, o, gate+up, down, the head, the four norms, attention, and the
rest (rotary, residuals, the cache, small ops).

`vocab`: one chained step with the head cut to its first 16k or 8k rows, as a draft over fewer ids
would run, beside the 32k head; each as a fraction of the target step.

`coverage`: which share of the dev splits' tokens (SPLITS from `specdec corpus`: <lang>.train.txt and
<lang>.dev.txt, one path a line) the draft's ids cover, all 32k or its top K by train-split frequency.
"""

from __future__ import annotations

import collections
import copy
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from speccomplete.decoder.drafts import build_drafter
from speccomplete.decoder.loader import use_cpu_kernels
from speccomplete.decoder.models import load_model
from speccomplete.decoder.target_steps import EagerTarget

PROMPT = Path(__file__).read_text()


def int8_pair(heads=(32768,)):
    """The int8 target's steps, tokenizer, drafter (its embeddings and taps), and an int8 draft per head size."""
    target, tokenizer = load_model("gemma3-270m", device="cpu", dtype="float32")
    drafter = build_drafter("eagle3", target, tokenizer)[0]
    drafts = {}
    for rows in heads:
        draft = copy.deepcopy(drafter.draft)
        if rows != draft.shape.draft_vocab:
            head = torch.nn.Linear(draft.shape.hidden_size, rows, bias=False)
            head.weight.data = draft.lm_head.weight.data[:rows].clone()
            draft.lm_head = head
        drafts[rows] = draft
    steps = EagerTarget(target, drafter.target_taps)
    use_cpu_kernels(steps, target, *drafts.values(), int8=True)
    return steps, tokenizer, drafter, drafts


def chained(draft, drafter, features, prompt, tokens):
    cache = type(drafter.cache)()
    emb, rows = drafter.embeddings, len(prompt) - 1
    out = draft.step(F.embedding(torch.tensor(prompt[1:]), emb), draft.fuse(features), torch.arange(1, rows + 1), cache)

    def run():
        state, token = out[-1:], torch.tensor([prompt[-1]])
        for i in range(tokens):
            state = draft.step(F.embedding(token, emb), state, torch.tensor([rows + 1 + i]), cache)
            token = draft.logits(state).argmax(-1)
        cache.truncate(rows)

    return run


def timed_after_target(steps, prompt, runs: dict, repeats: int) -> dict[str, list[float]]:
    def target():
        steps.forward(prompt[-1:], keep=1)
        steps.truncate(len(prompt))

    times: dict[str, list[float]] = {"target": [], **{name: [] for name in runs}}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            target()
            times["target"].append(time.perf_counter() - start)
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


def hook_timers(draft) -> collections.Counter:
    """Seconds spent in each of the draft's modules (and attention), summed until cleared."""
    spent: collections.Counter = collections.Counter()
    layer = draft.layer
    groups = {
        "q/k/v": [layer.self_attn.projections],
        "o": [layer.self_attn.o_proj],
        "gate+up": [layer.mlp.gate_up],
        "down": [layer.mlp.down_proj],
        "head": [draft.lm_head],
        "norms": [layer.input_layernorm, layer.hidden_norm, layer.post_attention_layernorm, draft.norm],
    }
    for name, modules in groups.items():
        for module in modules:
            module.register_forward_pre_hook(lambda m, a, name=name: spent.update({name + "@": -time.perf_counter()}))
            module.register_forward_hook(lambda m, a, o, name=name: spent.update({name: time.perf_counter()}))
    attention = F.scaled_dot_product_attention

    def timed_attention(*args, **kwargs):
        start = time.perf_counter()
        out = attention(*args, **kwargs)
        spent["attention"] += time.perf_counter() - start
        return out

    F.scaled_dot_product_attention = timed_attention
    return spent


def parts(repeats: int) -> None:
    steps, tokenizer, drafter, drafts = int8_pair()
    draft = drafts[32768]
    prompt = tokenizer(PROMPT)["input_ids"][:300]
    tokens = 4
    with torch.inference_mode():
        steps.forward(prompt, keep=1)
        run = chained(draft, drafter, steps.features.rows(0, len(prompt) - 1), prompt, tokens)
        spent = hook_timers(draft)
        per_module: dict[str, list[float]] = collections.defaultdict(list)

        def recorded():
            spent.clear()
            run()
            # a pre-hook adds -start under "name@", the hook adds the end time under "name": their sum is the time
            for name in ("q/k/v", "o", "gate+up", "down", "head", "norms", "attention"):
                per_module[name].append((spent[name] + spent[name + "@"]) / tokens)

        times = timed_after_target(steps, prompt, {"chain": recorded}, repeats)
    step = statistics.median(times["chain"]) / tokens
    print(f"target step {statistics.median(times['target']) * 1e3:.2f} ms; draft step {step * 1e3:.3f} ms (4 chained)")
    known = 0.0
    for name, values in per_module.items():
        known += statistics.median(values)
        print(f"  {name:10s} {statistics.median(values) * 1e3:.3f} ms")
    print(f"  {'rest':10s} {(step - known) * 1e3:.3f} ms")


def vocab(repeats: int) -> None:
    steps, tokenizer, drafter, drafts = int8_pair((32768, 16384, 8192))
    prompt = tokenizer(PROMPT)["input_ids"][:300]
    with torch.inference_mode():
        steps.forward(prompt, keep=1)
        features = steps.features.rows(0, len(prompt) - 1)
        runs = {f"head {rows}": chained(draft, drafter, features, prompt, 1) for rows, draft in drafts.items()}
        times = timed_after_target(steps, prompt, runs, repeats)
    one = statistics.median(times["target"])
    for name, values in times.items():
        ms = statistics.median(values) * 1e3
        print(f"{name:12s} median {ms:8.3f} ms ({ms / 1e3 / one:.3f} of a target step)")


def coverage(splits: Path, train_files: int = 60, dev_files: int = 20) -> None:
    from safetensors.torch import load_file

    from speccomplete.decoder.drafts.build import shipped_eagle3_for

    target, tokenizer = load_model("gemma3-270m", device="cpu", dtype="float32")
    folder = shipped_eagle3_for(target)
    d2t = load_file(str(folder / "model.safetensors"))["d2t"]
    ids = (torch.arange(len(d2t)) + d2t).tolist()
    rng = random.Random(0)

    def count(split: str, files: int) -> tuple[collections.Counter, int]:
        counts: collections.Counter = collections.Counter()
        total = 0
        for listing in sorted(splits.glob(f"*.{split}.txt")):
            paths = listing.read_text().split()
            rng.shuffle(paths)
            for path in paths[:files]:
                text = Path(path).read_text(errors="ignore")[:20000]
                tokens = tokenizer(text)["input_ids"]
                counts.update(tokens)
                total += len(tokens)
        return counts, total

    train, _ = count("train", train_files)
    dev, dev_total = count("dev", dev_files)
    ranked = sorted(ids, key=lambda i: -train[i])
    for k in (4096, 8192, 16384, len(ids)):
        kept = set(ranked[:k])
        print(f"top {k:6d} draft ids: {sum(n for i, n in dev.items() if i in kept) / dev_total:.4f} of dev tokens")


if __name__ == "__main__":
    torch.set_num_threads(2)
    mode = sys.argv[1]
    if mode == "coverage":
        coverage(Path(sys.argv[2]))
    else:
        {"parts": parts, "vocab": vocab}[mode](int(sys.argv[2]) if len(sys.argv) > 2 else 25)
