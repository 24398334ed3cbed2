"""The int8 target's step on the rows kernel against torch's kernels, interleaved in one process (docs/cpu.md,
"Number formats"). From the repository root, in its .venv:

    python docs/benchmarks/scripts/int8_kernels.py [REPEATS] [--json PATH]

Two int8 copies of gemma3-270m, quantized as the loader does (decoder/loader.py, use_cpu_kernels): one on
the default kernels (the rows kernel, decoder/int8_rows.py, where it runs), one on torch's (`_int_mm` for the
layers, oneDNN's blocked matmul for the head). Each pass feeds 1 to 17 tokens after a 300-token prompt,
eagerly and through the compiled step (built or loaded from the model cache first); every pass of both
copies runs once per repeat, in turn, so drift in the machine's speed hits them alike. Prints the median ms
of each and torch's over the rows kernel's.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from speccomplete.decoder.compiled_step import build_or_load
from speccomplete.decoder.kernels import default_int8_kernel, torch_int8_kernel
from speccomplete.decoder.loader import use_cpu_kernels
from speccomplete.decoder.models import load_model
from speccomplete.decoder.target_steps import EagerTarget
from speccomplete.harness.lib.facts import device_facts
from speccomplete.harness.stepcost import _interleaved_ms, _prefilled, _target_pass

WIDTHS = (1, 2, 3, 5, 9, 17)
KERNELS = {"rows": default_int8_kernel, "torch": torch_int8_kernel}


def main(repeats: int, json_path: str | None) -> None:
    passes = {}
    models = []  # held: the passes close over their caches, not the models
    text = Path(__file__).read_text()
    for name, kernel in KERNELS.items():
        model, tokenizer = load_model("gemma3-270m", dtype="float32")
        prompt = tokenizer(text * 20)["input_ids"][:300]
        use_cpu_kernels(EagerTarget(model), model, int8=True, int8_kernel=kernel)
        compiled, _ = build_or_load(model, "int8", max(WIDTHS))
        with torch.inference_mode():
            eager_cache, compiled_cache = _prefilled(model, prompt), _prefilled(model, prompt)
        for width in WIDTHS:
            passes[f"{name} eager {width}"] = _target_pass(model, eager_cache, prompt[-width:])
            passes[f"{name} compiled {width}"] = _target_pass(model, compiled_cache, prompt[-width:], compiled)
        models.append(model)
    with torch.inference_mode():
        times = _interleaved_ms(passes, repeats)
    medians = {name: statistics.median(ms) for name, ms in times.items()}
    facts = device_facts()
    print(f"cpu={facts['cpu']} threads={torch.get_num_threads()} repeats={repeats} (median ms)")
    print("step       tokens   rows kernel   torch's   torch's / rows")
    for mode in ("eager", "compiled"):
        for width in WIDTHS:
            ours, theirs = medians[f"rows {mode} {width}"], medians[f"torch {mode} {width}"]
            print(f"{mode:9s} {width:7d} {ours:13.2f} {theirs:9.2f} {theirs / ours:16.2f}")
    if json_path:
        Path(json_path).write_text(
            json.dumps({"device_facts": facts, "repeats": repeats, "median_ms": medians}, indent=1)
        )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    json_path = arguments[arguments.index("--json") + 1] if "--json" in arguments else None
    numbers = [a for a in arguments if a.isdigit()]
    main(int(numbers[0]) if numbers else 11, json_path)
