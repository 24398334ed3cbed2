"""report.md: the report's tables as Markdown, with their definitions.

A number the backend's draft counts do not define (α̂ of llama.cpp, which reports totals only; any
acceptance of vLLM, which reports none) reads "n/a", apart from "–" for a number with nothing to count.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .groups import ALL_CODE, NATURAL_LANGUAGE
from .queries import RQ3_GAMMAS
from .read import LONG_BURST
from .statistics import U_DEFINITION


def markdown(data, tables, groups, pair, plots, reps) -> str:
    """report.md from the report's JSON `data` and its tables."""
    langs, disp = tables["languages"], tables["disparity"]
    md = [
        "# Speculative decoding report",
        "",
        f"{data['events']} completion events from {len(data['files'])} input(s)."
        + (f" Reproduce: `{data['command']}`." if data["command"] else ""),
        "",
        "Definitions: α̂ = Σ accepted / (Σ accepted + Σ rejected rounds) (per-token acceptance; "
        "accepted/drafted is not α). Mean accepted length = accepted drafts per drafting round. Both need "
        "every drafting round, which only backends that record rounds report (ours, `local`). acc/drafted = "
        "Σ accepted / Σ drafted, the ratio llama.cpp reports (draft_n_accepted / draft_n): not α̂, shown for "
        "every backend that reports draft counts. n/a = the backend's counts do not define the number. "
        "Each backend has its own rows (labels name any but `local`). "
        "Speedup = spec tokens/s ÷ AR tokens/s over the cases that have AR events with the same target, "
        "backend, device, temperature and max_new_tokens. User acceptance = (accepted + partial) / shown, only where "
        f"outcome records exist. Brackets: bootstrap 95% CIs, {reps} Poisson-bootstrap resamples of cases "
        "within each language.",
        "",
        "Groups: "
        + "; ".join(f"{g} = {', '.join(m)}" for g, m in groups.items())
        + f"; {ALL_CODE} = every language except '{NATURAL_LANGUAGE}'.",
        "",
    ]
    spec_configs = langs[~langs.is_ar].groupby("config", sort=False).n.sum().sort_values(ascending=False)
    shown = list(spec_configs.index[:6])
    md += ["## Per language", ""]
    for config in shown + [c for c in langs[langs.is_ar].config.unique()]:
        rows = langs[langs.config == config]
        md += [f"### {config}", ""]
        md += [note, ""] if (note := counts_note(rows)) else []
        md += [
            md_table(
                not_applicable(rows, "mean_accepted"),
                [
                    ("language", "language"),
                    ("group", "group"),
                    ("n", "n"),
                    ("cases", "cases"),
                    ("alpha", "α̂"),
                    ("mean_accepted", "acc/round"),
                    ("accepted_per_drafted", "acc/drafted"),
                    ("tokens_per_s", "tok/s"),
                    ("latency_p50_ms", "p50 ms"),
                    ("latency_p95_ms", "p95 ms"),
                    ("user_acceptance", "user acc."),
                    ("speedup", "speedup"),
                ],
                cis={"alpha": "alpha", "speedup": "speedup"},
            ),
            "",
        ]
    if len(spec_configs) > len(shown):
        md += [f"{len(spec_configs) - len(shown)} more configurations are in languages.csv.", ""]
    md += [
        "## Disparity across languages",
        "",
        U_DEFINITION,
        "",
        "Max/min speedup are the extremes of per-language speedup; CV = population std / mean of "
        "per-language speedup. A group needs two languages for U and CV. U needs α̂: n/a for a backend "
        "that does not record its drafting rounds.",
        "",
    ]
    with_rounds = set(langs.config[langs.n_rounds > 0])
    for config in shown:
        rows = disp[disp.config == config]
        if len(rows):
            if config not in with_rounds:
                rows = _mark(rows, ["U", "U_p", "U_std", "alpha_min", "alpha_max"], pd.Series(True, index=rows.index))
            md += [
                f"### {config}",
                "",
                md_table(
                    rows,
                    [
                        ("group", "group"),
                        ("languages", "langs"),
                        ("U", "U (MAD of α̂)"),
                        ("U_p", "U_p"),
                        ("U_std", "U_std"),
                        ("alpha_min", "min α̂"),
                        ("alpha_max", "max α̂"),
                        ("speedup_min", "min speedup"),
                        ("speedup_max", "max speedup"),
                        ("speedup_cv", "CV speedup"),
                        ("slowest", "slowest"),
                        ("fastest", "fastest"),
                    ],
                    cis={
                        "U": "U",
                        "speedup_min": "speedup_min",
                        "speedup_max": "speedup_max",
                        "speedup_cv": "speedup_cv",
                    },
                ),
                "",
            ]
    if pair:
        md += [
            "## Δ disparity: base vs tuned draft",
            "",
            f"Base = `{pair[0]}`, tuned = `{pair[1]}` (the draft seen first is the base; `--base` picks it). "
            "ΔU = U_tuned − U_base; negative is fairer. Its CI comes from paired resamples of the same cases.",
            "",
        ]
        if len(tables["delta_disparity"]):
            md += [
                md_table(
                    tables["delta_disparity"],
                    [
                        *backend_column(tables["delta_disparity"]),
                        ("gamma", "γ"),
                        ("temperature", "T"),
                        ("group", "group"),
                        ("languages", "langs"),
                        ("U_base", "U base"),
                        ("U_tuned", "U tuned"),
                        ("delta_U", "ΔU"),
                        ("delta_U_pct", "ΔU %"),
                        ("speedup_cv_base", "CV base"),
                        ("speedup_cv_tuned", "CV tuned"),
                    ],
                    cis={"delta_U": "delta_U"},
                ),
                "",
            ]
        md += [
            "## RQ1: base vs tuned draft, code vs natural language",
            "",
            md_table(
                not_applicable(tables["rq1"], "mean_burst"),
                [
                    *backend_column(tables["rq1"]),
                    ("gamma", "γ"),
                    ("temperature", "T"),
                    ("role", "role"),
                    ("draft", "draft"),
                    ("domain", "domain"),
                    ("n", "n"),
                    ("alpha", "α̂"),
                    ("mean_burst", "acc/round"),
                    ("accepted_per_drafted", "acc/drafted"),
                    ("speedup", "speedup"),
                ],
            ),
            "",
        ]
    if len(tables["rq3"]):
        md += [
            "## RQ3: γ sweep",
            "",
            f"Fixed γ ∈ {{{', '.join(map(str, RQ3_GAMMAS))}}}, pooled over languages. Burst = accepted drafts in a "
            f"drafting round; P(burst > {LONG_BURST}) from the accepted histograms.",
            "",
            md_table(
                not_applicable(tables["rq3"], "mean_burst"),
                [
                    *backend_column(tables["rq3"]),
                    ("draft", "draft"),
                    ("temperature", "T"),
                    ("gamma", "γ"),
                    ("n", "n"),
                    ("alpha", "α̂"),
                    ("mean_burst", "mean burst"),
                    ("p_burst_gt10", f"P(burst>{LONG_BURST})"),
                    ("accepted_per_drafted", "acc/drafted"),
                    ("tokens_per_s", "tok/s"),
                    ("speedup", "speedup"),
                ],
            ),
            "",
        ]
    if len(tables["stages"]):
        md += [
            "## Waits per kind of answer",
            "",
            "Answered requests (not cancelled), in ms. A block is answered whole, or in stages: its first lines at its "
            "time budget, then its next lines once those are taken. The wait is the server's debounce (its wait for "
            "more typing) plus its latency after it; the editor's own delays are not in it.",
            "",
            md_table(
                tables["stages"],
                [
                    ("config", "config"),
                    ("answer", "answer"),
                    ("n", "n"),
                    ("debounce_p50_ms", "debounce p50"),
                    ("latency_p50_ms", "latency p50"),
                    ("latency_p95_ms", "latency p95"),
                    ("wait_p50_ms", "wait p50"),
                    ("wait_p95_ms", "wait p95"),
                ],
            ),
            "",
        ]
    md += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(md)


