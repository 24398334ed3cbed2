"""`specdec report`: per-language speed and acceptance, disparity across languages, RQ1 and RQ3.

Aggregation runs in DuckDB (read.py, queries.py); only per-case sums reach numpy, for the bootstrap
(statistics.py). Every number is pooled as a ratio of sums, never a mean of per-event ratios:
  α̂  = Σ accepted / (Σ accepted + Σ rejected_rounds)            per-token acceptance
  τ  = Σ accepted / Σ drafting rounds                            mean accepted length (burst)
  accepted / drafted                                             what llama.cpp reports; not α̂
  tokens/s = 1000 Σ generated_tokens / Σ total_ms
  speedup  = (spec tokens/s) / (AR tokens/s) over the cases that have both, where an AR event
             (draft "none" or γ "0") has the same target, backend, device, temperature, max_new_tokens,
             case and run id (where the harness sets one: speed is compared within one run).
α̂, τ and the latency percentiles are speccomplete.metrics's (docs/speculative-decoding.md, "Measuring
acceptance: α̂ and τ", says why α̂ is not accepted / drafted).
A configuration is (target, draft, γ policy, temperature, backend); each gets its own rows. α̂ and τ
come from events that recorded every drafting round ("rounds"), accepted/drafted also from those with
totals only (llama.cpp), neither from a backend that reports no draft counts (queries.py says how).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from .groups import default_groups
from .markdown import markdown
from .plots import write_plots
from .queries import REPORT_COLUMNS, language_table, prepare, rq1, rq3, stage_table
from .read import connect
from .statistics import U_DEFINITION, bootstrap, ci, delta_disparity, disparity, u_replicates


def build_report(
    paths: Sequence[str | Path],
    out: str | Path,
    groups: dict[str, list[str]] | None = None,
    base_draft: str | None = None,
    reps: int = 1000,
    seed: int = 0,
    max_plot_configs: int = 6,
    command: str | None = None,
) -> dict:
    """Read events, write report.md, report.json, CSV tables and PNG plots into `out`; return the JSON."""
    groups = groups or default_groups()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    con = connect(paths, columns=REPORT_COLUMNS)
    [(n_events,)] = con.execute("SELECT count(*) FROM events").fetchall()
    if not n_events:
        raise ValueError("no completion events in " + ", ".join(map(str, paths)))
    prepare(con)
    langs = language_table(con)
    group_of = {lang: g for g, members in groups.items() for lang in members}
    langs.insert(langs.columns.get_loc("language") + 1, "group", langs.language.map(group_of).fillna("-"))
    replicates = bootstrap(con.execute("SELECT * FROM blocks").df(), reps, seed)
    for column, attr in (("alpha", "alpha"), ("speedup", "speedup")):
        lo, hi = [], []
        for config, language, is_ar in zip(langs.config, langs.language, langs.is_ar):
            samples = getattr(replicates[config], attr).get(language) if not is_ar else None
            low, high = ci(samples) if samples is not None else (None, None)
            lo.append(low)
            hi.append(high)
        langs[f"{column}_lo"], langs[f"{column}_hi"] = lo, hi
    disp = disparity(langs, replicates, groups)
    first_seen = dict(con.execute("SELECT draft, min(time) FROM events GROUP BY draft").fetchall())
    pair = pick_drafts(langs, first_seen, base_draft)
    delta = (
        delta_disparity(disp, u_replicates(langs, replicates, groups), pair) if pair and len(disp) else pd.DataFrame()
    )
    rq1_table = rq1(con, pair) if pair else pd.DataFrame()
    rq3_table = rq3(con)
    rq3_langs = rq3(con, by_language=True)
    stages = stage_table(con)

    tables = {
        "languages": langs.drop(columns=["sp_tokens", "sp_ms", "ar_tokens", "ar_ms"]),
        "disparity": disp,
        "delta_disparity": delta,
        "rq1": rq1_table,
        "rq3": rq3_table,
        "rq3_by_language": rq3_langs,
        "stages": stages,
    }
    for name, table in tables.items():
        if len(table):
            table.to_csv(out / f"{name}.csv", index=False)
    plots = write_plots(out, langs, rq3_table, groups, max_plot_configs)
    data = {
        "events": int(n_events),
        "files": [str(p) for p in paths],
        "command": command,
        "groups": groups,
        "definitions": {
            "U": U_DEFINITION,
            "alpha": "Σ accepted / (Σ accepted + Σ rejected_rounds), over events with draft_counts 'rounds' only",
            "mean_accepted": "τ = Σ accepted / Σ drafting rounds, over events with draft_counts 'rounds' only",
            "accepted_per_drafted": (
                "Σ accepted / Σ drafted over events with draft_counts 'rounds' or 'totals': llama.cpp's own "
                "ratio (draft_n_accepted / draft_n), not α̂"
            ),
            "draft_counts": (
                "what the backend reported of its drafting: rounds (every round), totals (drafted and "
                "accepted only) or unreported (none); a row lists the kinds among its events"
            ),
            "speedup": (
                "spec tokens/s ÷ AR tokens/s over cases with both (same target, backend, device, T, max_new_tokens)"
            ),
            "bootstrap": f"{reps} Poisson-bootstrap resamples of cases within each language; 95% percentile intervals",
            "wait": (
                "the server's debounce (its wait for more typing) plus its latency after it, per answer; "
                "the editor's own delays and the pipe are not in it"
            ),
        },
        "base_tuned": list(pair) if pair else None,
        "plots": plots,
        **{name: _records(table) for name, table in tables.items()},
    }
    (out / "report.json").write_text(json.dumps(data, indent=1, ensure_ascii=False))
    (out / "report.md").write_text(markdown(data, tables, groups, pair, plots, reps))
    return data


def pick_drafts(langs: pd.DataFrame, events_first_seen: dict[str, float], base: str | None) -> tuple[str, str] | None:
    """(base, tuned) draft names when exactly two drafts (besides AR) are present, or base names one of them."""
    drafts = sorted(set(langs.loc[~langs.is_ar, "draft"].dropna()), key=lambda d: events_first_seen.get(d, 0))
    if base is not None:
        others = [d for d in drafts if d != base]
        if base not in drafts or len(others) != 1:
            raise ValueError(f"--base {base!r}: need it and exactly one other draft, found {drafts}")
        return base, others[0]
    return (drafts[0], drafts[1]) if len(drafts) == 2 else None


def _records(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records")) if len(df) else []
