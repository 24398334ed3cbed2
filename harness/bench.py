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
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from speccomplete.decoder import cuda_graphs
from speccomplete.decoder.drafts.references import References
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.stats import GenerationStats
from speccomplete.metrics import acceptance_rate, mean_accepted_length
from speccomplete.telemetry.events import CompletionEvent

from .bench_contenders import (
    ABLATION_DRAFTS,
    LLAMACPP_AR,
    QUANTIZED_ROWS,
    Contenders,
    build_contenders,
    llamacpp_contenders,
    quantization_contenders,
)
from .lib.cases import Case, read_cases
from .lib.model_args import add_model_args, device_name, load
from .lib.output import rounded, write_json, write_whole
from .lib.roofline import memory_bandwidth_gbs, weight_bytes_per_token
from .returns import device_facts
from .workspace import nearest_files, read_texts, workspace_references


@dataclass
class Run:
    tokens: list[int]
    seconds: float
    stats: GenerationStats | None = None  # our decoders' and llama.cpp's runs (HF's keep none)
    text: str | None = None  # llama.cpp's runs: it streams text, not our token ids
    first_token_s: float | None = None  # HF's runs: the time to the first token it streamed

    @property
    def prefill_s(self) -> float | None:
        """The prompt's share of `seconds`: the decoder's own prefill time, or HF's time to its first token."""
        return self.stats.prefill_ms / 1000 if self.stats is not None else self.first_token_s

    @property
    def decode_s(self) -> float | None:
        prefill = self.prefill_s
        return None if prefill is None else self.seconds - prefill

    @property
    def first_token_ms(self) -> float | None:
        """Time to the first token: read back from the device, so on CUDA it bounds a prefill whose
        stamp (our stats' prefill_ms) may come before the device has finished it."""
        if self.stats is not None:
            return self.stats.ttft_ms or None
        return None if self.first_token_s is None else self.first_token_s * 1000

    @property
    def token_count(self) -> int:
        return self.stats.new_tokens if self.text is not None and self.stats else len(self.tokens)

    @property
    def our_stats(self) -> GenerationStats:
        """The stats of a run of one of our decoders or llama.cpp (HF's methods keep none)."""
        assert self.stats is not None, "an HF method's run has no decoder stats"
        return self.stats


@dataclass
class CaseRuns:
    """Every method's run on one case, and the product's follow-up request after it."""

    case: Case
    runs: dict[str, Run] = field(default_factory=dict)
    followup: dict[str, float] = field(default_factory=dict)  # warm / cold: ms to the first token, tokens prefilled
    recorded: dict[str, int] = field(default_factory=dict)  # graphs recorded or compiled during the case's runs
    recordings_after: dict[str, int | None] = field(default_factory=dict)  # Recordings.counts() after them


class Recordings:
    """How many graphs this process has recorded or compiled, by kind: our CUDA graphs
    (decoder/cuda_graphs.py), torch.compile's cudagraph-tree recordings and dynamo's compiled graphs.

    The cudagraph trees keep no counter of their own; each recording runs dynamo's start callbacks with
    the trigger CUDAGRAPH_RECORDING, so a callback counts them. On a torch without that trigger the
    count is None, and dynamo's compiles (`counters["stats"]["unique_graphs"]`) still catch a graph
    compiled inside a timed run, though not a recording of one compiled before.
    """

    def __init__(self):
        self._trigger: Any = None
        self._handler: Any = None
        self.tree_recordings = 0
        try:
            from torch._dynamo.callback import CallbackTrigger, callback_handler
        except ImportError:  # a torch before dynamo's callbacks: the compiles are still counted
            return
        self._trigger = getattr(CallbackTrigger, "CUDAGRAPH_RECORDING", None)
        self._handler = callback_handler
        if self._trigger is not None:
            callback_handler.register_start_callback(self._on_start)

    def _on_start(self, args) -> None:
        if args.callback_trigger is self._trigger:
            self.tree_recordings += 1

    def counts(self) -> dict[str, int | None]:
        from torch._dynamo.utils import counters

        return {
            "cuda_graphs": cuda_graphs.recordings(),
            "cudagraph_trees": self.tree_recordings if self._trigger is not None else None,
            "compiled_graphs": int(counters["stats"]["unique_graphs"]),
        }

    def close(self) -> None:
        if self._trigger is not None and self._handler is not None:
            self._handler.remove_start_callback(self._on_start)


