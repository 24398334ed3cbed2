"""`specdec study`'s numbers: study.json (with study.md and the plots) from the study's events, its block,
single-line and RQ3 runs.

Every number is a ratio of sums over cases (SUMS), never a mean of per-case ratios, with a 95% interval from
statistics.py's Poisson bootstrap of cases within each language; speed-up is speccomplete.metrics.speedup over
each run paired with its case's AR run (pairing.py), and U is statistics.disparity's. α̂ is the draft's own: a
hybrid draft's (ngram+X) lookup copies and the rounds they lost are counted apart, so its α̂ is X's.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Iterable
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from speccomplete.metrics import acceptance_rate, mean_accepted_length, percentile, speedup

from .groups import NATURAL_LANGUAGE, default_groups, group_members
from .pairing import pair_with_ar
from .plots import study_plots
from .read import connect
from .statistics import U_DEFINITION, Replicates, ci, disparity, resampled_sums
from .study_markdown import study_markdown

AR = "none"  # the draft label of AR runs, as events name it
LOOKUP = "ngram"  # prompt lookup alone: what a trained draft must beat, so every draft is paired against it
# The event fields the study reads (read.connect adds the ones every query needs).
STUDY_COLUMNS = [
    "language",
    "generated_tokens",
    "accepted",
    "rejected_rounds",
    "lookup_accepted",
    "lookup_rejected_rounds",
    "prefill_ms",
    "total_ms",
    "latency_ms",
    "target",
    "device",
]
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
# A block or RQ3 case's draft counts, as SQL over its runs: the draft's own (lookup copies left out), then all.
DRAFT_COUNTS = {
    "runs": "count(*)",
    "acc_model": "sum(accepted - lookup_accepted)",
    "rej_model": "sum(rejected_rounds - lookup_rejected_rounds)",
    "acc": "sum(accepted)",
    "rej": "sum(rejected_rounds)",
    "drafting_rounds": "sum(burst_rounds)",
}
RQ3_CONFIG = "concat_ws(' ', draft, 'γ=' || gamma, 'T=' || CAST(temperature AS VARCHAR))"


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


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
        lambda s: speedup(s["sp_tokens"], s["sp_ms"], s["ar_tokens"], s["ar_ms"]),
        "block tokens/s ÷ AR's block tokens/s on the same cases (decoder time, prefill included)",
    ),
    "decode_speedup": (
        lambda s: speedup(s["sp_tokens"], s["sp_decode_ms"], s["ar_tokens"], s["ar_decode_ms"]),
        "the same with the prefill's time left out of both sides (it is the same work for both)",
    ),
    "tokens_per_s": (lambda s: _ratio(1000 * s["tokens"], s["ms"]), "block tokens/s: 1000 Σ tokens / Σ ms"),
    "line_latency_ms": (
        lambda s: _ratio(s["line_ms"], s["line_runs"]),
        "mean wall time of a single-line request (stop at the line's end), the harness's own clock",
    ),
}


def study_runs(path: Path | None) -> duckdb.DuckDBPyConnection | None:
    """A DuckDB connection whose table `events` holds one part's runs, a run recorded twice (an RQ3 grid run
    again) once: its latest. None when the file holds none."""
    if path is None or not path.exists() or not path.stat().st_size:
        return None
    con = connect([path], columns=STUDY_COLUMNS)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE events AS SELECT * FROM events
        QUALIFY row_number() OVER (PARTITION BY case_id, draft, gamma, temperature ORDER BY time DESC) = 1
    """)
    return con


def _sums_of_units() -> str:
    """SELECT's SUMS from table `units` (pairing.pair_with_ar), as floats: all but the line runs'."""
    return ", ".join(f"CAST({name} AS DOUBLE) AS {name}" for name in SUMS if not name.startswith("line_"))


