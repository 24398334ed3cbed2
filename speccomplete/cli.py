"""The `specdec` command."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import torch

from speccomplete.decoder.models import DEFAULT_DRAFT, DEFAULT_TARGET, STEPS, ModelError


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default=DEFAULT_TARGET, help="packaged alias, local directory or HF id")
    p.add_argument("--draft", default=DEFAULT_DRAFT,
                   help="'auto' (the shipped trained draft for the target, else layers:0,1), 'self' (the "
                        "target with its head cut to the shipped draft's vocabulary; 'self:FOLDER' for another "
                        "draft's), 'layers:0,1' (derived from the target), 'ngram', 'none', a trained-draft "
                        "folder, or a model spec; 'ngram+' before a model draft (or 'none') adds prompt lookup; "
                        "default: ngram+self, lookup, else the target's own draft (lookup alone where no "
                        "reduced vocabulary ships for the target)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16, float16")
    p.add_argument("--gamma", default="heuristic", help="an integer >= 0 (fixed), heuristic[:START:MAX] or cost[:C:V] (cost model)")
    p.add_argument("--draft-confidence", type=float, default=0.0,
                   help="stop drafting when the draft's top probability falls below this")
    p.add_argument("--no-pack", action="store_true",
                   help="keep the stock nn.Linear weights on the CPU (no oneDNN packing, decoder/kernels.py)")
    p.add_argument("--steps", default="auto", choices=STEPS,
                   help="how the target runs: eager (input-shaped forwards, a growing cache), fixed (a few padded "
                        "shapes, a fixed-address cache), compiled (fixed, under torch.compile: CUDA graphs on CUDA); "
                        "auto: compiled on CUDA, eager on the CPU (decoder/target_steps.py)")


def _load(args):
    from speccomplete.decoder.loader import load_decoder

    loaded = load_decoder(args.target, args.draft, device=args.device, dtype=args.dtype, gamma=args.gamma,
                          draft_confidence=args.draft_confidence, pack=not args.no_pack, steps=args.steps)
    return loaded.target, loaded.tokenizer, loaded.draft_model, loaded.decoder


def cmd_complete(args) -> int:
    from speccomplete.decoder.engine import DecodeOptions
    from speccomplete.decoder.sampling import SamplingParams
    from speccomplete.server.positions import offset_at

    text = open(args.file, encoding="utf-8").read()
    if args.line is None:
        offset = len(text)
    else:
        offset = offset_at(text, args.line, args.character)
    _, _, _, decoder = _load(args)
    options = DecodeOptions(
        max_new_tokens=args.max_new_tokens,
        sampling=SamplingParams(args.temperature, args.top_k, args.top_p),
        seed=args.seed,
        on_text=(lambda t: print(t, end="", flush=True)) if args.stream else None,
    )
    generation = decoder.generate(text[:offset], options)
    if not args.stream:
        print(generation.text, end="")
    print("\n---")
    print(json.dumps(generation.stats.to_dict()))
    return 0


def cmd_cases(args) -> int:
    from .harness.cases import sample_cases, write_cases

    nl_roots = None
    if args.nl_roots:
        from speccomplete.decoder.corpus import package_roots

        nl_roots = package_roots(args.nl_roots)
    cases = sample_cases(args.splits, args.per_language, seed=args.seed, split=args.split, nl_roots=nl_roots)
    write_cases(cases, args.out)
    print(f"wrote {len(cases)} cases to {args.out}")
    return 0


def cmd_bench(args) -> int:
    from tqdm import tqdm

    from speccomplete.decoder.drafts import build_drafter, draft_label
    from speccomplete.decoder.loader import load_decoder, use_cpu_kernels
    from speccomplete.decoder.models import load_model
    from speccomplete.decoder.trained_draft import with_full_vocab_head

    from .harness.bench import format_table, memory_bandwidth_gbs, report, run_bench, weight_bytes_per_token, write_json
    from .harness.cases import read_cases

    cases = read_cases(args.cases)
    if args.limit:
        cases = cases[: args.limit]
    loaded = load_decoder(args.target, args.draft, device=args.device, dtype=args.dtype, gamma=args.gamma,
                          draft_confidence=args.draft_confidence, pack=False, steps=args.steps)
    target, tokenizer, decoder = loaded.target, loaded.tokenizer, loaded.decoder
    # Drafts are built from the target's plain weights, so the ablations' drafts come before packing.
    compared = args.compare_drafts.split(",") if args.compare_drafts is not None else (
        ABLATION_DRAFTS if args.ablations else ())
    other_drafts = {spec: build_drafter(spec, target, tokenizer, device=args.device, dtype=args.dtype)
                    for spec in compared if spec and spec != args.draft}
    weight_bytes = weight_bytes_per_token(target)  # before packing: a packed linear keeps no .weight
    if not args.no_pack:
        use_cpu_kernels(decoder.steps, target, loaded.draft_model, *(model for _, model in other_drafts.values()))
    # The stock model, as HF users run it (no packed kernels): HF's columns and the unpacked ablations.
    stock = None
    if not args.no_hf or (args.ablations and not args.no_pack):
        stock, _ = load_model(args.target, device=args.device, dtype=args.dtype)
    contenders, doc = _bench_contenders(args, target, tokenizer, decoder, other_drafts, stock)
    if not args.no_hf:
        contenders.hf_target = stock
        # HF assisted gets the shipped model draft, whatever our product drafts with
        _, stock_draft = build_drafter("auto", stock, tokenizer, device=args.device, dtype=args.dtype)
        contenders.hf_draft = with_full_vocab_head(stock_draft) if stock_draft is not None else None
    bar = tqdm(total=len(cases), desc="bench", unit="case")
    results = run_bench(
        cases, contenders, max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
        hf_gammas=[int(g) for g in args.hf_gammas.split(",") if g], prompt_lookup=args.prompt_lookup or None,
        progress=lambda r: bar.update(1),
    )
    bar.close()
    device = _device_name(target)
    if args.events:
        from speccomplete.telemetry.log import EventLog

        from .harness.bench import bench_events

        with EventLog(args.events) as log:
            for event in bench_events(results, target=args.target, draft=draft_label(args.draft, target), device=device,
                                      gamma=args.gamma, max_new_tokens=args.max_new_tokens):
                log.write(event)
    data = report(results, tokenizer, device=device, dtype=str(target.dtype).replace("torch.", ""),
                  target=args.target, draft=args.draft, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                  bandwidth_gbs=memory_bandwidth_gbs(target.device), weight_bytes=weight_bytes, methods_doc=doc)
    table = format_table(data)
    print(table)
    if args.json:
        write_json(data, args.json)
        with open(os.path.splitext(args.json)[0] + ".txt", "w") as f:
            f.write(table + "\n")
    return 0


# The drafters the ablation rows compare with the product's: lookup only, lookup then the target's
# own draft (reduced head), lookup then the trained draft, the trained draft only.
ABLATION_DRAFTS = ("ngram+none", "ngram+self", "ngram+auto", "auto")


def _bench_contenders(args, target, tokenizer, decoder, other_drafts, stock):
    """Our AR and product decoder, and with --ablations one decoder per lever turned off or swapped."""
    import copy

    from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, SelfDrafter, build_drafter
    from speccomplete.decoder.engine import SpeculativeDecoder
    from speccomplete.decoder.gamma import parse_gamma_policy
    from speccomplete.decoder.kernels import pack_linear_weights
    from speccomplete.decoder.lean_forward import keep_hf_forward

    from .harness.bench import Contenders

    packed = "oneDNN-packed" if not args.no_pack else "plain"
    steps = decoder.steps  # every decoder on the target runs on the product's cache (and compiled graphs)
    ours = {"ar": SpeculativeDecoder(target, tokenizer, steps=steps), "spec": decoder}
    doc = {"ar": f"our AR baseline: same engine, {packed} weights, same target steps and cache, γ=0",
           "spec": f"our speculative decoder: draft {args.draft}, γ {args.gamma}, {packed} weights"}
    for spec, (drafter, _) in other_drafts.items():
        ours[f"spec_draft_{spec}"] = SpeculativeDecoder(target, tokenizer, drafter, parse_gamma_policy(args.gamma),
                                                        steps=steps)
        doc[f"spec_draft_{spec}"] = f"draft {spec} instead of {args.draft}"
    if not args.ablations:
        return Contenders(ours), doc

    def same_drafter(drafter):  # a drafter of its own (drafters hold a cache) over the same draft model
        if isinstance(drafter, HybridDrafter):
            return HybridDrafter(drafter.model and same_drafter(drafter.model))
        if isinstance(drafter, SelfDrafter):
            return copy.copy(drafter)  # shares the cut head; its decoder attaches it to the target's steps
        return ModelDrafter(drafter.model) if isinstance(drafter, ModelDrafter) else type(drafter)()

    def lever_off(name: str, model, lever: str):
        """AR, and the product's draft, on `model`: the rows with one lever off. Returns the draft model."""
        drafter, draft_model = build_drafter(args.draft, model, tokenizer, device=args.device, dtype=args.dtype)
        ours[f"ar_{name}"] = SpeculativeDecoder(model, tokenizer)
        doc[f"ar_{name}"] = f"lever off: {lever} (AR)"
        if drafter is not None:
            ours[f"spec_{name}"] = SpeculativeDecoder(model, tokenizer, drafter, parse_gamma_policy(args.gamma))
            doc[f"spec_{name}"] = f"lever off: {lever} (speculative)"
        return draft_model

    # γ only paces a model draft: the rows use the product's, or else the lookup-then-model draft's
    drafter, spec = decoder.drafter, args.draft
    if drafter is None or getattr(drafter, "model", True) is None:
        spec = "ngram+auto"
        drafter = other_drafts[spec][0] if spec in other_drafts else None
    def paced(name: str, gamma: str, what: str, confidence: float = 0.0):
        """A row on that draft with its own pacing: a γ policy, and where drafting stops."""
        ours[name] = SpeculativeDecoder(target, tokenizer, same_drafter(drafter), parse_gamma_policy(gamma),
                                        draft_confidence=confidence, steps=steps)
        doc[name] = f"draft {spec}, {what}"

    if drafter is not None:
        for gamma in [g for g in args.compare_gammas.split(",") if g and g != args.gamma]:
            paced(f"spec_gamma_{gamma}", gamma, f"γ policy {gamma} instead of {args.gamma}")
        for threshold in [float(t) for t in args.compare_confidences.split(",") if t]:
            paced(f"spec_confidence_{threshold:g}", args.gamma, f"γ policy {args.gamma}, and drafting stops where "
                  f"the draft's top probability is under {threshold:g}", confidence=threshold)
    if not args.no_pack:
        # a second packed copy, built from plain weights like the product
        hf_forward = copy.deepcopy(stock)
        draft_model = lever_off("hf_forward", hf_forward, "our forward (decoder/lean_forward.py), HF's instead")
        pack_linear_weights(hf_forward, draft_model)
        keep_hf_forward(hf_forward)
        lever_off("unpacked", stock, "packed weights, on the stock nn.Linear / MKL path")
    return Contenders(ours), doc


