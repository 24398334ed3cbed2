"""Quantized linears on the CPU, measured and not built (docs/benchmarks/README.md, section 7). From the
repository root, in its .venv:

    python docs/benchmarks/scripts/quantized_linears.py kernels
    python docs/benchmarks/scripts/quantized_linears.py target CASES.jsonl NEXTLINE_CASES.jsonl

`kernels`: median ms of one product on Gemma-3-270M's shapes, the packed fp32 product the product
uses (decoder/kernels.py) against fbgemm's dynamic int8 (`quantize_dynamic`: int8 weights per output
channel; each input quantized to uint8 on the fly, one scale for all its rows) and torch's int4 weight-only CPU kernel
(`_weight_int4pack_mm_for_cpu`, groups of 32, the shape of the GGUF's Q4_K blocks).

`target`: the whole target with every linear dynamic-int8 (`int8`), or all but the head
(`int8body`), against fp32 packed: prefill ms a token and AR tok/s (prefill included) on the
bench's prompts for CASES.jsonl, how many of the fp32 target's 64-token greedy completions stay
identical, how many of its own AR completions a speculative decoder (`ngram+none`) on the same target
reproduces, and `specdec nextline` quality on NEXTLINE_CASES.jsonl (both from `specdec cases`).
"""

from __future__ import annotations

import sys
import time
import warnings

import torch

warnings.filterwarnings("ignore")  # torch.ao.quantization's deprecation notice


def median_ms(run, reps: int) -> float:
    for _ in range(3):
        run()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return sorted(times)[reps // 2] * 1000


def kernels() -> None:
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    print(f"{torch.get_num_threads()} threads; median ms of one product")
    print(f"{'out x in':>14} {'rows':>5} {'fp32 packed':>12} {'int8 dynamic':>13} {'int4 weights':>13}")
    for out_features, in_features in [(1024, 640), (4096, 640), (640, 2048), (262144, 640)]:
        linear = torch.nn.Linear(in_features, out_features, bias=False)
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 8)
        int8 = quantize_dynamic(torch.nn.Sequential(linear), {"0": per_channel_dynamic_qconfig}, dtype=torch.qint8)
        nibbles = torch.randint(0, 16, (out_features, in_features), dtype=torch.int32)
        int4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(nibbles, 1)
        scales_and_zeros = torch.randn(in_features // 32, out_features, 2)
        for rows in (1, 5, 300):
            x = torch.randn(rows, in_features)
            reps = 5 if out_features * rows > 10**7 else 30
            fp32_ms = median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], ""), reps)
            int8_ms = median_ms(lambda: int8(x), reps)
            # the int4 kernel is so slow here that its big cases would take minutes
            int4_ms = (
                median_ms(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, int4, 32, scales_and_zeros), 3)
                if out_features * rows <= 4096 * 5
                else float("nan")
            )
            print(f"{out_features:>7} x {in_features:<4} {rows:>5} {fp32_ms:>12.3f} {int8_ms:>13.3f} {int4_ms:>13.3f}")


def quantized_target(mode: str):
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    from speccomplete.decoder.kernels import pack_linear_weights
    from speccomplete.decoder.loader import load_decoder

    loaded = load_decoder("gemma3-270m", "none", device="cpu", pack=mode == "fp32")
    if mode != "fp32":
        names = [
            name
            for name, module in loaded.target.named_modules()
            if isinstance(module, torch.nn.Linear) and not (mode == "int8body" and name == "lm_head")
        ]
        quantize_dynamic(
            loaded.target, {name: per_channel_dynamic_qconfig for name in names}, dtype=torch.qint8, inplace=True
        )
        pack_linear_weights(loaded.target)  # what is left in fp32: the head, for int8body
    return loaded


def target(cases_path: str, nextline_path: str) -> None:
    from speccomplete.decoder.drafts import build_drafter
    from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
    from speccomplete.decoder.gamma import parse_gamma_policy
    from speccomplete.harness.lib.cases import read_cases
    from speccomplete.harness.nextline import next_line_quality

    cases, nextline_cases = read_cases(cases_path), read_cases(nextline_path)
    rows = []  # the bench's prompt ids, and the fp32 target's greedy tokens once its row has run
    print(
        f"{torch.get_num_threads()} threads; {len(cases)} prompts x 64 tokens, next line on {len(nextline_cases)} cases"
    )
    print(
        f"{'target':>9} {'prefill ms/tok':>15} {'AR tok/s':>9} {'identical':>10} {'agreeing prefix':>16}"
        f" {'spec = AR':>10}"
        f" {'next-line exact':>16} {'similarity':>11}"
    )
    for mode in ("fp32", "int8body", "int8"):
        loaded = quantized_target(mode)
        decoder = loaded.decoder
        spec = SpeculativeDecoder(
            loaded.target,
            loaded.tokenizer,
            build_drafter("ngram+none", loaded.target, loaded.tokenizer)[0],
            parse_gamma_policy("heuristic"),
        )
        if not rows:
            rows = [{"prompt": decoder.fit_prompt(decoder.encode(case.prefix), 64, 1024)[0]} for case in cases]
        prefill, seconds, tokens, identical, prefix, spec_same = [], 0.0, 0, 0, 0, 0
        for row in rows:
            decoder.steps.truncate(0)
            start = time.perf_counter()
            decoder.steps.forward(row["prompt"], keep=1)
            prefill.append((time.perf_counter() - start) * 1000 / len(row["prompt"]))
            decoder.steps.truncate(0)
            start = time.perf_counter()
            got = decoder.generate(row["prompt"], DecodeOptions(max_new_tokens=64)).token_ids
            seconds += time.perf_counter() - start
            tokens += len(got)
            row.setdefault("greedy", got)
            identical += got == row["greedy"]
            prefix += next((i for i, (a, b) in enumerate(zip(got, row["greedy"])) if a != b), len(got))
            spec_same += spec.generate(row["prompt"], DecodeOptions(max_new_tokens=64)).token_ids == got
        quality = next_line_quality(decoder, nextline_cases)["OVERALL"]
        print(
            f"{mode:>9} {sorted(prefill)[len(prefill) // 2]:>15.2f} {tokens / seconds:>9.1f}"
            f" {identical:>6}/{len(rows):<3} {prefix / len(rows):>16.1f} {spec_same:>6}/{len(rows):<3}"
            f" {quality['exact_match']:>16.3f} {quality['similarity']:>11.3f}",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["kernels"]:
        kernels()
    elif sys.argv[1:2] == ["target"] and len(sys.argv) == 4:
        target(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