def counts_between(before: dict[str, int | None], after: dict[str, int | None]) -> dict[str, int]:
    """What was recorded or compiled between two `Recordings.counts()`, the kinds counted in both."""
    counted = {kind: (n, after.get(kind)) for kind, n in before.items()}
    return {kind: later - n for kind, (n, later) in counted.items() if n is not None and later is not None}


class FirstToken:
    """An HF streamer that notes when the first generated token reaches the host: the prefill, as HF's
    generate reports no times (for assisted generation, the first round's drafts and verify with it)."""

    def __init__(self):
        self.puts = 0
        self.at: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.at is None:  # the first put is the prompt
            self.at = time.perf_counter()

    def end(self) -> None:
        pass


def hf_generate(model, ids: list[int], max_new_tokens: int, streamer=None, **kwargs) -> list[int]:
    input_ids = torch.tensor([ids], device=model.device)
    out = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=model.generation_config.eos_token_id,
        streamer=streamer,
        **kwargs,
    )
    tokens = out[0, len(ids) :].tolist()
    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos or ())
    return [t for t in tokens if t not in eos]  # ours never returns the EOS token either


def assisted(target, draft, ids, max_new_tokens, gamma: int | None, streamer=None) -> list[int]:
    """HF assisted generation; gamma None is HF's default schedule (20 tokens, confidence threshold 0.4)."""
    config = draft.generation_config
    config.num_assistant_tokens = 20 if gamma is None else gamma
    config.num_assistant_tokens_schedule = "constant" if gamma is not None else "heuristic"
    config.assistant_confidence_threshold = 0.0 if gamma is not None else 0.4
    return hf_generate(target, ids, max_new_tokens, streamer, assistant_model=draft)


# (prompt ids, gamma group, the case's workspace for the rows that copy from it) -> the run
Method = Callable[[list[int], str, References | None], Run]


def build_methods(
    contenders: Contenders, max_new_tokens: int, hf_gammas: list[int], prompt_lookup: int | None
) -> dict[str, Method]:
    target, draft = contenders.hf_target, contenders.hf_draft

    # one closure per decoder and per γ: each binds its own
    def ours(decoder: SpeculativeDecoder, refers: bool) -> Method:
        def run(ids, group, references):
            references = references if refers else None
            options = DecodeOptions(max_new_tokens=max_new_tokens, gamma_group=group, references=references)
            return _ours(decoder, ids, options)

        return run

    def assisted_const(g: int) -> Method:
        return lambda ids, group, _: _timed(assisted, target, draft, ids, max_new_tokens, g)

    def llama(decoder) -> Method:
        return lambda ids, group, _: _llamacpp(decoder, ids, DecodeOptions(max_new_tokens=max_new_tokens))

    methods: dict[str, Method] = {
        name: ours(decoder, name in contenders.referring) for name, decoder in contenders.ours.items()
    }
    methods |= {name: llama(decoder) for name, decoder in contenders.llamacpp.items()}
    if target is not None and draft is not None:
        methods["hf_assisted_default"] = lambda ids, group, _: _timed(
            assisted, target, draft, ids, max_new_tokens, None
        )
        for g in hf_gammas:
            methods[f"hf_assisted_const{g}"] = assisted_const(g)
    if target is not None:
        methods["hf_greedy"] = lambda ids, group, _: _timed(hf_generate, target, ids, max_new_tokens)
        if prompt_lookup:  # HF's assisted generation with its prompt-lookup candidate generator
            methods["hf_assisted_lookup"] = lambda ids, group, _: _timed(
                hf_generate, target, ids, max_new_tokens, prompt_lookup_num_tokens=prompt_lookup
            )
    return methods


