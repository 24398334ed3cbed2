"""The compiled step calling our kernels as C++ operators against calling them through Python, interleaved in one
process (docs/cpu.md, "The compiled step's operators"). From the repository root, in its .venv:

    python docs/benchmarks/scripts/torch_ops.py [REPEATS] [--json PATH]

One int8 copy of gemma3-270m, quantized as the loader does, and two compiled steps of it (built or loaded from
the model cache first): one whose graph calls the int8 rows and attention kernels as operators registered from
C++ (decoder/torch_ops.py), one whose graph calls them through the Python operators (kernels.opaque_linear,
lean_forward.attend_tree_rows) as before. Each pass feeds 1 to 17 tokens after a 300-token prompt; every pass
runs once per repeat, in turn, so drift in the machine's speed hits them alike. Prints the median ms of each,
Python's over C++'s, and whether the two steps' logits are equal.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch

from speccomplete.decoder import torch_ops
from speccomplete.decoder.compiled_step import build_or_load
from speccomplete.decoder.loader import use_cpu_kernels
from speccomplete.decoder.models import load_model
from speccomplete.decoder.target_steps import EagerTarget
from speccomplete.harness.lib.facts import device_facts
from speccomplete.harness.stepcost import _interleaved_ms, _prefilled, _target_pass

WIDTHS = (1, 3, 5, 9, 17)


def main(repeats: int, json_path: str | None) -> None:
    model, tokenizer = load_model("gemma3-270m", dtype="float32")
    prompt = tokenizer(Path(__file__).read_text() * 20)["input_ids"][:300]
    use_cpu_kernels(EagerTarget(model), model, int8=True)
    if not (torch_ops.int8_rows_op() and torch_ops.attend_rows_op()):
        sys.exit("the C++ operators are not available here (decoder/torch_ops.py logs why)")
    steps = {"c++": build_or_load(model, "int8", max(WIDTHS))[0]}
    with mock.patch.object(torch_ops, "int8_rows_op", lambda: False):
        with mock.patch.object(torch_ops, "attend_rows_op", lambda: False):
            steps["python"] = build_or_load(model, "int8", max(WIDTHS))[0]
    passes = {}
    with torch.inference_mode():
        caches = {name: _prefilled(model, prompt) for name in steps}
        same = torch.equal(*(step.logits(_prefilled(model, prompt), prompt[-5:], 5)[0] for step in steps.values()))
    for width in WIDTHS:
        for name, step in steps.items():
            passes[f"{width} {name}"] = _target_pass(model, caches[name], prompt[-width:], step)
    with torch.inference_mode():
        times = _interleaved_ms(passes, repeats)
    medians = {name: statistics.median(ms) for name, ms in times.items()}
    facts = device_facts()
    print(f"cpu={facts['cpu']} threads={torch.get_num_threads()} repeats={repeats} (median ms)")
    print(f"the two steps' logits on a 5-token verify: {'equal' if same else 'DIFFERENT'}")
    print("tokens   C++ operators   Python operators   Python / C++")
    for width in WIDTHS:
        ours, before = medians[f"{width} c++"], medians[f"{width} python"]
        print(f"{width:6d} {ours:15.2f} {before:18.2f} {before / ours:14.3f}")
    if json_path:
        record = {"device_facts": facts, "repeats": repeats, "logits_equal": same, "median_ms": medians}
        Path(json_path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    arguments = sys.argv[1:]
    json_path = arguments[arguments.index("--json") + 1] if "--json" in arguments else None
    numbers = [a for a in arguments if a.isdigit()]
    main(int(numbers[0]) if numbers else 11, json_path)