def case_sums(block: Path | None, line: Path | None) -> pd.DataFrame:
    """One row per (configuration, language, case) with SUMS: the block and line runs of RQ1/RQ2, configurations
    named by draft. Rows come in the order their runs were made (the block runs', then any case with line runs
    only), which fixes the order the pooled sums add in."""
    frames = []
    if (con := study_runs(block)) is not None:
        pair_with_ar(con, "draft", DRAFT_COUNTS)
        frames.append(
            con.execute(
                f"SELECT config, language, unit AS block, {_sums_of_units()} FROM units ORDER BY first_time"
            ).df()
        )
    if (con := study_runs(line)) is not None:
        frames.append(
            con.execute("""
                SELECT draft AS config, language, unit AS block, CAST(count(*) AS DOUBLE) AS line_runs,
                       sum(latency_ms) AS line_ms
                FROM events GROUP BY ALL ORDER BY min(time)
            """).df()
        )
    columns = ["config", "language", "block", *SUMS]
    if not frames:
        return pd.DataFrame(columns=columns)
    # a case's line sums join its block row: each sum is in one frame only, so a row adds no two numbers
    rows = pd.concat(frames).groupby(["config", "language", "block"], sort=False, as_index=False).sum()
    return rows.reindex(columns=columns, fill_value=0.0)


def rq3_sums(rq3: Path | None) -> pd.DataFrame:
    """One row per (draft, γ, T configuration, language, case) with SUMS, paired with the case's AR at that T."""
    columns = ["config", "language", "block", "draft", "gamma", "temperature", *SUMS]
    con = study_runs(rq3)
    if con is None:
        return pd.DataFrame(columns=columns)
    pair_with_ar(con, RQ3_CONFIG, DRAFT_COUNTS)
    rows = con.execute(f"""
        SELECT u.config, u.language, u.unit AS block, c.draft, c.gamma, c.temperature, {_sums_of_units()}
        FROM units u JOIN (
            SELECT DISTINCT {RQ3_CONFIG} AS config, draft, CAST(gamma AS INTEGER) AS gamma, temperature FROM events
        ) c USING (config)
        WHERE NOT u.is_ar ORDER BY u.first_time
    """).df()
    return rows.reindex(columns=columns, fill_value=0.0)


def line_latency_p50(line: Path | None) -> dict[tuple[str, str], float | None]:
    """(draft, language) -> the median single-line run's wall time."""
    con = study_runs(line)
    if con is None:
        return {}
    rows = con.execute("SELECT draft, language, list(latency_ms) FROM events GROUP BY ALL").fetchall()
    return {(draft, language): percentile(latencies, 50) for draft, language, latencies in rows}


def _estimates(point: dict, replicates, names: Iterable[str]) -> dict:
    """Each metric's point value and 95% bootstrap interval."""
    out = {}
    for name in names:
        formula = METRICS[name][0]
        value = formula(point)
        lo, hi = ci(_series(formula, _rows(replicates))) if value is not None else (None, None)
        out[name] = {"value": value, "lo": lo, "hi": hi}
    return out


def _pooled(frame: pd.DataFrame, sums: dict, config: str, languages: list[str]):
    """The point sums and replicate sums of `config` over `languages` (strata resampled apart)."""
    members = [lang for lang in languages if (config, lang) in sums]
    if not members:
        return None, None
    rows = frame[(frame.config == config) & frame.language.isin(members)]
    point = {name: float(rows[name].sum()) for name in SUMS}
    return point, np.sum([sums[(config, lang)] for lang in members], axis=0)


def paired_speedups(frame, sums: dict, base: str, configs: list[str], domains: dict[str, list[str]]) -> dict:
    """Per draft and group, its speedup over `base`'s on the same cases (the ratio of their tokens/s), prefill
    included and left out, with 95% intervals. Paired: a replicate weighs a case alike for both drafts
    (statistics.resampled_sums), so the interval leaves out the cases' own spread."""
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


def _draft_entry(frame, sums, config: str, languages, domains, group_of, groups) -> dict:
    """One configuration's per-language and per-group estimates, and for a draft its disparity (U) per group."""
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
    if config == AR:
        return entry
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
    return entry