def step_kind(steps) -> str:
    """How a target runs, as the bench's header names it: eager, compiled (on the CPU: eager steps with short
    feeds compiled, decoder/compiled_step.py), fixed or graphs (decoder/target_steps.py)."""
    if getattr(steps, "compiled", None) is not None:
        return "compiled"
    if getattr(steps, "records_graphs", False):
        return "graphs" if type(steps).__name__ == "GraphTarget" else "compiled"
    return "eager" if type(steps).__name__ == "EagerTarget" else "fixed"


def _ours(decoder: SpeculativeDecoder, ids, options) -> Run:
    decoder.steps.truncate(0)  # every run starts cold: our decoders on one target share its cache
    if decoder.idle_cores is not None:  # a llama.cpp row's process ran just before: its load is gone
        decoder.idle_cores.assume_idle()
    start = time.perf_counter()
    generation = decoder.generate(ids, options)
    return Run(generation.token_ids, time.perf_counter() - start, generation.stats)


def _llamacpp(decoder, ids, options) -> Run:
    start = time.perf_counter()  # its decoders never reuse a prompt (cache_prompt=False): every run is cold
    generation = decoder.generate(ids, options)
    return Run([], time.perf_counter() - start, generation.stats, text=generation.text)


def _timed(fn, *args, **kwargs) -> Run:
    """An HF method's run, its time to the first token from a streamer."""
    first = FirstToken()
    start = time.perf_counter()
    tokens = fn(*args, streamer=first, **kwargs)
    seconds = time.perf_counter() - start
    return Run(tokens, seconds, first_token_s=None if first.at is None else first.at - start)


def _followup(spec: SpeculativeDecoder, ids: list[int], accepted: list[int]) -> dict[str, float]:
    """Time to the first token when the user took the completion's first tokens and asks again:
    with the cache as this case's runs left it, and then cold."""
    out = {}
    for name in ("warm", "cold"):
        if name == "cold":
            spec.steps.truncate(0)
        generation = spec.generate(ids + accepted, DecodeOptions(max_new_tokens=1))
        out[name] = generation.stats.total_ms
        out[f"{name}_prefilled_tokens"] = generation.stats.prompt_tokens - generation.stats.prompt_reused_tokens
    return out


def run_bench(
    cases: list[Case],
    contenders: Contenders,
    *,
    max_new_tokens: int,
    max_prompt_tokens: int,
    hf_gammas: Sequence[int] = (),
    prompt_lookup: int | None = None,
    progress=None,
    say=None,
) -> list[CaseRuns]:
    methods = build_methods(contenders, max_new_tokens, list(hf_gammas), prompt_lookup)
    names = list(methods)
    ar, spec = contenders.ours["ar"], contenders.ours["spec"]
    prompts = [ar.fit_prompt(ar.encode(c.prefix), max_new_tokens, max_prompt_tokens)[0] for c in cases]
    workspaces = [case_references(c, ar.tokenizer, contenders.workspace_ngram) for c in cases]
    recordings = Recordings()
    try:
        warm_up(methods, contenders, prompts[0], say, workspaces[0])
        results = []
        for i, (case, ids, references) in enumerate(zip(cases, prompts, workspaces)):
            result = CaseRuns(case)
            before = recordings.counts()
            for name in names[i % len(names) :] + names[: i % len(names)]:
                result.runs[name] = methods[name](ids, case.language, references)
            result.followup = _followup(spec, ids, result.runs["spec"].tokens[:8])
            result.recordings_after = recordings.counts()
            result.recorded = counts_between(before, result.recordings_after)
            results.append(result)
            if progress:
                progress(result)
        return results
    finally:
        recordings.close()


