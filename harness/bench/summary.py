"""What the runs come to: the bench JSON (tokens/s per language and per method, α̂, τ, whether each row
equals its AR, the bandwidth bound, steady state, every case's times) and one completion event per case
for the telemetry report."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import uuid
from collections import Counter, defaultdict

import torch

from speccomplete.metrics import acceptance_rate, mean_accepted_length
from speccomplete.telemetry.events import CompletionEvent

from ..lib.output import rounded
from .contenders import LLAMACPP_AR, QUANTIZED_ROWS
from .records import CaseRuns, Run


def model_alpha(runs: list[Run]) -> float | None:
    """α̂ pooled over runs at the positions a model drafted, lookup copies left out (GenerationStats.model_alpha)."""
    stats = [run.stats for run in runs if run.stats is not None]
    return acceptance_rate(
        sum(s.accepted - s.lookup_accepted for s in stats),
        sum(s.rejected_rounds - s.lookup_rejected_rounds for s in stats),
    )


def round_facts(runs: list[Run]) -> dict:
    """Per round that drafted, pooled over runs: drafts accepted (τ) and drafts verified; per round, the ms
    drafting and verifying took (a tree verifies more drafts a round for more accepted: these weigh it)."""
    stats = [run.stats for run in runs if run.stats is not None]
    drafting = sum(sum(s.accepted_histogram) for s in stats)
    rounds = sum(s.rounds for s in stats)
    return {
        "mean_accepted": mean_accepted_length(sum(s.accepted for s in stats), drafting),
        "drafted_per_round": sum(s.drafted for s in stats) / drafting if drafting else None,
        "draft_ms_per_round": sum(s.draft_ms for s in stats) / rounds if rounds else None,
        "verify_ms_per_round": sum(s.verify_ms for s in stats) / rounds if rounds else None,
    }


def summarize_runs(results: list[CaseRuns], tokenizer=None) -> dict:
    """The bench JSON's `overall`, `languages` and `methods` rows, from per-case runs."""
    names = list(results[0].runs)
    assisted_names = [n for n in names if n.startswith("hf_assisted")]
    groups: dict[str, list[CaseRuns]] = defaultdict(list)
    for r in results:
        groups[r.case.language].append(r)

    def tps(rows, name, decode_only=False):
        tokens = sum(r.runs[name].token_count for r in rows)
        seconds = sum(r.runs[name].seconds for r in rows)
        if decode_only:
            seconds -= sum(r.runs[name].prefill_s or 0.0 for r in rows)
        return tokens / seconds if seconds > 0 else 0.0

    best_assisted = max(assisted_names, key=lambda n: tps(results, n)) if assisted_names else None

    def row(rows):
        stats = [r.runs["spec"].stats for r in rows]
        accepted = sum(s.accepted for s in stats)
        rejected = sum(s.rejected_rounds for s in stats)
        drafting_rounds = sum(sum(s.accepted_histogram) for s in stats)
        ar, spec = tps(rows, "ar"), tps(rows, "spec")
        assisted = tps(rows, best_assisted) if best_assisted else None
        return {
            "ar_tokens_per_s": ar,
            "spec_tokens_per_s": spec,
            "assisted_tokens_per_s": assisted,
            "hf_greedy_tokens_per_s": tps(rows, "hf_greedy") if "hf_greedy" in names else None,
            "speedup_vs_ar": spec / ar if ar else None,
            "decode_speedup_vs_ar": tps(rows, "spec", True) / tps(rows, "ar", True),
            "speedup_vs_assisted": spec / assisted if assisted else None,
            "alpha": acceptance_rate(accepted, rejected),
            "model_alpha": model_alpha([r.runs["spec"] for r in rows]),
            "mean_accepted": mean_accepted_length(accepted, drafting_rounds),
            "lookup_share": sum(s.lookup_accepted for s in stats) / accepted if accepted else None,
            "identical_to_ar": all(
                r.runs[n].tokens == r.runs["ar"].tokens for r in rows for n in names if n.startswith(("spec", "ar_"))
            ),
            "drafted_per_token": sum(s.drafted for s in stats) / max(1, sum(s.new_tokens for s in stats)),
            "next_line_exact": sum(_next_line_exact(r, tokenizer) for r in rows) / len(rows) if tokenizer else None,
            "cases": len(rows),
        }

    languages = {lang: row(rows) for lang, rows in sorted(groups.items())}
    code = [v for lang, v in languages.items() if lang != "nl"] or list(languages.values())
    methods = {}
    for name in names:
        ours = results[0].runs[name].stats is not None
        per_round = ours and results[0].runs[name].our_stats.draft_counts == "rounds"
        timed_prefill = all(r.runs[name].prefill_s is not None for r in results)
        methods[name] = {
            "tokens_per_s": tps(results, name),
            "decode_tokens_per_s": tps(results, name, True) if timed_prefill else None,
            "vs_ar": tps(results, name) / tps(results, "ar"),
            "model_alpha": model_alpha([r.runs[name] for r in results]) if per_round else None,
            "identical_to_ar": all(_same_as_its_ar(r, name) for r in results),
            **(round_facts([r.runs[name] for r in results]) if per_round else {}),
        }
    followups = [r.followup for r in results if r.followup]
    # IdleCores gives up a core another process keeps busy, and fewer threads decode slower: say where it happened.
    our_names = [name for name in names if results[0].runs[name].stats is not None]
    threads = {
        name: dict(sorted(Counter(r.runs[name].our_stats.threads for r in results).items(), reverse=True))
        for name in our_names
        if results[0].runs[name].our_stats.threads
    }
    return {
        "assisted_method": best_assisted,
        "overall": row(results),
        "median_over_languages": {
            key: statistics.median(v[key] for v in code)
            for key in ("speedup_vs_ar", "decode_speedup_vs_ar", "speedup_vs_assisted")
            if code[0][key] is not None
        },
        "min_over_languages": {
            "speedup_vs_ar": min(v["speedup_vs_ar"] for v in code),
            "decode_speedup_vs_ar": min(v["decode_speedup_vs_ar"] for v in code),
        },
        "languages": languages,
        "methods": methods,
        "threads": threads,
        "followup": {
            key: statistics.median(f[key] for f in followups)
            for key in ("warm", "cold", "warm_prefilled_tokens", "cold_prefilled_tokens")
        }
        if followups
        else None,
    }


