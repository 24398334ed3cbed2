"""`specdec study`: the disparity study's three research questions over a case set, in one resumable command.

- RQ1 and RQ2: every case is decoded by AR and by each draft at the product's γ policy, greedy, twice: a
  block (max_new_tokens, no stop string: every decoder writes the same length, so tokens/s compare) and a
  single line (the server's single-line request: stop at the line's end, its token limit). Every run
  starts cold (an empty cache, a fresh γ policy of its own), so no run depends on the ones before it.
- RQ3: `specdec sweep`'s grid (AR and fixed γ × temperature) with the product's draft (`--draft`) on
  the first cases of each language, pooled per resource group.

Every run is one CompletionEvent, appended to DIR/events/<part>.jsonl as soon as it ends; a restart
reads them and decodes only the runs not there yet, and because runs are cold, a resumed study counts
what an uninterrupted one does. study.json, study.md and the plots are made from the events alone, with
speccomplete.metrics's definitions and telemetry.analysis's bootstrap and unfairness U; the events are
also what `specdec report` reads (DIR/report/ is its report on the block runs).

α̂ is the draft's own (GenerationStats.model_alpha): a hybrid draft's (ngram+X) lookup copies are counted
apart, so its α̂ is X's. Events have no field for the rounds a copy lost, so the study keeps that count in the
event's settings (`lookup_rejected_rounds`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import parse_gamma_policy
from speccomplete.metrics import acceptance_rate, mean_accepted_length, percentile
from speccomplete.server.filters.decode_stops import stop_strings
from speccomplete.server.options import ServerOptions
from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import EventLog

from .cases import Case, read_cases
from .model_args import add_model_args, device_name, load
from .sweep import grid_settings, parse_list, run_sweep

if TYPE_CHECKING:
    from speccomplete.decoder.drafts import Drafter

# The drafts studied when --drafts is not given, as far as they exist for the target: the lookup alone, the
# product's default, an untrained draft (the target's first two layers), the shipped CPU-trained draft and
# the shipped EAGLE-3 draft. A draft that resolves to one already listed (auto is layers:0,1 for a target no
# trained draft ships for) runs once.
DEFAULT_DRAFTS = ("ngram", "ngram+self", "layers:0,1", "auto", "eagle3")
PARTS = ("block", "line", "rq3")  # the event files under DIR/events/
AR = "none"  # the draft label of AR runs, as events name it
LOOKUP = "ngram"  # prompt lookup alone: what a trained draft must beat, so every draft is paired against it
EVENT_LOG_BYTES = 1 << 40  # the study's event files never rotate: a restart reads one file per part


@dataclass
class StudyDraft:
    label: str  # as events name it (drafts.draft_label)
    decoder: SpeculativeDecoder  # the draft at the product's γ policy


def event_key(part: str, event: dict) -> tuple:
    """What makes a run one of the study's: a rerun of the same key replaces it."""
    settings = event.get("settings") or {}
    return (part, event.get("case_id"), event.get("draft"), str(settings.get("gamma")), settings.get("temperature"))


