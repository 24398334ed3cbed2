"""report.md: the report's tables as Markdown, with their definitions."""

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
        "accepted/drafted is not α). Mean accepted length = accepted drafts per drafting round. "
        "Speedup = spec tokens/s ÷ AR tokens/s over the cases that have AR events with the same target, "
        "device, temperature and max_new_tokens. User acceptance = (accepted + partial) / shown, only where "
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
        md += [
            f"### {config}",
            "",
            md_table(
                langs[langs.config == config],
                [
                    ("language", "language"),
                    ("group", "group"),
                    ("n", "n"),
                    ("cases", "cases"),
                    ("alpha", "α̂"),
                    ("mean_accepted", "acc/round"),
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
        "per-language speedup. A group needs two languages for U and CV.",
        "",
    ]
    for config in shown:
        rows = disp[disp.config == config]
        if len(rows):
            md += [
                f"### {config}",
                "",
                md_table(
                    rows,
                    [
                        ("group", "group"),
                        ("languages", "langs"),
                        ("U", "U (MAD of α̂)"),
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
                tables["rq1"],
                [
                    ("gamma", "γ"),
                    ("temperature", "T"),
                    ("role", "role"),
                    ("draft", "draft"),
                    ("domain", "domain"),
                    ("n", "n"),
                    ("alpha", "α̂"),
                    ("mean_burst", "acc/round"),
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
                tables["rq3"],
                [
                    ("draft", "draft"),
                    ("temperature", "T"),
                    ("gamma", "γ"),
                    ("n", "n"),
                    ("alpha", "α̂"),
                    ("mean_burst", "mean burst"),
                    ("p_burst_gt10", f"P(burst>{LONG_BURST})"),
                    ("tokens_per_s", "tok/s"),
                    ("speedup", "speedup"),
                ],
            ),
            "",
        ]
    md += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(md)


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