def _same_as_its_ar(result: CaseRuns, name: str) -> bool:
    """A run's output equals its own engine's AR: ours token for token, llama.cpp's text for text."""
    run = result.runs[name]
    if run.text is not None:
        return run.text == result.runs[LLAMACPP_AR].text if LLAMACPP_AR in result.runs else False
    engine = name.split("_")[0]  # fp32_spec and int8_spec are checked against their own AR
    return run.tokens == result.runs[f"{engine}_ar" if engine in QUANTIZED_ROWS.values() else "ar"].tokens


def _next_line_exact(result: CaseRuns, tokenizer) -> bool:
    """Did the target's greedy completion reproduce the rest of the cursor's line exactly?"""
    text = tokenizer.decode(result.runs["ar"].tokens, skip_special_tokens=True)
    expected = result.case.expected_line.strip()
    return bool(expected) and text.split("\n", 1)[0].strip() == expected


def report(
    results,
    tokenizer,
    *,
    device,
    dtype,
    target,
    draft,
    gamma,
    max_new_tokens,
    bandwidth_gbs: float | None = None,
    weight_bytes: int | None = None,
    methods_doc=None,
    steps: str = "eager",
) -> dict:
    """steps: how our target ran (step_kind)."""
    summary = summarize_runs(results, tokenizer)
    bound = None
    if bandwidth_gbs and weight_bytes:
        ar_decode = summary["methods"]["ar"]["decode_tokens_per_s"]
        bound = {
            "bandwidth_gb_per_s": bandwidth_gbs,
            "weight_bytes_per_token": weight_bytes,
            "bound_tokens_per_s": bandwidth_gbs * 1e9 / weight_bytes,
            "ar_decode_tokens_per_s": ar_decode,
            "ar_fraction_of_bound": ar_decode * weight_bytes / (bandwidth_gbs * 1e9),
        }
    return {
        "device": device,
        "dtype": dtype,
        "host": f"{platform.processor() or platform.machine()} {torch.get_num_threads()} threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}, torch {torch.__version__}",
        "date": datetime.date.today().isoformat(),
        "target": target,
        "draft": draft,
        "gamma": gamma,
        "steps": steps,
        "max_new_tokens": max_new_tokens,
        "cases": len(results),
        "methods_doc": methods_doc or {},
        "bandwidth_bound": bound,
        **summary,
        **steady_state(results),
        "per_case": [
            {
                "id": r.case.id,
                "language": r.case.language,
                "next_line_exact": _next_line_exact(r, tokenizer),
                **{f"{name}_tokens": run.token_count for name, run in r.runs.items()},
                **{f"{name}_s": round(run.seconds, 4) for name, run in r.runs.items()},
                **{f"{name}_prefill_ms": _ms(run.prefill_s) for name, run in r.runs.items()},
                **{f"{name}_decode_ms": _ms(run.decode_s) for name, run in r.runs.items()},
                **{f"{name}_first_token_ms": rounded(run.first_token_ms, 2) for name, run in r.runs.items()},
                "followup": r.followup,
                "recorded": r.recorded,
                "spec_stats": r.runs["spec"].stats.to_dict(),
            }
            for r in results
        ],
    }