def _device_name(model) -> str:
    if model.device.type == "cuda":
        return f"{model.device} ({torch.cuda.get_device_name(model.device)})"
    return str(model.device)


def cmd_sweep(args) -> int:
    from tqdm import tqdm

    from speccomplete.telemetry.log import EventLog

    from speccomplete.decoder.drafts import draft_label
    from .harness.cases import read_cases
    from .harness.sweep import grid_settings, parse_list, run_sweep

    gammas = parse_list(args.gammas, int)
    temperatures = parse_list(args.temperatures, float)
    cases = read_cases(args.cases)
    if args.languages:
        wanted = set(parse_list(args.languages, str))
        cases = [c for c in cases if c.language in wanted]
    if args.limit:
        cases = cases[: args.limit]
    if not cases:
        raise ValueError(f"no cases in {args.cases} for languages {args.languages}")
    target, tokenizer, _, decoder = _load(args)
    runs = len(cases) * len(grid_settings(gammas, temperatures))
    log = EventLog(args.events)
    if not log.enabled:
        raise ValueError("SPECDEC_TELEMETRY turns event writing off; unset it to run a sweep")
    with log, tqdm(total=runs, desc="sweep", unit="run") as bar:
        def progress(case, gamma, temperature):
            bar.set_postfix_str(f"{case.id} γ={gamma} T={temperature:g}")
            bar.update(1)

        run_sweep(cases, target, tokenizer, decoder.drafter, log, gammas=gammas, temperatures=temperatures,
                  max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                  target_name=args.target, draft_name=draft_label(args.draft, target), device=_device_name(target),
                  seed=args.seed, progress=progress)
    print(f"wrote {runs} events to {args.events}")
    return 0