def counts_note(rows: pd.DataFrame) -> str | None:
    """What a configuration's backend reported of its drafting, when that is less than every round."""
    if rows.is_ar.all():
        return None  # nothing drafted: no acceptance to explain
    backend, n = rows.backend.iloc[0], int(rows.n.sum())
    n_rounds, n_totals = int(rows.n_rounds.sum()), int(rows.n_totals.sum())
    unreported = n - n_rounds - n_totals
    if not n_rounds and not n_totals:
        return (
            f"Backend `{backend}` reports no draft counts (an OpenAI-compatible server such as vLLM): α̂, "
            "acc/round and acc/drafted are n/a. Speed, latency, user acceptance and speedup are comparable."
        )
    note = []
    if not n_rounds:
        note.append(
            f"Backend `{backend}` reports draft totals only (llama.cpp's draft_n and draft_n_accepted): acc/drafted "
            "is that ratio, not α̂; α̂ and acc/round need every drafting round and are n/a."
        )
    if unreported:
        note.append(f"{unreported} of {n} events report no draft counts and are left out of acc/drafted.")
    return " ".join(note) or None


def not_applicable(df: pd.DataFrame, tau: str) -> pd.DataFrame:
    """`df` with "n/a" for α̂ and τ where no event recorded its rounds, and for acc/drafted where
    no event reported even totals (the rows of queries.COUNT_SUMS)."""
    if not len(df):
        return df
    df = _mark(df, ["alpha", tau, "p_burst_gt10"], df.n_rounds == 0)
    return _mark(df, ["accepted_per_drafted"], df.n_rounds + df.n_totals == 0)


def _mark(df: pd.DataFrame, columns: list[str], where: pd.Series) -> pd.DataFrame:
    df = df.copy()
    for column in columns:
        df[column] = df[column].astype(object).where(~where, "n/a")
    return df


def backend_column(df: pd.DataFrame) -> list[tuple[str, str]]:
    """A backend column for a table pooled over configurations, unless every row is our own decoder's."""
    return [("backend", "backend")] if len(df) and set(df.backend) != {"local"} else []


def md_table(df: pd.DataFrame, columns: list[tuple[str, str]], cis: dict[str, str] | None = None) -> str:
    """Markdown table; `cis` maps a column to the prefix of its _lo/_hi CI columns."""
    cis = cis or {}
    lines = ["| " + " | ".join(title for _, title in columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for _, row in df.iterrows():
        cells = []
        for column, _ in columns:
            cell = fmt(row.get(column))
            if column in cis and fmt(row.get(f"{cis[column]}_lo")) != "–":
                cell += f" [{fmt(row.get(cis[column] + '_lo'))}, {fmt(row.get(cis[column] + '_hi'))}]"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt(value: object) -> str:
    """A table cell: "–" for missing, yes/no, three decimals below 100."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)) or value is pd.NA:
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return f"{number:.3f}" if abs(number) < 100 else f"{number:.0f}"
    return str(value)
