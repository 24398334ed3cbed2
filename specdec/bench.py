"""`specdec bench`: our AR, our speculative decoder and HF assisted generation on the same cases, in one run.

Every method sees the same prompt ids and the same max_new_tokens, greedy. The methods run in a
rotated order case by case, after a warm-up, so drift in machine speed hits them alike. Tokens/s
is total tokens over total wall time per method, prefill included (what an editor waits for).
"""

from __future__ import annotations

import datetime
import json
import platform
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from decoder.engine import DecodeOptions, SpeculativeDecoder
from decoder.stats import GenerationStats
from telemetry.events import CompletionEvent

from .cases import Case


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    stats: GenerationStats | None = None


@dataclass
class CaseResult:
    case: Case
    runs: dict[str, Run] = field(default_factory=dict)


def hf_generate(model, ids: list[int], max_new_tokens: int, **kwargs) -> list[int]:
    input_ids = torch.tensor([ids], device=model.device)
    out = model.generate(
        input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False, max_new_tokens=max_new_tokens,
        pad_token_id=model.generation_config.eos_token_id, **kwargs,
    )
    tokens = out[0, len(ids):].tolist()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    return [t for t in tokens if t not in eos]  # ours never returns the EOS token either


def assisted(target, draft, ids, max_new_tokens, gamma: int | None) -> list[int]:
    """HF assisted generation; gamma None is HF's default schedule (20 tokens, confidence threshold 0.4)."""
    config = draft.generation_config
    config.num_assistant_tokens = gamma
    config.num_assistant_tokens_schedule = None if gamma is None else "constant"
    config.assistant_confidence_threshold = None if gamma is None else 0.0
    return hf_generate(target, ids, max_new_tokens, assistant_model=draft)


def build_methods(target, tokenizer, spec: SpeculativeDecoder, draft_model, max_new_tokens: int,
                  hf_gammas: list[int], prompt_lookup: int | None, hf: bool):
    ar = SpeculativeDecoder(target, tokenizer)  # same engine, γ = 0
    options = DecodeOptions(max_new_tokens=max_new_tokens)
    methods = {
        "ar": lambda ids: _ours(ar, ids, options),
        "spec": lambda ids: _ours(spec, ids, options),
    }
    # HF assisted reads draft logits as target ids, so it cannot run a sub-vocabulary draft head.
    if hf and draft_model is not None and getattr(draft_model, "vocab_ids", None) is None:
        methods["hf_assisted_default"] = lambda ids: _timed(assisted, target, draft_model, ids, max_new_tokens, None)
        for g in hf_gammas:
            methods[f"hf_assisted_const{g}"] = (
                lambda ids, g=g: _timed(assisted, target, draft_model, ids, max_new_tokens, g))
    if hf:
        methods["hf_greedy"] = lambda ids: _timed(hf_generate, target, ids, max_new_tokens)
    if hf and prompt_lookup:
        methods["hf_prompt_lookup"] = lambda ids: _timed(
            hf_generate, target, ids, max_new_tokens, prompt_lookup_num_tokens=prompt_lookup)
    return ar, methods


def _ours(decoder: SpeculativeDecoder, ids, options) -> Run:
    start = time.perf_counter()
    generation = decoder.generate(ids, options)
    return Run(generation.token_ids, time.perf_counter() - start, generation.stats)


def _timed(fn, *args, **kwargs) -> Run:
    start = time.perf_counter()
    tokens = fn(*args, **kwargs)
    return Run(tokens, time.perf_counter() - start)


def run_bench(cases: list[Case], target, tokenizer, spec: SpeculativeDecoder, draft_model, *,
              max_new_tokens: int, max_prompt_tokens: int, hf_gammas: list[int], prompt_lookup: int | None,
              hf: bool = True, progress=None) -> list[CaseResult]:
    ar, methods = build_methods(target, tokenizer, spec, draft_model, max_new_tokens, hf_gammas, prompt_lookup, hf)
    names = list(methods)
    prompts = [ar.fit_prompt(ar.encode(c.prefix), max_new_tokens, max_prompt_tokens)[0] for c in cases]
    for name in names:  # warm-up: allocator, kernels, thread pools
        methods[name](prompts[0][-64:])
    results = []
    for i, (case, ids) in enumerate(zip(cases, prompts)):
        result = CaseResult(case)
        for name in names[i % len(names):] + names[: i % len(names)]:
            result.runs[name] = methods[name](ids)
        results.append(result)
        if progress:
            progress(result)
    return results