def case_references(case: Case, tokenizer, min_ngram: int) -> References | None:
    """What a lookup may copy from in the case's workspace (harness/workspace.py), matches of `min_ngram` tokens
    or more; None for a case without one, or where `min_ngram` is 0 (no row copies from it)."""
    if not case.workspace or not min_ngram:
        return None
    texts = read_texts(nearest_files(case.workspace, case.path, case.language))
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return workspace_references(texts, encode, min_ngram=min_ngram)


def warm_up(
    methods: dict[str, Method], contenders: Contenders, ids: list[int], say=None, references: References | None = None
) -> None:
    """Every method on the first case's whole prompt (allocator, kernels, thread pools, compiling: after a
    64-token warm-up, an H200's first full-length AR run took 1303 ms, the next case's 162, docs/gpu.md);
    then every graph of steps that run graphs (`compiled`: torch.compile's, or recorded ones,
    graph_target.py) recorded. torch.compile's cudagraph trees record a graph on its second call, so there
    our methods run twice and the steps' `warm_up` (every row count, hidden-state steps too where a
    drafter drafts on the target) runs twice; recorded steps record whatever graph is missing in it."""
    # steps with graphs (FixedShapeTarget compiled, GraphTarget), by identity: decoders share them
    compiled: dict[int, Any] = {id(d.steps): d.steps for d in contenders.ours.values() if d.steps.records_graphs}
    for name, method in methods.items():
        times = 2 if compiled and name in contenders.ours else 1
        for _ in range(times):
            run = method(ids, "warm-up", references)
        if say:
            say(f"warm-up {name}: {run.seconds:.1f} s" + (f" (the second of {times} runs)" if times > 1 else ""))
    for key, steps in compiled.items():
        hidden = any(
            d.drafter is not None and d.drafter.drafts_on_the_target
            for d in contenders.ours.values()
            if id(d.steps) == key
        )
        for _ in range(2):
            steps.warm_up(hidden)


def case_line(result: CaseRuns) -> str:
    """One case's times, for the log as the bench goes: a run cut short by a timeout still says them."""
    runs = " ".join(f"{name} {run.seconds * 1000:.0f}ms/{run.token_count}" for name, run in result.runs.items())
    return f"case {result.case.id}: {runs}"


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


