"""The target's steps and verifies with attention on the rows kernel against SDPA, interleaved in one process
(docs/cpu.md, "Attention for a step's rows"). From the repository root, in its .venv:

    python docs/benchmarks/scripts/attend_rows.py [REPEATS] [--json PATH]

One int8 copy of gemma3-270m, quantized as the loader does; each pass feeds 1 to 17 tokens after a 300-token
prompt, eagerly and through the compiled step (built or loaded from the model cache first), once with the
attention rows kernel (decoder/attend_rows.py) and once on SDPA row by row as before it; every pass runs once
per repeat, in turn, so drift in the machine's speed hits them alike. Prints the median ms of each and SDPA's
over the kernel's.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from speccomplete.decoder import attend_rows
from speccomplete.decoder.compiled_step import build_or_load
from speccomplete.decoder.loader import use_cpu_kernels
from speccomplete.decoder.models import load_model
from speccomplete.decoder.target_steps import EagerTarget
from speccomplete.harness.lib.facts import device_facts
from speccomplete.harness.stepcost import _interleaved_ms, _prefilled, _target_pass

WIDTHS = (1, 3, 5, 9, 17)


def attending(kernel: bool, run):
    def timed() -> None:
        attend_rows.enabled = kernel
        run()

    return timed


def main(repeats: int, json_path: str | None) -> None:
    model, tokenizer = load_model("gemma3-270m", dtype="float32")
    prompt = tokenizer(Path(__file__).read_text() * 20)["input_ids"][:300]
    use_cpu_kernels(EagerTarget(model), model, int8=True)
    compiled, _ = build_or_load(model, "int8", max(WIDTHS))
    passes = {}
    with torch.inference_mode():
        caches = {(mode, kernel): _prefilled(model, prompt) for mode in ("eager", "compiled") for kernel in (0, 1)}
    for width in WIDTHS:
        for (mode, kernel), cache in caches.items():
            step = _target_pass(model, cache, prompt[-width:], compiled if mode == "compiled" else None)
            passes[f"{mode} {width} {'kernel' if kernel else 'sdpa'}"] = attending(bool(kernel), step)
    with torch.inference_mode():
        times = _interleaved_ms(passes, repeats)
    attend_rows.enabled = True
    medians = {name: statistics.median(ms) for name, ms in times.items()}
    facts = device_facts()
    print(f"cpu={facts['cpu']} threads={torch.get_num_threads()} repeats={repeats} (median ms)")
    print("step       tokens   rows kernel     SDPA   SDPA / kernel   of a one-token step (kernel, SDPA)")
    for mode in ("eager", "compiled"):
        for width in WIDTHS:
            ours, theirs = medians[f"{mode} {width} kernel"], medians[f"{mode} {width} sdpa"]
            one, one_sdpa = medians[f"{mode} 1 kernel"], medians[f"{mode} 1 sdpa"]
            print(
                f"{mode:9s} {width:7d} {ours:13.2f} {theirs:8.2f} {theirs / ours:15.2f}"
                f"   {ours / one:.2f}, {theirs / one_sdpa:.2f}"
            )
    if json_path:
        Path(json_path).write_text(
            json.dumps({"device_facts": facts, "repeats": repeats, "median_ms": medians}, indent=1)
        )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    json_path = arguments[arguments.index("--json") + 1] if "--json" in arguments else None
    numbers = [a for a in arguments if a.isdigit()]
    main(int(numbers[0]) if numbers else 11, json_path)
