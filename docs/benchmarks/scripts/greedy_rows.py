"""Greedy decodes with a round's decision on the greedy rows kernel against torch's argmax and logsumexp,
interleaved in one process (docs/cpu.md, "A round's decision"). From the repository root, in its .venv:

    python docs/benchmarks/scripts/greedy_rows.py [REPEATS] [--json PATH]

The default target (int8, the compiled step, built or loaded from the model cache first), plain (AR) and with the
default draft (ngram+self), 64 new tokens on each bundled case (docs/examples/cases.jsonl). Each decoder decodes
every case once per repeat with the kernel and once without, in turn, so drift in the machine's speed hits both
alike; each decode starts from an empty cache, so that all feed their prompt alike. Prints the median decode tok/s
of each, their ratio, and whether every decode gave the same tokens; first, the decision alone (argmax of every
row, log-normalizer of every row) over 1, 5 and 9 rows of Gemma-3's 262,144 logits, median µs of 300 calls.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import torch

from speccomplete.decoder import greedy_rows
from speccomplete.decoder.engine import DecodeOptions
from speccomplete.decoder.loader import load_decoder
from speccomplete.harness.lib.cases import read_cases
from speccomplete.harness.lib.facts import device_facts

CASES = Path(__file__).resolve().parents[2] / "examples" / "cases.jsonl"
NEW_TOKENS = 64
VOCAB = 262_144


def decision_us(rows: int, kernel: bool, calls: int = 300) -> float:
    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows)) * 4

    def decide():
        if kernel:
            _, maxima = greedy_rows.first_maxima(logits)
            return greedy_rows.log_normalizers(logits, maxima)
        logits.argmax(-1).tolist()
        return torch.logsumexp(logits, -1).tolist()

    decide()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        decide()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main(repeats: int, json_path: str | None) -> None:
    decision = {
        rows: {"kernel_us": decision_us(rows, True), "torch_us": decision_us(rows, False)} for rows in (1, 5, 9)
    }
    cases = read_cases(CASES)
    results = {}
    for draft in ("none", "ngram+self"):
        decoder = load_decoder("gemma3-270m", draft, steps="compiled").decoder
        options = DecodeOptions(max_new_tokens=NEW_TOKENS)
        rates = {True: [], False: []}
        tokens = {True: {}, False: {}}
        for kernel in (True, False):  # warm: allocators, the kernel's build, the γ policy's first rounds
            greedy_rows.enabled = kernel
            decoder.generate(cases[0].prefix, options)
        for _ in range(repeats):
            for case in cases:
                for kernel in (True, False):
                    greedy_rows.enabled = kernel
                    decoder.steps.truncate(0)  # each from a cold cache: a reused prompt's last row is fed otherwise
                    generation = decoder.generate(case.prefix, options)
                    stats = generation.stats
                    rates[kernel].append(stats.new_tokens / (stats.total_ms - stats.prefill_ms) * 1000)
                    tokens[kernel].setdefault(case.id, generation.token_ids)
                    if tokens[kernel][case.id] != generation.token_ids:
                        raise AssertionError(f"{draft}: {case.id} decoded other tokens on a repeat")
        greedy_rows.enabled = True
        results[draft] = {
            "kernel_tok_s": statistics.median(rates[True]),
            "torch_tok_s": statistics.median(rates[False]),
            "identical": tokens[True] == tokens[False],
        }
    facts = device_facts()
    print(f"cpu={facts['cpu']} threads={torch.get_num_threads()} cases={len(cases)} repeats={repeats}")
    for rows, row in decision.items():
        print(f"the decision, {rows} rows: kernel {row['kernel_us']:.0f} µs, torch {row['torch_us']:.0f} µs")
    print("draft        kernel tok/s   torch tok/s   kernel / torch   same tokens")
    for draft, row in results.items():
        ratio = row["kernel_tok_s"] / row["torch_tok_s"]
        print(f"{draft:12s} {row['kernel_tok_s']:12.1f} {row['torch_tok_s']:13.1f} {ratio:16.3f}   {row['identical']}")
    if json_path:
        Path(json_path).write_text(
            json.dumps({"device_facts": facts, "repeats": repeats, "decision": decision, "results": results}, indent=1)
        )


if __name__ == "__main__":
    arguments = sys.argv[1:]
    json_path = arguments[arguments.index("--json") + 1] if "--json" in arguments else None
    numbers = [a for a in arguments if a.isdigit()]
    main(int(numbers[0]) if numbers else 3, json_path)