def summarize(results: list[CaseResult], tokenizer=None) -> dict:
    """The bench JSON's `overall` and `languages` rows, from per-case runs."""
    assisted_names = [n for n in results[0].runs if n.startswith("hf_assisted")]
    groups: dict[str, list[CaseResult]] = defaultdict(list)
    for r in results:
        groups[r.case.language].append(r)

    def tps(rows, name):
        tokens = sum(len(r.runs[name].tokens) for r in rows)
        seconds = sum(r.runs[name].seconds for r in rows)
        return tokens / seconds if seconds else 0.0

    best_assisted = max(assisted_names, key=lambda n: tps(results, n)) if assisted_names else None

    def row(rows):
        stats = [r.runs["spec"].stats for r in rows]
        accepted = sum(s.accepted for s in stats)
        rejected = sum(s.rejected_rounds for s in stats)
        drafting_rounds = sum(sum(s.accepted_histogram) for s in stats)
        ar, spec = tps(rows, "ar"), tps(rows, "spec")
        out = {
            "ar_tokens_per_s": ar,
            "spec_tokens_per_s": spec,
            "assisted_tokens_per_s": tps(rows, best_assisted) if best_assisted else None,
            "speedup_vs_ar": spec / ar if ar else None,
            "speedup_vs_assisted": spec / tps(rows, best_assisted) if best_assisted else None,
            "alpha": accepted / (accepted + rejected) if accepted + rejected else None,
            "mean_accepted": accepted / drafting_rounds if drafting_rounds else None,
            "identical_to_ar": all(r.runs["spec"].tokens == r.runs["ar"].tokens for r in rows),
            "drafted_per_token": sum(s.drafted for s in stats) / max(1, sum(s.new_tokens for s in stats)),
            "next_line_exact": sum(_next_line_exact(r, tokenizer) for r in rows) / len(rows) if tokenizer else None,
            "cases": len(rows),
        }
        for name in rows[0].runs:
            if name not in ("ar", "spec"):
                out[f"{name}_tokens_per_s"] = tps(rows, name)
        return out

    return {
        "assisted_method": best_assisted,
        "overall": row(results),
        "languages": {lang: row(rows) for lang, rows in sorted(groups.items())},
    }


def _next_line_exact(result: CaseResult, tokenizer) -> bool:
    """Did the target's greedy completion reproduce the rest of the cursor's line exactly?"""
    text = tokenizer.decode(result.runs["ar"].tokens, skip_special_tokens=True)
    expected = result.case.expected_line.strip()
    return bool(expected) and text.split("\n", 1)[0].strip() == expected


def report(results, tokenizer, *, device, dtype, target, draft, gamma, max_new_tokens) -> dict:
    summary = summarize(results, tokenizer)
    return {
        "device": device,
        "dtype": dtype,
        "host": f"{platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}",
        "date": datetime.date.today().isoformat(),
        "target": target,
        "draft": draft,
        "gamma": gamma,
        "max_new_tokens": max_new_tokens,
        "cases": len(results),
        **summary,
        "per_case": [
            {"id": r.case.id, "language": r.case.language, "next_line_exact": _next_line_exact(r, tokenizer),
             **{f"{name}_tokens": len(run.tokens) for name, run in r.runs.items()},
             **{f"{name}_s": round(run.seconds, 4) for name, run in r.runs.items()},
             "spec_stats": r.runs["spec"].stats.to_dict()}
            for r in results
        ],
    }


def format_table(data: dict) -> str:
    cols = [("lang", 11), ("n", 3), ("AR t/s", 8), ("spec t/s", 9), ("HF asst", 8), ("xAR", 6), ("xHF", 6),
            ("alpha", 6), ("acc/rd", 6), ("same", 5), ("nl-em", 6)]
    lines = [f"device={data['device']} dtype={data['dtype']} target={data['target']} draft={data['draft']} "
             f"gamma={data['gamma']} max_new_tokens={data['max_new_tokens']} cases={data['cases']} "
             f"assisted={data['assisted_method']}",
             " ".join(name.rjust(w) for name, w in cols)]

    def fmt(value, width, digits=2):
        if value is None:
            return "-".rjust(width)
        if isinstance(value, bool):
            return ("yes" if value else "NO").rjust(width)
        return f"{value:.{digits}f}".rjust(width)

    rows = list(data["languages"].items()) + [("OVERALL", data["overall"])]
    for name, r in rows:
        lines.append(" ".join([
            name.rjust(11), str(r["cases"]).rjust(3), fmt(r["ar_tokens_per_s"], 8, 1), fmt(r["spec_tokens_per_s"], 9, 1),
            fmt(r["assisted_tokens_per_s"], 8, 1), fmt(r["speedup_vs_ar"], 6), fmt(r["speedup_vs_assisted"], 6),
            fmt(r["alpha"], 6), fmt(r["mean_accepted"], 6), fmt(r["identical_to_ar"], 5), fmt(r["next_line_exact"], 6),
        ]))
    extra = {k: v for k, v in data["overall"].items() if k.endswith("_tokens_per_s") and k.startswith("hf_")}
    lines.append("other methods, overall tokens/s: " + ", ".join(f"{k.removesuffix('_tokens_per_s')}={v:.1f}" for k, v in extra.items()))
    return "\n".join(lines)


def bench_events(results: list[CaseResult], *, target: str, draft: str, device: str, gamma: str,
                 max_new_tokens: int) -> list[CompletionEvent]:
    """One event per case for our AR and our speculative runs (HF methods keep no decoder stats).

    Their settings share one run id, so the report pairs the speculative runs with this run's AR.
    """
    run_id = uuid.uuid4().hex[:12]
    events = []
    for r in results:
        for name, run_draft, run_gamma in (("ar", "none", "0"), ("spec", draft, gamma)):
            run = r.runs[name]
            events.append(CompletionEvent.from_stats(
                run.stats.to_dict(), language=r.case.language, trigger="invoked", multiline=True,
                latency_ms=1000 * run.seconds, target=target, draft=run_draft, device=device,
                settings={"gamma": run_gamma, "temperature": 0.0, "max_new_tokens": max_new_tokens, "run": run_id},
                case_id=r.case.id, source="bench",
            ))
    return events


def write_json(data: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=1)
