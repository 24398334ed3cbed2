"""The report's PNG plots: α̂ and speedup by language, and the RQ3 γ sweep (speedup heatmap, bursts); and the
study's: α̂ and speedup by language with intervals, and speedup over γ × T per resource group.

Plots are drawn per configuration or per backend and draft (the configuration label names the
backend), so two backends never share a bar, cell or line; α̂ and bursts exist for "rounds" events only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .queries import RQ3_GAMMAS
from .read import LONG_BURST


def language_bars(ax, languages: list[str], bars: dict, group_of: dict, ylabel: str, at_one: bool) -> None:
    """Bars grouped by language (its resource group under its name), one per label of `bars`: label -> (values,
    error bars as matplotlib's yerr, or None); `at_one` draws the line at 1 (a speedup's break-even)."""
    width = 0.8 / len(bars)
    for i, (label, (values, errors)) in enumerate(bars.items()):
        x = np.arange(len(languages)) + i * width - 0.4 + width / 2
        if errors is None:
            ax.bar(x, values, width, label=label)
        else:
            ax.bar(x, values, width, yerr=errors, capsize=2, label=label)
    ax.set_xticks(np.arange(len(languages)))
    ax.set_xticklabels([f"{lang}\n({group_of.get(lang) or '-'})" for lang in languages], fontsize=8)
    ax.set_ylabel(ylabel)
    if at_one:
        ax.axhline(1.0, color="black", linewidth=0.8)
    ax.legend(fontsize=7)


def write_plots(out: Path, langs: pd.DataFrame, rq3_table: pd.DataFrame, groups: dict, max_configs: int) -> list[str]:
    """Write the PNGs into `out`; return their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    group_of = {lang: g for g, members in groups.items() for lang in members}
    order = [lang for members in groups.values() for lang in members]
    spec = langs[~langs.is_ar]
    configs = list(spec.groupby("config").n.sum().sort_values(ascending=False).index[:max_configs])
    for column, ylabel, name in (
        ("alpha", "per-token acceptance α̂", "alpha_by_language.png"),
        ("speedup", "speedup vs AR", "speedup_by_language.png"),
    ):
        data = spec[spec.config.isin(configs) & spec[column].notna()]
        if data.empty:
            continue
        languages = sorted(set(data.language), key=lambda x: (order.index(x) if x in order else len(order), x))
        fig, ax = plt.subplots(figsize=(min(16, max(6, 0.35 * len(languages) * len(configs))), 4.5))
        bars = {
            config: (data[data.config == config].set_index("language").reindex(languages)[column], None)
            for config in configs
        }
        language_bars(ax, languages, bars, group_of, ylabel, at_one=column == "speedup")
        ax.set_title(f"{ylabel} by language")
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    sweep = rq3_table[rq3_table.speedup.notna() & rq3_table.temperature.notna()]
    if not sweep.empty:
        # One panel per backend and draft: pivot_table would average two backends' cells into one.
        panels = sorted(set(zip(sweep.backend, sweep.draft)))
        fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
        for ax, (backend, draft) in zip(axes[0], panels):
            rows = sweep[(sweep.backend == backend) & (sweep.draft == draft)]
            grid = rows.pivot_table(index="temperature", columns="gamma", values="speedup")
            title = f"speedup vs AR, draft {draft}" + ("" if backend == "local" else f" via {backend}")
            speedup_heatmap(fig, ax, grid.to_numpy(), list(grid.columns), list(grid.index), title)
        fig.tight_layout()
        fig.savefig(out / "rq3_speedup_heatmap.png", dpi=110)
        plt.close(fig)
        written.append("rq3_speedup_heatmap.png")

    bursts = rq3_table[rq3_table.mean_burst.notna()]
    if not bursts.empty:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for (backend, draft, temperature), rows in bursts.groupby(["backend", "draft", "temperature"], dropna=False):
            rows = rows.sort_values("gamma")
            label = f"{draft} T={temperature:g}" if pd.notna(temperature) else draft
            label += "" if backend == "local" else f" via {backend}"
            left.plot(rows.gamma, rows.mean_burst, marker="o", label=label)
            right.plot(rows.gamma, rows.p_burst_gt10, marker="o", label=label)
        for ax, ylabel in ((left, "accepted tokens per round"), (right, f"P(burst > {LONG_BURST})")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(RQ3_GAMMAS, [str(g) for g in RQ3_GAMMAS])
            ax.set_xlabel("γ")
            ax.set_ylabel(ylabel)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "rq3_bursts.png", dpi=110)
        plt.close(fig)
        written.append("rq3_bursts.png")
    return written


def speedup_heatmap(fig, ax, grid: np.ndarray, gammas: list, temperatures: list, title: str) -> None:
    """One panel of speedup over AR: temperature (rows) × γ (columns), each cell's value written in it."""
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(range(len(gammas)), [str(g) for g in gammas])
    ax.set_yticks(range(len(temperatures)), [f"{t:g}" for t in temperatures])
    for (i, j), value in np.ndenumerate(grid):
        if np.isfinite(value):
            ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="white", fontsize=8)
    ax.set_xlabel("γ")
    ax.set_ylabel("temperature")
    ax.set_title(title)
    fig.colorbar(image, ax=ax)


def study_plots(out: Path, data: dict) -> list[str]:
    """The study's PNGs from study.json's `data`: study_by_language.png (α̂ and speedup per language and draft, with
    intervals) and rq3_heatmap.png (speedup over AR, γ × T per group); returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