def cmd_report(args) -> int:
    from speccomplete.telemetry.report import build_report, parse_groups

    data = build_report(args.events, args.out, groups=parse_groups(args.groups), base_draft=args.base,
                        reps=args.bootstrap, seed=args.seed, command=" ".join(["specdec", *sys.argv[1:]]))
    print(f"{data['events']} events -> {os.path.join(args.out, 'report.md')} ({len(data['plots'])} plots)")
    return 0


def cmd_nextline(args) -> int:
    from speccomplete.decoder.engine import SpeculativeDecoder
    from speccomplete.decoder.models import load_model

    from .harness.bench import write_json
    from .harness.cases import read_cases
    from .harness.nextline import next_line_quality

    model, tokenizer = load_model(args.target, device=args.device, dtype=args.dtype)
    rows = next_line_quality(SpeculativeDecoder(model, tokenizer), read_cases(args.cases), args.max_new_tokens)
    print(f"target={args.target} device={model.device} dtype={model.dtype} (greedy next line, prompt cut at line start)")
    print("language".rjust(11) + "n".rjust(4) + "exact".rjust(8) + "similar".rjust(9) + "tok/s".rjust(8))
    for name, r in rows.items():
        print(f"{name:>11}{r['cases']:4d}{r['exact_match']:8.2f}{r['similarity']:9.2f}{r['tokens_per_s']:8.1f}")
    if args.json:
        write_json({"target": args.target, "device": str(model.device), "languages": rows}, args.json)
    return 0


