"""`specdec bench`: our AR, our speculative decoder and HF's, on the same cases, in one run.

Every method sees the same prompt ids and the same max_new_tokens, greedy. The methods run in a
rotated order case by case, after a warm-up, so drift in machine speed hits them alike. Tokens/s
is total tokens over total wall time per method, prefill included (what an editor waits for);
it is also given without prefill (decode tok/s), which both sides of a speedup share. Each case
keeps every method's prefill and decode times: our decoders' and llama.cpp's prefill as their stats
say, HF's as the time to its first streamed token.

The timings are of steady state: the warm-up records every graph (compiled steps are called twice
at every row count: torch.compile's cudagraph trees record on a graph's second call), and the bench
counts the CUDA graphs recorded and the graphs compiled around the timed runs. One inside them is
reported (`steady_state` false, with the counts), not passed over.

Ours are named `ar` (the baseline: same engine, weights and cache, γ = 0), `spec` (the product)
and `spec_*` / `ar_*` ablations, each one lever swapped or off. HF runs on the stock model: plain
greedy, and assisted generation with a model draft and with prompt lookup. After each case the
product decoder is asked again with its first 8 tokens accepted, as an editor would, against a
cold decoder: prefix reuse.

One module per job: `contenders` builds the rows, `methods` times one row on one prompt, `loop` runs the
cases, `records` holds the runs, `summary` turns them into the JSON and events, `table` into text; this
module is the subcommand, its arguments and `run`.
"""

from __future__ import annotations

import argparse
import os