def summarize_study(
    parts: dict[str, Path],
    out: str | Path,
    *,
    groups: dict[str, list[str]] | None = None,
    reps: int = 1000,
    seed: int = 0,
    meta: dict | None = None,
    paired_base: str = LOOKUP,
) -> dict:
    """study.json, study.md and the plots in `out`, from the event files of `parts` ("block", "line" and "rq3",
    each optional); `meta` (the command, target, device, ...) leads study.json. Returns study.json's content."""
    out = Path(out)
    groups = groups or default_groups()
    group_of = {lang: g for g, members in groups.items() for lang in members}
    frame = case_sums(parts.get("block"), parts.get("line"))
    if frame.empty:
        raise ValueError(f"no study events in {', '.join(map(str, parts.values()))}")
    sums = resampled_sums(frame, SUMS, reps, seed)
    languages = sorted(set(frame.language), key=lambda x: (list(group_of).index(x) if x in group_of else 99, x))
    domains = group_members(groups, languages)
    if NATURAL_LANGUAGE in languages:
        domains[NATURAL_LANGUAGE] = [NATURAL_LANGUAGE]
    configs = [AR] + [c for c in dict.fromkeys(frame.config) if c != AR]
    drafts = {config: _draft_entry(frame, sums, config, languages, domains, group_of, groups) for config in configs}
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
            "drafts": paired_speedups(
                frame, sums, paired_base, [c for c in configs if c not in (AR, paired_base)], domains
            )
            if paired_base in configs
            else {},
        },
        "rq3": rq3_rows(rq3_sums(parts.get("rq3")), groups, reps, seed),
    }
    latencies = line_latency_p50(parts.get("line"))
    for config, entry in drafts.items():
        for language, row in entry["languages"].items():
            row["line_latency_p50_ms"] = latencies.get((config, language))
    data["plots"] = study_plots(out, data)
    (out / "study.json").write_text(json.dumps(data, indent=1, ensure_ascii=False, default=_plain))
    (out / "study.md").write_text(study_markdown(data))
    return data


def rq3_rows(frame: pd.DataFrame, groups: dict[str, list[str]], reps: int, seed: int) -> list[dict]:
    """Per (draft, resource group, T, γ): α̂, τ and speedup over AR with 95% intervals."""
    if frame.empty:
        return []
    sums = resampled_sums(frame, SUMS, reps, seed)
    domains = group_members(groups, sorted(set(frame.language)))
    if NATURAL_LANGUAGE in set(frame.language):
        domains[NATURAL_LANGUAGE] = [NATURAL_LANGUAGE]
    rows = []
    for config, runs in frame.groupby("config", sort=False):
        first = runs.iloc[0]
        for domain, members in domains.items():
            point, replicates = _pooled(frame, sums, config, members)
            if point is None:
                continue
            rows.append(
                {"draft": first.draft, "group": domain, "gamma": int(first.gamma)}
                | {"temperature": float(first.temperature), "n": int(point["runs"])}
                | _estimates(point, replicates, ["alpha", "alpha_all", "mean_accepted", "speedup", "decode_speedup"])
            )
    order = list(domains)  # the resource groups as languages.py lists them, then all code and nl
    return sorted(rows, key=lambda r: (r["draft"], order.index(r["group"]), r["temperature"], r["gamma"]))


def _rows(replicates) -> list[dict]:
    """Replicate sums, (reps, len(SUMS)), as one dict of SUMS each: what METRICS' formulas read."""
    return [dict(zip(SUMS, r)) for r in replicates.tolist()]


def _series(formula, columns: list[dict]) -> np.ndarray:
    return np.array([v if (v := formula(c)) is not None else np.nan for c in columns], dtype=float)


def _value(estimate: dict) -> float:
    return estimate["value"] if estimate["value"] is not None else float("nan")


def _plain(value):
    """A JSON value: NaN and missing as null, numpy numbers as Python's."""
    if value is None:
        return None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    return value