def cmd_stepcost(args) -> int:
    from speccomplete.decoder.models import load_model

    from .harness.bench import write_json
    from .harness.stepcost import step_costs

    from transformers import DynamicCache

    from speccomplete.decoder.kernels import pack_linear_weights

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
    print(f"target={args.target} device={args.device} prompt_tokens={args.prompt_tokens} {threads} "
          "(median ms; ratios to 1 token)")
    print("weights".ljust(22) + "".join(k.rjust(15) for k in keys))
    for name, row in rows.items():
        print(name.ljust(22) + "".join(f"{row[k]:15.2f}" for k in keys))
    if args.json:
        write_json({"target": args.target, "device": args.device, "prompt_tokens": args.prompt_tokens,
                    "threads": threads, "weights": rows}, args.json)
    return 0


def cmd_serve(args) -> int:
    from speccomplete.server.lsp import serve

    serve(tcp=args.tcp, port=args.port)
    return 0


def cmd_eval(args) -> int:
    from tqdm import tqdm

    from .harness.cases import read_cases
    from .harness.eval import evaluate, format_failures, format_summary, summarize

    cases = read_cases(args.cases)
    bar = tqdm(total=len(cases), desc="eval", unit="case")
    try:
        results, events = evaluate(cases, args, progress=lambda r: bar.update(1))
    except (RuntimeError, TimeoutError) as e:  # the server could not start or load its models
        print(f"specdec eval: {e}", file=sys.stderr)
        return 2
    finally:
        bar.close()
    print(f"target={args.target} draft={args.draft} gamma={args.gamma} cases={args.cases} "
          f"(latency: server-side, from request to trimmed completion)")
    print(format_summary(summarize(results, events)))
    if failures := format_failures(results):
        print(failures)
    print(f"events: {args.telemetry}" + (f", results: {args.results}" if args.results else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specdec", description="code completion with speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("complete", help="complete a file at a position and print the completion with its stats")
    p.add_argument("file")
    p.add_argument("--line", type=int, help="0-based LSP line (default: end of file)")
    p.add_argument("--character", type=int, default=0, help="UTF-16 column on that line")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int)
    p.add_argument("--stream", action="store_true", help="print text as it is decoded")
    _model_args(p)
    p.set_defaults(func=cmd_complete)

    p = sub.add_parser("cases", help="sample completion cases from corpus split lists")
    p.add_argument("--splits", default="/opt/corpus/splits")
    p.add_argument("--split", default="dev")
    p.add_argument("--per-language", type=int, default=2)
    p.add_argument("--nl-roots", help="ROOTS.txt of the corpus: also sample natural-language (README/docs) cases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_cases)

    p = sub.add_parser("bench", help="AR vs speculative vs HF assisted on the same cases")
    p.add_argument("--cases", required=True)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--json")
    p.add_argument("--limit", type=int, help="use only the first N cases")
    p.add_argument("--hf-gammas", default="1", help="constant γ values to try for HF assisted (besides its default)")
    p.add_argument("--no-hf", action="store_true", help="time only our decoders")
    p.add_argument("--ablations", action="store_true", help="also time our decoder with each lever turned off")
    p.add_argument("--compare-drafts", default=None,
                   help="drafts timed beside the product's, comma-separated (spec_draft_* rows); "
                        "default: none, or " + ",".join(ABLATION_DRAFTS) + " with --ablations")
    p.add_argument("--compare-gammas", default="heuristic,cost", help="γ policies for the ablation rows")
    p.add_argument("--compare-confidences", default="0.4",
                   help="draft confidence thresholds for the ablation rows (HF's default is 0.4)")
    p.add_argument("--prompt-lookup", type=int, default=10,
                   help="HF assisted with prompt lookup, this many tokens per round (0: skip)")
    p.add_argument("--events", help="also append one completion event per case for AR and spec (JSONL)")
    _model_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("sweep", help="AR and fixed γ over temperatures on cases, written as events")
    p.add_argument("--cases", required=True)
    p.add_argument("--gammas", default="1,2,4,8,16,32", help="fixed γ values; AR (γ 0) always runs too")
    p.add_argument("--temperatures", default="0,0.5,1.0")
    p.add_argument("--events", required=True, help="append the events here (JSONL)")
    p.add_argument("--languages", help="only cases in these languages, e.g. python,rust,lua")
    p.add_argument("--limit", type=int, help="use only the first N cases (after --languages)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every grid point")
    _model_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="tables and plots from completion events")
    p.add_argument("events", nargs="+", help="event files, globs or directories")
    p.add_argument("--out", required=True, help="directory for report.md, report.json, CSVs and PNGs")
    p.add_argument("--groups", action="append",
                   help="a language group, name=lang1,lang2 (repeat, or join with ';'); replaces the defaults")
    p.add_argument("--base", help="the base draft for base-vs-tuned tables (default: the draft seen first)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("nextline", help="greedy next-line exact match of a target on cases")
    p.add_argument("--cases", required=True)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--json")
    p.set_defaults(func=cmd_nextline)

    p = sub.add_parser("stepcost", help="median cost of target/draft forward passes by dtype and width")
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtypes", default="float32,bfloat16", help="each also packed where decoder/kernels.py can")
    p.add_argument("--prompt-file", default=__file__)
    p.add_argument("--prompt-tokens", type=int, default=300)
    p.add_argument("--json")
    p.set_defaults(func=cmd_stepcost)

    from .harness.drafting import add_corpus_parser, add_finetune_parser, cmd_corpus, cmd_finetune

    add_corpus_parser(sub)
    sub.choices["corpus"].set_defaults(func=cmd_corpus)
    add_finetune_parser(sub, _model_args)
    sub.choices["finetune"].set_defaults(func=cmd_finetune)

    p = sub.add_parser("serve", help="run the language server (stdio unless --tcp)")
    p.add_argument("--tcp", action="store_true", help="listen on 127.0.0.1 instead of stdio")
    p.add_argument("--port", type=int, default=2087)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("eval", help="drive the real language server over stdio on completion cases")
    p.add_argument("cases", help="CASES.jsonl in the `specdec cases` format")
    p.add_argument("--telemetry", required=True, help="write the completion events here (JSONL)")
    p.add_argument("--results", help="also write each case's completion text here (opt-in: it is source code)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one completion")
    p.add_argument("--max-tokens-single-line", type=int, default=32)
    p.add_argument("--max-tokens-multi-line", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    _model_args(p)
    p.set_defaults(func=cmd_eval)

    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in manifests and model cards
    if not os.environ.get("OMP_NUM_THREADS"):  # one thread per core unless told otherwise
        torch.set_num_threads(os.cpu_count() or 1)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ModelError, ValueError, OSError) as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