def read_part(out: Path, part: str) -> dict[tuple, dict]:
    """The events of one part by key, the last of a key winning; a torn last line (a crash) is skipped."""
    path = out / "events" / f"{part}.jsonl"
    events: dict[tuple, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("record") is None:
                events[event_key(part, event)] = event
    return events


def same_study(out: Path, settings: dict) -> None:
    """Record the settings a study's runs were made with (DIR/settings.json), and refuse to go on with others:
    their runs would be pooled with the earlier ones. More cases or drafts may join, and an RQ3 grid later."""
    path = out / "settings.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    used = {k: v for k, v in settings.items() if v not in (None, [])}  # a run without RQ3 sets no grid
    changed = {k: (recorded[k], v) for k, v in used.items() if recorded.get(k) not in (None, [], v)}
    if not changed:
        path.write_text(json.dumps(recorded | used, indent=1))
    else:
        differences = ", ".join(f"{key}: {then} then, {now} now" for key, (then, now) in changed.items())
        raise ValueError(
            f"{out} holds a study made with other settings ({differences}): use another --out, or the same settings"
        )


def per_language(cases: list[Case], count: int) -> list[Case]:
    """The first `count` cases of each language, in case order."""
    seen: dict[str, int] = {}
    picked = []
    for case in cases:
        if seen.get(case.language, 0) < count:
            seen[case.language] = seen.get(case.language, 0) + 1
            picked.append(case)
    return picked


def run_study(
    cases: list[Case],
    ar: SpeculativeDecoder,
    drafts: list[StudyDraft],
    out: str | Path,
    *,
    gamma: str,
    target_name: str,
    device: str,
    max_new_tokens: int = 32,
    max_line_tokens: int = 32,
    max_prompt_tokens: int = 1024,
    rq3_draft: tuple[str, Drafter | None] | None = None,
    gammas: Iterable[int] = (1, 2, 4, 8),
    temperatures: Iterable[float] = (0.0, 0.5, 1.0),
    rq3_per_language: int = 5,
    seed: int = 0,
    max_runs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Decode the runs DIR/events/ does not hold yet, appending each as an event; returns the runs decoded.

    `ar` is the AR decoder (no draft); `rq3_draft` the (label, drafter) of the RQ3 grid, None to skip it.
    `max_runs` stops after that many runs (an RQ3 case's grid counts whole); rerun to go on.
    """
    out = Path(out)
    (out / "events").mkdir(parents=True, exist_ok=True)
    gammas, temperatures = list(gammas), list(temperatures)
    same_study(
        out,
        {
            "target": target_name,
            "gamma": gamma,
            "max_new_tokens": max_new_tokens,
            "max_line_tokens": max_line_tokens,
            "max_prompt_tokens": max_prompt_tokens,
            "rq3_draft": rq3_draft[0] if rq3_draft is not None else None,
            "gammas": gammas,
            "temperatures": temperatures,
            "seed": seed,
        },
    )
    block_done, line_done = read_part(out, "block"), read_part(out, "line")
    decoders = [(AR, "0", ar)] + [(d.label, gamma, d.decoder) for d in drafts]
    todo = [
        (part, case, label, setting, decoder)
        for case in cases
        for label, setting, decoder in decoders
        for part, done in (("block", block_done), ("line", line_done))
        if (part, case.id, label, setting, 0.0) not in done
    ]
    grid = grid_settings(gammas, temperatures)
    rq3_cases: list[Case] = []
    if rq3_draft is not None and rq3_per_language > 0:
        rq3_done = read_part(out, "rq3")
        rq3_label = rq3_draft[0]
        rq3_cases = [
            case
            for case in per_language(cases, rq3_per_language)
            if any(("rq3", case.id, rq3_label if g else AR, str(g), t) not in rq3_done for g, t in grid)
        ]
    runs = 0
    if not todo and not rq3_cases:
        return runs
    say = progress or (lambda _: None)
    for part in PARTS:
        _end_last_line(out / "events" / f"{part}.jsonl")
    logs = {part: EventLog(out / "events" / f"{part}.jsonl", max_bytes=EVENT_LOG_BYTES) for part in PARTS}
    if not logs["block"].enabled:
        raise ValueError("SPECDEC_TELEMETRY turns event writing off; unset it to run a study")
    try:
        prompts: dict[str, list[int]] = {}
        for _, _, decoder in decoders:  # warm-up: allocator, kernels, thread pools; a γ group of its own
            warm_up = DecodeOptions(max_new_tokens=4, gamma_group="warm-up")  # leaves the runs' policy fresh
            _decode(decoder, ar.encode(cases[0].prefix)[-64:], warm_up)
        for part, case, label, setting, decoder in todo:
            if max_runs is not None and runs >= max_runs:
                return runs
            if case.id not in prompts:
                prompts[case.id] = ar.fit_prompt(ar.encode(case.prefix), max_new_tokens, max_prompt_tokens)[0]
            line = part == "line"
            options = DecodeOptions(
                max_new_tokens=max_line_tokens if line else max_new_tokens,
                stop_strings=stop_strings(case.language, multiline=False) if line else (),
                seed=seed,
                gamma_group=f"{case.id}/{part}",  # a fresh γ policy per run: no run depends on the order
            )
            generation, latency_ms = _decode(decoder, prompts[case.id], options)
            stats = generation.stats
            logs[part].write(
                CompletionEvent.from_stats(
                    stats.to_dict(),
                    language=case.language,
                    trigger="invoked",
                    multiline=not line,
                    latency_ms=latency_ms,
                    target=target_name,
                    draft=label,
                    device=device,
                    settings={
                        "gamma": setting,
                        "temperature": 0.0,
                        "max_new_tokens": options.max_new_tokens,
                        "seed": seed,
                        "study": part,
                        "lookup_rejected_rounds": stats.lookup_rejected_rounds,
                    },
                    case_id=case.id,
                    source="bench",
                )
            )
            runs += 1
            say(f"{part} {case.id} {label}")
        for case in rq3_cases:
            if max_runs is not None and runs >= max_runs:
                return runs
            assert rq3_draft is not None
            runs += run_sweep(
                [case],
                ar.target,
                ar.tokenizer,
                rq3_draft[1],
                logs["rq3"],
                gammas=gammas,
                temperatures=temperatures,
                max_new_tokens=max_new_tokens,
                max_prompt_tokens=max_prompt_tokens,
                target_name=target_name,
                draft_name=rq3_draft[0],
                device=device,
                seed=seed,
                progress=lambda c, g, t: say(f"rq3 {c.id} γ={g} T={t:g}"),
            )
    finally:
        for log in logs.values():
            log.close()
    return runs


def _end_last_line(path: Path) -> None:
    """End a line torn by a crash, so the next event starts a line of its own rather than joining it."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")


def _decode(decoder: SpeculativeDecoder, ids: list[int], options: DecodeOptions):
    decoder.steps.truncate(0)  # cold: decoders on one target may share its cache
    start = time.perf_counter()
    generation = decoder.generate(ids, options)
    return generation, 1000 * (time.perf_counter() - start)


def planned_runs(cases: list[Case], drafts: int, grid: int, rq3_per_language: int) -> int:
    """How many runs a whole study is: AR and each draft, block and line, per case; the grid per RQ3 case."""
    return 2 * (1 + drafts) * len(cases) + grid * len(per_language(cases, rq3_per_language))


# --------------------------------------------------------------------------- study.json


# The sums each (configuration, language, case) carries into the bootstrap; every number is a ratio of them.
SUMS = [
    "runs",
    "acc_model",
    "rej_model",
    "acc",
    "rej",
    "drafting_rounds",
    "sp_tokens",
    "sp_ms",
    "ar_tokens",
    "ar_ms",
    "sp_decode_ms",
    "ar_decode_ms",
    "tokens",
    "ms",
    "line_runs",
    "line_ms",
]


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _speedup(s: dict, decode: bool = False) -> float | None:
    ms = ("sp_decode_ms", "ar_decode_ms") if decode else ("sp_ms", "ar_ms")
    spec, base = _ratio(s["sp_tokens"], s[ms[0]]), _ratio(s["ar_tokens"], s[ms[1]])
    return spec / base if spec is not None and base else None


# name -> (formula over a dict of SUMS, definition); speccomplete.metrics's where it has one
METRICS: dict[str, tuple[Callable[[dict], float | None], str]] = {
    "alpha": (
        lambda s: acceptance_rate(s["acc_model"], s["rej_model"]),
        "the draft's own α̂ = Σ accepted / (Σ accepted + Σ rejected rounds) over the rounds it drafted: for "
        "ngram+X, X's rounds, the lookup's copies and the rounds they lost left out (GenerationStats.model_alpha); "
        "for ngram alone, the lookup is the draft",
    ),
    "alpha_all": (
        lambda s: acceptance_rate(s["acc"], s["rej"]),
        "α̂ over every drafted token, lookup copies included (the telemetry report's α̂)",
    ),
    "mean_accepted": (
        lambda s: mean_accepted_length(s["acc"], s["drafting_rounds"]),
        "τ = Σ accepted / Σ drafting rounds (every round that drafted anything, lookup included)",
    ),
    "speedup": (
        _speedup,
        "block tokens/s ÷ AR's block tokens/s on the same cases (decoder time, prefill included)",
    ),
    "decode_speedup": (
        lambda s: _speedup(s, decode=True),
        "the same with the prefill's time left out of both sides (it is the same work for both)",
    ),
    "tokens_per_s": (lambda s: _ratio(1000 * s["tokens"], s["ms"]), "block tokens/s: 1000 Σ tokens / Σ ms"),
    "line_latency_ms": (
        lambda s: _ratio(s["line_ms"], s["line_runs"]),
        "mean wall time of a single-line request (stop at the line's end), the harness's own clock",
    ),
}


def _case_sums(out: Path):
    """One row per (configuration, language, case) with SUMS: the block and line runs of RQ1/RQ2."""
    import pandas as pd

    rows: dict[tuple, dict] = {}

    def row(event: dict) -> dict:
        key = (event["draft"], event["language"], event["case_id"])
        return rows.setdefault(key, dict(zip(("config", "language", "block"), key)) | dict.fromkeys(SUMS, 0.0))

    block = read_part(out, "block").values()
    ar_block = {e["case_id"]: e for e in block if e["draft"] == AR}
    for event in block:
        r = row(event)
        r["runs"] += 1
        r["tokens"] += event["generated_tokens"]
        r["ms"] += event["total_ms"]
        if event["draft"] != AR:
            _add_counts(r, event)
            base = ar_block.get(event["case_id"])
            if base is not None:  # speedup pairs a case's runs with its own AR run
                r["sp_tokens"] += event["generated_tokens"]
                r["sp_ms"] += event["total_ms"]
                r["sp_decode_ms"] += event["total_ms"] - event["prefill_ms"]
                r["ar_tokens"] += base["generated_tokens"]
                r["ar_ms"] += base["total_ms"]
                r["ar_decode_ms"] += base["total_ms"] - base["prefill_ms"]
    for event in read_part(out, "line").values():
        r = row(event)
        r["line_runs"] += 1
        r["line_ms"] += event["latency_ms"]
    return pd.DataFrame(list(rows.values()), columns=["config", "language", "block", *SUMS])


def _add_counts(r: dict, event: dict) -> None:
    lookup_rejected = (event.get("settings") or {}).get("lookup_rejected_rounds", 0)
    r["acc_model"] += event["accepted"] - event["lookup_accepted"]
    r["rej_model"] += event["rejected_rounds"] - lookup_rejected
    r["acc"] += event["accepted"]
    r["rej"] += event["rejected_rounds"]
    r["drafting_rounds"] += sum(event["accepted_histogram"])


def _rq3_sums(out: Path):
    """One row per (γ|T configuration, language, case) with SUMS, each paired with its case's AR at that T."""
    import pandas as pd

    events = list(read_part(out, "rq3").values())
    ar = {(e["case_id"], e["settings"]["temperature"]): e for e in events if e["draft"] == AR}
    rows = []
    for event in events:
        settings = event["settings"]
        if event["draft"] == AR:
            continue
        r = {"config": f"{settings['gamma']}|{settings['temperature']}", "language": event["language"]}
        r |= {"block": event["case_id"], "draft": event["draft"]} | dict.fromkeys(SUMS, 0.0)
        r["runs"] = 1
        _add_counts(r, event)
        base = ar.get((event["case_id"], settings["temperature"]))
        if base is not None:
            r |= {"sp_tokens": event["generated_tokens"], "sp_ms": event["total_ms"]}
            r |= {"ar_tokens": base["generated_tokens"], "ar_ms": base["total_ms"]}
            r |= {"sp_decode_ms": event["total_ms"] - event["prefill_ms"]}
            r |= {"ar_decode_ms": base["total_ms"] - base["prefill_ms"]}
        rows.append(r)
    return pd.DataFrame(rows, columns=["config", "language", "block", "draft", *SUMS])


def _estimates(point: dict, replicates, names: Iterable[str]) -> dict:
    """Each metric's point value and 95% bootstrap interval (telemetry.analysis.statistics.ci)."""

    from speccomplete.telemetry.analysis.statistics import ci

    out = {}
    for name in names:
        formula = METRICS[name][0]
        value = formula(point)
        lo, hi = ci(_series(formula, _rows(replicates))) if value is not None else (None, None)
        out[name] = {"value": value, "lo": lo, "hi": hi}
    return out


def _pooled(frame, sums: dict, config: str, languages: list[str]):
    """The point sums and replicate sums of `config` over `languages` (strata resampled apart)."""
    import numpy as np

    members = [lang for lang in languages if (config, lang) in sums]
    if not members:
        return None, None
    rows = frame[(frame.config == config) & frame.language.isin(members)]
    point = {name: float(rows[name].sum()) for name in SUMS}
    return point, np.sum([sums[(config, lang)] for lang in members], axis=0)


def _paired(frame, sums: dict, base: str, configs: list[str], domains: dict[str, list[str]]) -> dict:
    """Per draft and group, its speedup over `base`'s on the same cases (the ratio of their tokens/s), prefill
    included and left out, with 95% intervals. Paired: a replicate weighs a case alike for both drafts
    (telemetry.analysis.statistics.resampled_sums), so the interval leaves out the cases' own spread."""
    import numpy as np

    from speccomplete.telemetry.analysis.statistics import ci

    out: dict[str, dict] = {}
    for config in configs:
        for domain, members in domains.items():
            point, replicates = _pooled(frame, sums, config, members)
            base_point, base_replicates = _pooled(frame, sums, base, members)
            if point is None or base_point is None:
                continue
            row = out.setdefault(config, {}).setdefault(domain, {})
            for name in ("speedup", "decode_speedup"):
                formula = METRICS[name][0]
                value, base_value = formula(point), formula(base_point)
                if value is None or not base_value:
                    row[name] = {"value": None, "lo": None, "hi": None}
                    continue
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratios = _series(formula, _rows(replicates)) / _series(formula, _rows(base_replicates))
                lo, hi = ci(ratios)
                row[name] = {"value": value / base_value, "lo": lo, "hi": hi}
    return out


def summarize(
    out: str | Path,
    *,
    groups: dict[str, list[str]] | None = None,
    reps: int = 1000,
    seed: int = 0,
    meta: dict | None = None,
    paired_base: str = LOOKUP,
) -> dict:
    """study.json, study.md and the plots in `out`, from its events; returns study.json's content."""
    import pandas as pd

    from speccomplete.telemetry.analysis.groups import NATURAL_LANGUAGE, default_groups, group_members
    from speccomplete.telemetry.analysis.statistics import (
        U_DEFINITION,
        Replicates,
        disparity,
        resampled_sums,
    )

    out = Path(out)
    groups = groups or default_groups()
    group_of = {lang: g for g, members in groups.items() for lang in members}
    frame = _case_sums(out)
    if frame.empty:
        raise ValueError(f"no study events in {out / 'events'}")
    sums = resampled_sums(frame, SUMS, reps, seed)
    languages = sorted(set(frame.language), key=lambda x: (list(group_of).index(x) if x in group_of else 99, x))
    domains = group_members(groups, languages)
    if NATURAL_LANGUAGE in languages:
        domains[NATURAL_LANGUAGE] = [NATURAL_LANGUAGE]
    drafts: dict[str, dict] = {}
    configs = [AR] + [c for c in dict.fromkeys(frame.config) if c != AR]
    for config in configs:
        names = ["tokens_per_s", "line_latency_ms"] if config == AR else list(METRICS)
        entry: dict = {"languages": {}, "groups": {}}
        for language in languages:
            point, replicates = _pooled(frame, sums, config, [language])
            if point is None:
                continue
            entry["languages"][language] = {
                "group": group_of.get(language),
                "n": int(point["runs"]),
                "line_n": int(point["line_runs"]),
                **_estimates(point, replicates, names),
            }
        for domain, members in domains.items():
            point, replicates = _pooled(frame, sums, config, members)
            if point is not None:
                entry["groups"][domain] = {
                    "languages": [m for m in members if m in entry["languages"]],
                    "n": int(point["runs"]),
                    **_estimates(point, replicates, names),
                }
        drafts[config] = entry
        if config != AR:
            langs = pd.DataFrame(
                [
                    {
                        "config": config,
                        "is_ar": False,
                        "language": lang,
                        "alpha": _value(row["alpha"]),
                        "speedup": _value(row["speedup"]),
                        "target": None,
                        "draft": config,
                        "gamma": None,
                        "temperature": 0.0,
                        "backend": "local",
                    }
                    for lang, row in entry["languages"].items()
                ]
            )
            replicate = Replicates({}, {})
            for lang in entry["languages"]:
                columns = _rows(sums[(config, lang)])
                replicate.alpha[lang] = _series(METRICS["alpha"][0], columns)
                replicate.speedup[lang] = _series(METRICS["speedup"][0], columns)
            disp = disparity(langs, {config: replicate}, groups)
            entry["disparity"] = {
                row["group"]: {
                    key: _plain(row.get(key))
                    for key in ("languages", "U", "U_lo", "U_hi", "U_p", "U_std", "U_std_lo", "U_std_hi")
                    + ("speedup_min", "speedup_max", "speedup_cv", "speedup_cv_lo", "speedup_cv_hi")
                    + ("slowest", "fastest")
                }
                for row in disp.to_dict("records")
            }
    rq3 = _rq3(out, groups, reps, seed)
    data = {
        **(meta or {}),
        "made": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cases": int(frame.block.nunique()),
        "groups": groups,
        "language_groups": {lang: group_of.get(lang) for lang in languages},
        "definitions": {name: definition for name, (_, definition) in METRICS.items()}
        | {
            "U": U_DEFINITION + " Here α̂_T is the draft's own α̂ (alpha).",
            "ci": f"95% percentile intervals over {reps} Poisson-bootstrap resamples of cases within each language "
            "(a group's resamples its languages apart)",
            "line_latency_p50_ms": "the median single-line request's wall time (no interval)",
            "paired": "a draft's speedup over paired.base's (the lookup alone, ngram, unless told otherwise): their "
            "tokens/s on the same cases, with a paired bootstrap interval; where the interval is above 1, the draft "
            "is faster",
        },
        "drafts": {k: v for k, v in drafts.items() if k != AR},
        "ar": drafts.get(AR),
        "paired": {
            "base": paired_base,
            "drafts": _paired(frame, sums, paired_base, [c for c in configs if c not in (AR, paired_base)], domains)
            if paired_base in configs
            else {},
        },
        "rq3": rq3,
    }
    latencies: dict[tuple[str, str], list[float]] = {}
    for event in read_part(out, "line").values():
        latencies.setdefault((event["draft"], event["language"]), []).append(event["latency_ms"])
    for config, entry in drafts.items():
        for language, row in entry["languages"].items():
            row["line_latency_p50_ms"] = percentile(latencies.get((config, language), []), 50)
    data["plots"] = _plots(out, data)
    (out / "study.json").write_text(json.dumps(data, indent=1, ensure_ascii=False, default=_plain))
    (out / "study.md").write_text(study_markdown(data))
    return data


def _rows(replicates) -> list[dict]:
    """Replicate sums, (reps, len(SUMS)), as one dict of SUMS each: what METRICS' formulas read."""
    return [dict(zip(SUMS, r)) for r in replicates.tolist()]


def _series(formula, columns: list[dict]):
    import numpy as np

    return np.array([v if (v := formula(c)) is not None else np.nan for c in columns], dtype=float)


def _value(estimate: dict) -> float:
    return estimate["value"] if estimate["value"] is not None else float("nan")


def _plain(value):
    """A JSON value: NaN and missing as null, numpy numbers as Python's."""
    import numpy as np

    if value is None:
        return None
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    return value


def _rq3(out: Path, groups: dict[str, list[str]], reps: int, seed: int) -> list[dict]:
    """Per (resource group, T, γ): α̂ and speedup over AR with 95% CIs."""
    from speccomplete.telemetry.analysis.groups import NATURAL_LANGUAGE, group_members
    from speccomplete.telemetry.analysis.statistics import resampled_sums

    frame = _rq3_sums(out)
    if frame.empty:
        return []
    sums = resampled_sums(frame, SUMS, reps, seed)
    domains = group_members(groups, sorted(set(frame.language)))
    if NATURAL_LANGUAGE in set(frame.language):
        domains[NATURAL_LANGUAGE] = [NATURAL_LANGUAGE]
    rows = []
    for config in dict.fromkeys(frame.config):
        gamma, temperature = config.split("|")
        draft = frame[frame.config == config].draft.iloc[0]
        for domain, members in domains.items():
            point, replicates = _pooled(frame, sums, config, members)
            if point is None:
                continue
            rows.append(
                {"draft": draft, "group": domain, "gamma": int(gamma), "temperature": float(temperature)}
                | {"n": int(point["runs"])}
                | _estimates(point, replicates, ["alpha", "alpha_all", "mean_accepted", "speedup", "decode_speedup"])
            )
    order = list(domains)  # the resource groups as languages.py lists them, then all code and nl
    return sorted(rows, key=lambda r: (r["draft"], order.index(r["group"]), r["temperature"], r["gamma"]))


def _plots(out: Path, data: dict) -> list[str]:
    """study_speedup.png (per language and draft, with CIs) and rq3_heatmap.png (γ × T per group)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from speccomplete.telemetry.analysis.plots import language_bars, speedup_heatmap

    written = []
    drafts = data["drafts"]
    languages = list(data["language_groups"])
    if drafts and languages:
        fig, axes = plt.subplots(2, 1, figsize=(max(6, 0.5 * len(languages) * max(1, len(drafts))), 7))
        for ax, metric, label in ((axes[0], "alpha", "the draft's own α̂"), (axes[1], "speedup", "speedup vs AR")):
            bars = {}
            for draft, entry in drafts.items():
                rows = [entry["languages"].get(lang, {}).get(metric, {}) for lang in languages]
                values = np.array([r.get("value") if r.get("value") is not None else np.nan for r in rows], float)
                lo = np.array([r.get("lo") if r.get("lo") is not None else np.nan for r in rows], float)
                hi = np.array([r.get("hi") if r.get("hi") is not None else np.nan for r in rows], float)
                bars[draft] = (values, np.nan_to_num(np.stack([values - lo, hi - values]), nan=0.0))
            language_bars(ax, languages, bars, data["language_groups"], label, at_one=metric == "speedup")
        fig.tight_layout()
        fig.savefig(out / "study_by_language.png", dpi=110)
        plt.close(fig)
        written.append("study_by_language.png")
    rq3 = [r for r in data["rq3"] if r["speedup"]["value"] is not None]
    panels = list(dict.fromkeys(r["group"] for r in rq3))
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.8), squeeze=False)
        for ax, group in zip(axes[0], panels):
            rows = [r for r in rq3 if r["group"] == group]
            gammas = sorted({r["gamma"] for r in rows})
            temperatures = sorted({r["temperature"] for r in rows})
            grid = np.full((len(temperatures), len(gammas)), np.nan)
            for r in rows:
                grid[temperatures.index(r["temperature"]), gammas.index(r["gamma"])] = r["speedup"]["value"]
            speedup_heatmap(fig, ax, grid, gammas, temperatures, f"speedup vs AR: {group}")
        fig.tight_layout()
        fig.savefig(out / "rq3_heatmap.png", dpi=110)
        plt.close(fig)
        written.append("rq3_heatmap.png")
    return written


def study_markdown(data: dict) -> str:
    """study.md: the per-language, per-group, U, paired and RQ3 tables of study.json, with n and CIs."""

    def cell(estimate: dict | None) -> str:
        from speccomplete.telemetry.analysis.markdown import fmt

        if not estimate or estimate.get("value") is None:
            return "–"
        text = fmt(estimate["value"])
        return text + (f" [{fmt(estimate['lo'])}, {fmt(estimate['hi'])}]" if estimate.get("lo") is not None else "")

    def table(header: list[str], rows: list[list[str]]) -> list[str]:
        return (
            ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            + ["| " + " | ".join(row) + " |" for row in rows]
            + [""]
        )

    md = [
        "# Disparity study",
        "",
        f"{data['cases']} cases; target `{data.get('target')}` on {data.get('device')}; γ policy "
        f"`{data.get('gamma')}`; {data.get('max_new_tokens')} tokens a block; made {data['made']}.",
        f"Reproduce: `{data['command']}`." if data.get("command") else "",
        "",
        "Definitions: " + " ".join(f"{name}: {text}." for name, text in data["definitions"].items() if name != "U"),
        "",
    ]
    metrics = ["alpha", "alpha_all", "mean_accepted", "speedup", "decode_speedup", "line_latency_ms"]
    titles = ["α̂ (draft's own)", "α̂ (all)", "τ", "speedup", "decode speedup", "line ms"]
    for draft, entry in data["drafts"].items():
        md += [f"## {draft}", "", "### Per language", ""]
        md += table(
            ["language", "group", "n", *titles],
            [
                [lang, row["group"] or "-", str(row["n"]), *(cell(row.get(m)) for m in metrics)]
                for lang, row in entry["languages"].items()
            ],
        )
        md += ["### Per group", ""]
        md += table(
            ["group", "n", *titles],
            [[g, str(row["n"]), *(cell(row.get(m)) for m in metrics)] for g, row in entry["groups"].items()],
        )
        md += ["### Unfairness U (of the draft's own α̂)", ""]
        md += table(
            ["group", "langs", "U", "U_p", "CV speedup", "slowest", "fastest"],
            [
                [
                    g,
                    str(row["languages"]),
                    cell({"value": row["U"], "lo": row["U_lo"], "hi": row["U_hi"]}),
                    cell({"value": row.get("U_p")}),
                    cell({"value": row["speedup_cv"], "lo": row["speedup_cv_lo"], "hi": row["speedup_cv_hi"]}),
                    str(row["slowest"] or "–"),
                    str(row["fastest"] or "–"),
                ]
                for g, row in entry.get("disparity", {}).items()
            ],
        )
    paired = data.get("paired", {})
    if paired.get("drafts"):
        md += [f"## Each draft against `{paired['base']}`, paired", ""]
        md += table(
            ["draft", "group", f"speedup over {paired['base']}", "decode speedup"],
            [
                [config, group, cell(row["speedup"]), cell(row["decode_speedup"])]
                for config, by_group in paired["drafts"].items()
                for group, row in by_group.items()
            ],
        )
    if data.get("ar"):
        md += ["## AR", ""]
        md += table(
            ["language", "n", "tok/s", "line ms"],
            [
                [lang, str(row["n"]), cell(row.get("tokens_per_s")), cell(row.get("line_latency_ms"))]
                for lang, row in data["ar"]["languages"].items()
            ],
        )
    if data["rq3"]:
        md += ["## RQ3: fixed γ × temperature", ""]
        md += table(
            ["draft", "group", "T", "γ", "n", "α̂ (draft's own)", "speedup", "decode speedup"],
            [
                [r["draft"], r["group"], f"{r['temperature']:g}", str(r["gamma"]), str(r["n"])]
                + [cell(r["alpha"]), cell(r["speedup"]), cell(r["decode_speedup"])]
                for r in data["rq3"]
            ],
        )
    md += ["## Plots", ""] + [f"![{p}]({p})" for p in data.get("plots", [])] + [""]
    md += ["U: " + data["definitions"]["U"], ""]
    return "\n".join(md)


# --------------------------------------------------------------------------- the command


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("study")
    p.add_argument("--cases", required=True)
    p.add_argument("--out", required=True, help="directory: events/, study.json, study.md, plots (resumes from it)")
    p.add_argument(
        "--drafts",
        help="drafts compared with AR at the product's γ policy (--gamma), comma-separated draft specs; "
        f"default: those of {','.join(DEFAULT_DRAFTS)} that exist for the target",
    )
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens a block run writes")
    p.add_argument(
        "--max-line-tokens",
        type=int,
        default=ServerOptions.max_tokens_single_line,
        help="token limit of a single-line run (default: the server's, %(default)s)",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--gammas", default="1,2,4,8", help="RQ3: fixed γ values; AR (γ 0) runs too")
    p.add_argument("--temperatures", default="0,0.5,1.0", help="RQ3: sampling temperatures")
    p.add_argument(
        "--rq3-per-language", type=int, default=5, help="RQ3: the grid on the first N cases of each language (0: skip)"
    )
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed")
    p.add_argument("--max-runs", type=int, help="stop after this many runs (rerun to go on)")
    p.add_argument("--no-report", action="store_true", help="skip `specdec report` on the block runs (DIR/report/)")
    add_model_args(p)  # --draft: the RQ3 grid's draft; --gamma: the γ policy the drafts run at
    return p


def build_drafts(
    specs: list[str], target, tokenizer, args, explicit: bool, say
) -> list[tuple[str, Drafter | None, Any]]:
    """(label, drafter, draft model) per spec, a label once; a default spec that does not exist for the
    target is left out with a note, a spec given on the command line that does not is an error."""
    from speccomplete.decoder.drafts import build_drafter, draft_label

    built: dict[str, tuple[str, Drafter | None, Any]] = {}
    for spec in specs:
        try:
            label = draft_label(spec, target)
            if label in built or label == AR:
                continue
            drafter, model = build_drafter(spec, target, tokenizer, device=args.device, dtype=args.dtype)
        except ValueError as e:  # DraftLoadError is one
            if explicit:
                raise
            say(f"study: draft {spec} left out: {e}")
            continue
        built[label] = (label, drafter, model)
    return list(built.values())


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from speccomplete.decoder.drafts import draft_label
    from speccomplete.decoder.engine import round_rows
    from speccomplete.decoder.loader import use_cpu_kernels
    from speccomplete.decoder.target_steps import target_steps

    from .returns import device_facts

    cases = read_cases(args.cases)
    if not cases:
        raise ValueError(f"no cases in {args.cases}")
    gammas = parse_list(args.gammas, int) if args.rq3_per_language else []
    temperatures = parse_list(args.temperatures, float) if args.rq3_per_language else []
    loaded = load(args, pack=False)
    target, tokenizer = loaded.target, loaded.tokenizer
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    explicit = args.drafts is not None
    specs = parse_list(args.drafts, str) if explicit else list(DEFAULT_DRAFTS)
    built = build_drafts(specs, target, tokenizer, args, explicit, say)
    rq3_label = draft_label(args.draft, target)
    rq3_drafter = next((d for label, d, _ in built if label == rq3_label), loaded.decoder.drafter)
    policy = parse_gamma_policy(args.gamma)

    def steps_for(drafter):
        hidden = drafter is not None and drafter.drafts_on_the_target
        taps = drafter.target_taps if drafter is not None else ()
        return target_steps(target, args.steps, round_rows(policy, drafter), hidden=hidden, taps=taps)

    ar_steps = steps_for(None)
    ar = SpeculativeDecoder(target, tokenizer, steps=ar_steps)
    drafts = [
        StudyDraft(
            label,
            SpeculativeDecoder(target, tokenizer, drafter, parse_gamma_policy(args.gamma), steps=steps_for(drafter)),
        )
        for label, drafter, _ in built
    ]
    if not args.no_pack or loaded.quantization == "int8":
        drafters = [loaded.decoder.drafter, *(d for _, d, _ in built)]
        use_cpu_kernels(
            ar_steps,
            target,
            loaded.draft_model,
            *(model for _, _, model in built if model is not None),
            *(module for d in drafters if d is not None for module in d.own_modules),
            int8=loaded.quantization == "int8",
        )
    out = Path(args.out)
    device = device_name(target)
    grid = len(grid_settings(gammas, temperatures)) if gammas else 0
    total = planned_runs(cases, len(drafts), grid, args.rq3_per_language if gammas else 0)
    done = sum(len(read_part(out, part)) for part in PARTS)
    say(f"study: {len(cases)} cases, drafts {', '.join(d.label for d in drafts)}; {done} of {total} runs done")
    with tqdm(total=total, initial=min(done, total), desc="study", unit="run") as bar:

        def progress(text: str) -> None:
            bar.set_postfix_str(text)
            bar.update(1)

        run_study(
            cases,
            ar,
            drafts,
            out,
            gamma=args.gamma,
            target_name=args.target,
            device=device,
            max_new_tokens=args.max_new_tokens,
            max_line_tokens=args.max_line_tokens,
            max_prompt_tokens=args.max_prompt_tokens,
            rq3_draft=(rq3_label, rq3_drafter) if gammas and rq3_drafter is not None else None,
            gammas=gammas,
            temperatures=temperatures,
            rq3_per_language=args.rq3_per_language,
            seed=args.seed,
            max_runs=args.max_runs,
            progress=progress,
        )
    meta = {
        "command": " ".join(["specdec", *getattr(args, "argv", [])]),
        "target": args.target,
        "device": device,
        "quantization": loaded.quantization,
        "gamma": args.gamma,
        "max_new_tokens": args.max_new_tokens,
        "max_line_tokens": args.max_line_tokens,
        "seed": args.seed,
        "device_facts": device_facts(),
    }
    data = summarize(out, reps=args.bootstrap, seed=args.seed, meta=meta)
    if not args.no_report:
        from speccomplete.telemetry.analysis.report import build_report

        build_report([str(out / "events" / "block.jsonl")], out / "report", reps=args.bootstrap, seed=args.seed)
    print(f"{data['cases']} cases -> {out / 'study.json'}, {out / 'study.md'}")
    return 0