def format_table(data: dict) -> str:
    cols = [
        ("lang", 11),
        ("n", 3),
        ("AR t/s", 8),
        ("spec t/s", 9),
        ("xAR", 6),
        ("xAR dec", 8),
        ("HF asst", 8),
        ("xHF", 6),
        ("HF grdy", 8),
        ("alpha", 6),
        ("mdl α", 6),
        ("acc/rd", 6),
        ("lookup", 6),
        ("same", 5),
    ]
    lines = [
        f"device={data['device']} dtype={data['dtype']} host={data['host']} date={data['date']}",
        f"target={data['target']} draft={data['draft']} gamma={data['gamma']} steps={data.get('steps', 'eager')} "
        f"max_new_tokens={data['max_new_tokens']} cases={data['cases']} assisted={data['assisted_method']}",
        " ".join(name.rjust(w) for name, w in cols),
    ]
    if data.get("steady_state") is False:  # said first as well as last: no one reads these times unwarned
        lines.insert(2, steady_state_line(data))

    def fmt(value, width, digits=2):
        if value is None:
            return "-".rjust(width)
        if isinstance(value, bool):
            return ("yes" if value else "NO").rjust(width)
        return f"{value:.{digits}f}".rjust(width)

    rows = list(data["languages"].items()) + [("OVERALL", data["overall"])]
    for name, r in rows:
        lines.append(
            " ".join(
                [
                    name.rjust(11),
                    str(r["cases"]).rjust(3),
                    fmt(r["ar_tokens_per_s"], 8, 1),
                    fmt(r["spec_tokens_per_s"], 9, 1),
                    fmt(r["speedup_vs_ar"], 6),
                    fmt(r["decode_speedup_vs_ar"], 8),
                    fmt(r["assisted_tokens_per_s"], 8, 1),
                    fmt(r["speedup_vs_assisted"], 6),
                    fmt(r["hf_greedy_tokens_per_s"], 8, 1),
                    fmt(r["alpha"], 6),
                    fmt(r["model_alpha"], 6),
                    fmt(r["mean_accepted"], 6),
                    fmt(r["lookup_share"], 6),
                    fmt(r["identical_to_ar"], 5),
                ]
            )
        )
    med, low = data["median_over_languages"], data["min_over_languages"]
    lines.append(
        "median over code languages: "
        + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
        + f"; slowest language: {low['speedup_vs_ar']:.2f}x end to end, {low['decode_speedup_vs_ar']:.2f}x decode"
    )
    lines.append("")
    lines.append(
        f"{'method':>22} {'t/s':>7} {'dec t/s':>8} {'vs ar':>6} {'model α':>7} {'acc/rd':>6} {'rows/rd':>7} "
        f"{'draft ms':>8} {'verify ms':>9} {'same':>5}  what"
    )
    for name, m in data["methods"].items():
        lines.append(
            f"{name:>22} {m['tokens_per_s']:7.1f} {fmt(m['decode_tokens_per_s'], 8, 1)} "
            f"{m['vs_ar']:6.2f} {fmt(m.get('model_alpha'), 7)} {fmt(m.get('mean_accepted'), 6)} "
            f"{fmt(m.get('drafted_per_round'), 7)} {fmt(m.get('draft_ms_per_round'), 8, 1)} "
            f"{fmt(m.get('verify_ms_per_round'), 9, 1)} {fmt(m['identical_to_ar'], 5)}  "
            f"{data['methods_doc'].get(name, '')}"
        )
    if data.get("bandwidth_bound"):
        b = data["bandwidth_bound"]
        lines.append(
            f"{'bandwidth bound':>22} {b['bound_tokens_per_s']:7.1f} {'':8} {'':6} {'':7} {'':5}  "
            f"{b['weight_bytes_per_token'] / 1e6:.0f} MB of weights per token at {b['bandwidth_gb_per_s']:.1f} GB/s; "
            f"our AR decodes at {b['ar_fraction_of_bound']:.2f} of it"
        )
    if data.get("threads"):
        lines.append(
            "requests by the fewest CPU threads they ran with: "
            + "; ".join(
                f"{name} " + ", ".join(f"{count} on {n}" for n, count in counts.items())
                for name, counts in data["threads"].items()
            )
        )
    if data.get("followup"):
        f = data["followup"]
        lines.append(
            f"follow-up request (first 8 tokens accepted), median time to first token: "
            f"warm {f['warm']:.0f} ms ({f['warm_prefilled_tokens']:.0f} tokens prefilled) vs "
            f"cold {f['cold']:.0f} ms ({f['cold_prefilled_tokens']:.0f})"
        )
    if "steady_state" in data:
        lines.append(steady_state_line(data))
    return "\n".join(lines)


def steady_state_line(data: dict) -> str:
    """The table's last line: quiet when nothing was recorded inside a timed run, loud when something was."""
    counts = data["recordings"]
    inside = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts["in_timed_runs"].items())
    if data["steady_state"]:
        return f"steady state: nothing recorded or compiled inside the timed runs ({inside})"
    cases = ", ".join(counts["cases_recording"])
    return (
        f"!!! NOT STEADY STATE: graphs were recorded or compiled inside the timed runs ({inside}; cases {cases}): "
        "those cases' times include the recording !!!"
    )


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
    from speccomplete.decoder.loader import compile_steps, use_cpu_kernels
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
    if args.steps == "compiled" and isinstance(decoder.steps, EagerTarget):  # on the CPU: after packing
        decoder.steps.use_compiled(compile_steps(decoder, args.quantization)[0])
    # The stock model, as HF users run it (no packed kernels): HF's columns and the unpacked ablations.
    stock = None
    if not args.no_hf or (args.ablations and not args.no_pack):
        stock, _ = load_model(args.target, device=args.device, dtype=args.dtype)
    contenders, doc = build_contenders(args, target, tokenizer, decoder, other_drafts, stock)
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