from ..lib.cases import read_cases
from ..lib.facts import device_facts
from ..lib.model_args import add_model_args, device_name, load
from ..lib.output import write_json, write_whole
from ..lib.roofline import memory_bandwidth_gbs, weight_bytes_per_token
from .contenders import (
    ABLATION_DRAFTS,
    QUANTIZED_ROWS,
    build_contenders,
    llamacpp_contenders,
    quantization_contenders,
    step_kind,
)
from .loop import run_bench
from .records import CaseRuns
from .summary import bench_events, report
from .table import case_line, format_table


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("bench")
    p.add_argument("--cases", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--json")
    p.add_argument("--limit", type=int, help="use only the first N cases")
    p.add_argument("--hf-gammas", default="1", help="constant γ values to try for HF assisted (besides its default)")
    p.add_argument("--no-hf", action="store_true", help="time only our decoders")
    p.add_argument("--ablations", action="store_true", help="also time our decoder with each lever turned off")
    p.add_argument(
        "--compare-drafts",
        default=None,
        help="drafts timed beside the product's, comma-separated (spec_draft_* rows); "
        "default: none, or " + ",".join(ABLATION_DRAFTS) + " with --ablations",
    )
    p.add_argument(
        "--compare-tree-nodes",
        default="",
        help="also time the speculative rows (spec and spec_draft_*) with draft trees of these many nodes, "
        "comma-separated (0: chains): rows NAME_treeN",
    )
    p.add_argument(
        "--compare-workspace",
        type=int,
        default=0,
        metavar="MIN_NGRAM",
        help="also time the speculative rows with a lookup that copies from the case's workspace too, on matches "
        "of MIN_NGRAM tokens or more (the cases' `workspace` folder: `specdec cases --workspace`): rows "
        "NAME_workspace (default 0: none)",
    )
    p.add_argument("--compare-gammas", default="heuristic,cost", help="γ policies for the ablation rows")
    p.add_argument(
        "--compare-confidences",
        default="0.4",
        help="draft confidence thresholds for the ablation rows (HF's default is 0.4)",
    )
    p.add_argument(
        "--prompt-lookup",
        type=int,
        default=10,
        help="HF assisted with prompt lookup, this many tokens per round (0: skip)",
    )
    p.add_argument(
        "--llamacpp",
        default="",
        help="llama.cpp rows on the same prompts, one per speculative method, comma-separated: none (its AR), "
        "ngram-mod, ngram-simple, ... (default: no llama.cpp rows)",
    )
    p.add_argument("--gguf", help="the GGUF llama.cpp runs (default: the packaged target's own)")
    p.add_argument(
        "--compare-quantization",
        choices=tuple(QUANTIZED_ROWS),
        help="also time the target with these weights (a second copy): rows fp32_ar and fp32_spec for none, "
        "int8_ar and int8_spec for int8",
    )
    p.add_argument("--events", help="also append one completion event per case for AR, spec and llama.cpp (JSONL)")
    add_model_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from speccomplete.decoder.drafts import build_drafter, draft_label
    from speccomplete.decoder.drafts.trained import with_full_vocab_head
    from speccomplete.decoder.loader import compile_steps, eagle3_draft, use_cpu_kernels
    from speccomplete.decoder.models import load_model
    from speccomplete.decoder.target_steps import EagerTarget

    cases = read_cases(args.cases)
    if args.limit:
        cases = cases[: args.limit]
    loaded = load(args, pack=False)
    args.quantization = loaded.quantization  # auto resolved: what the rows say they ran on
    tokenizer, decoder = loaded.tokenizer, loaded.decoder
    target = loaded.target
    # Drafts are built from the target's plain weights, so the ablations' drafts come before packing.
    compared = (
        args.compare_drafts.split(",")
        if args.compare_drafts is not None
        else (ABLATION_DRAFTS if args.ablations else ())
    )
    other_drafts = {
        spec: build_drafter(spec, target, tokenizer, device=args.device, dtype=args.dtype)
        for spec in compared
        if spec and spec != args.draft
    }
    int8 = args.quantization == "int8"
    weight_bytes = weight_bytes_per_token(target, int8)  # before packing: a packed linear keeps no .weight
    if not args.no_pack or int8:
        # with the draft models, the modules drafters run themselves (an EAGLE-3 draft's layer and head)
        drafters = [decoder.drafter, *(drafter for drafter, _ in other_drafts.values())]
        use_cpu_kernels(
            decoder.steps,
            target,
            loaded.draft_model,
            *(model for _, model in other_drafts.values()),
            *(module for drafter in drafters if drafter is not None for module in drafter.own_modules),
            int8=int8,
        )
    # The stock model, as HF users run it (no packed kernels): HF's columns and the unpacked ablations.
    stock = None
    if not args.no_hf or (args.ablations and not args.no_pack):
        stock, _ = load_model(args.target, device=args.device, dtype=args.dtype)
    contenders, doc = build_contenders(args, target, tokenizer, decoder, other_drafts, stock)
    if args.steps == "compiled" and isinstance(decoder.steps, EagerTarget):
        # On the CPU: after packing, and after every row's drafter attached to the shared steps (an EAGLE-3 draft's
        # taps go into the graph; attaching it after would drop a graph built without them), for the row with an
        # EAGLE-3 draft where one has it, whose draft step is compiled with the target's.
        shared = [row for row in contenders.ours.values() if row.steps is decoder.steps]
        with_eagle3 = next((row for row in shared if eagle3_draft(row.drafter) is not None), decoder)
        decoder.steps.use_compiled(compile_steps(with_eagle3, args.quantization)[0])
    if args.llamacpp:
        from speccomplete.decoder.models import packaged_gguf

        contenders.llamacpp, llama_doc = llamacpp_contenders(
            args.llamacpp, args.gguf or str(packaged_gguf(args.target))
        )
        doc |= llama_doc
    if args.compare_quantization and args.compare_quantization != args.quantization:
        rows, rows_doc = quantization_contenders(args, args.compare_quantization)
        contenders.ours |= rows
        doc |= rows_doc
    if not args.no_hf:
        contenders.hf_target = stock
        # HF assisted gets the shipped model draft, whatever our product drafts with
        _, stock_draft = build_drafter("auto", stock, tokenizer, device=args.device, dtype=args.dtype)
        contenders.hf_draft = with_full_vocab_head(stock_draft) if stock_draft is not None else None
    device = device_name(target)
    bandwidth = memory_bandwidth_gbs(target.device)  # before the cases: each case's JSON has the bound

    # the machine beside the numbers (GPU name, versions, date): the tables are committed with them;
    # "device" is already the torch device the rows ran on
    facts = device_facts()

    def write(results: list[CaseRuns]) -> str:
        """The report of the cases so far, into --json and its .txt; returns the table."""
        data = report(
            results,
            tokenizer,
            device=device,
            dtype=str(target.dtype).replace("torch.", ""),
            target=args.target,
            draft=args.draft,
            gamma=args.gamma,
            max_new_tokens=args.max_new_tokens,
            bandwidth_gbs=bandwidth,
            weight_bytes=weight_bytes,
            methods_doc=doc,
            steps=step_kind(contenders.ours["spec"].steps),
        )
        data["device_facts"] = facts
        data["complete"] = len(results) == len(cases)
        table = format_table(data)
        if args.json:
            write_json(data, args.json)
            write_whole(os.path.splitext(args.json)[0] + ".txt", table + "\n")
        return table

    done: list[CaseRuns] = []

    def progress(result: CaseRuns) -> None:
        """Each case as it ends: its line in the log and the tables so far on disk (a run stopped by a
        time cap leaves them)."""
        bar.write(case_line(result))
        if any(result.recorded.values()):
            bar.write(f"!!! case {result.case.id} recorded or compiled graphs inside its timed runs: {result.recorded}")
        done.append(result)
        if len(done) < len(cases):
            write(done)
        bar.update(1)

    bar = tqdm(total=len(cases), desc="bench", unit="case")
    results = run_bench(
        cases,
        contenders,
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens,
        hf_gammas=[int(g) for g in args.hf_gammas.split(",") if g],
        prompt_lookup=args.prompt_lookup or None,
        progress=progress,
        say=bar.write,
    )
    bar.close()
    if args.events:
        from speccomplete.telemetry.log import EventLog

        with EventLog(args.events) as log:
            for event in bench_events(
                results,
                target=args.target,
                draft=draft_label(args.draft, target),
                device=device,
                gamma=args.gamma,
                max_new_tokens=args.max_new_tokens,
            ):
                log.write(event)
    print(write(results))
    return 0