def _ms(seconds: float | None) -> float | None:
    return rounded(None if seconds is None else seconds * 1000, 2)


def steady_state(results: list[CaseRuns]) -> dict:
    """`steady_state`: no graph was recorded or compiled inside a timed run, by the counts around the
    cases (`Recordings`); `recordings`: the counts at the end, what the timed runs recorded, and where."""
    recorded: Counter[str] = Counter()
    for r in results:
        recorded.update(r.recorded)
    return {
        "steady_state": not any(recorded.values()),
        "recordings": {
            "after_timed_runs": results[-1].recordings_after if results else {},
            "in_timed_runs": dict(recorded),
            "cases_recording": [r.case.id for r in results if any(r.recorded.values())],
        },
    }


def bench_events(
    results: list[CaseRuns], *, target: str, draft: str, device: str, gamma: str, max_new_tokens: int
) -> list[CompletionEvent]:
    """One event per case for our AR and speculative runs and llama.cpp's (HF methods keep no decoder stats).

    Their settings share one run id, so the report pairs the speculative runs with this run's AR.
    """
    run_id = uuid.uuid4().hex[:12]
    events = []
    for r in results:
        rows = [("ar", "none", "0", "local"), ("spec", draft, gamma, "local")]
        rows += [
            (name, "none" if name == LLAMACPP_AR else f"llama.cpp {name.removeprefix('llamacpp_')}", "", "llamacpp")
            for name in r.runs
            if name.startswith("llamacpp_")
        ]
        for name, run_draft, run_gamma, backend in rows:
            run = r.runs[name]
            events.append(
                CompletionEvent.from_stats(
                    run.our_stats.to_dict(),
                    language=r.case.language,
                    trigger="invoked",
                    multiline=True,
                    latency_ms=1000 * run.seconds,
                    target=target,
                    draft=run_draft,
                    device=device,
                    backend=backend,
                    settings={"gamma": run_gamma, "temperature": 0.0, "max_new_tokens": max_new_tokens, "run": run_id},
                    case_id=r.case.id,
                    source="bench",
                )
            )
    return events
