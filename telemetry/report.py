"""`specdec report`: per-language speed and acceptance, disparity across languages, RQ1 and RQ3.

Aggregation runs in DuckDB (telemetry.read); only per-case sums reach numpy, for the bootstrap.
Every number is pooled as a ratio of sums, never a mean of per-event ratios:
  α̂  = Σ accepted / (Σ accepted + Σ rejected_rounds)            per-token acceptance (NOTES §3)
  τ  = Σ accepted / Σ drafting rounds                            mean accepted length (burst)
  tokens/s = 1000 Σ generated_tokens / Σ total_ms
  speedup  = (spec tokens/s) / (AR tokens/s) over the cases that have both, where an AR event
             (draft "none" or γ "0") has the same target, device, temperature, max_new_tokens, case
             and run id (where the harness sets one: speed is compared within one run).
A configuration is (target, draft, γ policy, temperature); each gets its own rows.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .read import connect

DEFAULT_GROUPS = {
    "high": ["python", "cpp", "java", "c", "javascript", "go"],
    "medium": ["lua", "haskell", "ruby", "rust", "typescript"],
    "low": ["zig", "elixir", "ocaml"],
}
NATURAL_LANGUAGE = "nl"
ALL_CODE = "all code"  # every language except natural language, grouped or not
MAX_BLOCKS = 2000  # above this many cases in a language, cases are resampled in hashed blocks
LONG_BURST = 10
RQ3_GAMMAS = (1, 2, 4, 8, 16, 32)
REPORT_COLUMNS = ["language", "generated_tokens", "accepted", "rejected_rounds", "total_ms", "latency_ms",
                  "target", "device"]

U_DEFINITION = (
    "U is the mean absolute deviation, across the languages T of a group, of the per-language "
    "per-token acceptance α̂_T: U = (1/|G|) Σ_T |α̂_T − ᾱ|, with ᾱ = (1/|G|) Σ_T α̂_T (every language "
    "weighs the same). Sandler et al. 2025 define unfairness as the dispersion across tasks of the "
    "draft's fitness to the target, fitness being cross-entropy based. Events carry acceptance, not "
    "the two models' distributions, so α̂_T stands in for fitness: α = Σ_x min(p, q) = 1 − TV(p, q) "
    "falls as the draft fits the target worse. The mean absolute deviation is in α's own units "
    "(U = 0.05 means a typical language sits 5 points of acceptance away from the group mean) and "
    "is less dominated by a single outlier language than the standard deviation, which is also "
    "given (U_std, population form)."
)


def parse_groups(specs: list[str] | None) -> dict[str, list[str]]:
    """["high=python,cpp", "low=zig"] (or one string joined by ';') -> {"high": [...], "low": [...]}."""
    if not specs:
        return {k: list(v) for k, v in DEFAULT_GROUPS.items()}
    groups: dict[str, list[str]] = {}
    for spec in specs:
        for part in filter(None, (p.strip() for p in spec.split(";"))):
            name, sep, languages = part.partition("=")
            members = [x.strip() for x in languages.split(",") if x.strip()]
            if not sep or not name.strip() or not members:
                raise ValueError(f"group {part!r} must look like name=lang1,lang2")
            groups[name.strip()] = members
    return groups


# --------------------------------------------------------------------------- SQL aggregation

CONFIG = "target, draft, gamma, temperature"
CONFIG_LABEL = ("concat_ws(' ', coalesce(draft, '?'), 'γ=' || gamma, "
                "'T=' || coalesce(CAST(temperature AS VARCHAR), '-'), '[' || coalesce(target, '?') || ']')")


def _prepare(con) -> None:
    """Tables `units` (per config, language, case: sums paired with that case's AR sums) and `blocks`."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE cases AS
        SELECT {CONFIG}, {CONFIG_LABEL} AS config, device, max_new_tokens, coalesce(is_ar, false) AS is_ar,
               language, unit, run, count(*) AS n, sum(accepted) AS acc, sum(rejected_rounds) AS rej,
               sum(generated_tokens) AS tokens, sum(total_ms) AS ms
        FROM events GROUP BY ALL
    """)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE units AS
        WITH ar AS (
            SELECT target, device, temperature, max_new_tokens, unit, run, sum(tokens) AS ar_tokens, sum(ms) AS ar_ms
            FROM cases WHERE is_ar GROUP BY ALL
        )
        SELECT c.config, any_value(c.is_ar) AS is_ar, c.language, c.unit,
               sum(c.acc) AS acc, sum(c.rej) AS rej,
               sum(CASE WHEN ar.unit IS NOT NULL THEN c.tokens ELSE 0 END) AS sp_tokens,
               sum(CASE WHEN ar.unit IS NOT NULL THEN c.ms ELSE 0 END) AS sp_ms,
               coalesce(sum(ar.ar_tokens), 0) AS ar_tokens, coalesce(sum(ar.ar_ms), 0) AS ar_ms,
               bool_or(ar.unit IS NOT NULL) AS paired
        FROM cases c LEFT JOIN ar
          ON NOT c.is_ar AND ar.unit = c.unit AND ar.target IS NOT DISTINCT FROM c.target
         AND ar.device IS NOT DISTINCT FROM c.device AND ar.temperature IS NOT DISTINCT FROM c.temperature
         AND ar.max_new_tokens IS NOT DISTINCT FROM c.max_new_tokens
         AND ar.run IS NOT DISTINCT FROM c.run  -- a harness run times spec and AR together; pair within it
        GROUP BY c.config, c.language, c.unit
    """)
    # Resampling units: cases, or MAX_BLOCKS hashed blocks of cases in a language that has more.
    # Blocks are named by case, not by position, so configurations over the same cases get the
    # same bootstrap weights (paired differences).
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE blocks AS
        WITH sizes AS (SELECT language, count(DISTINCT unit) AS n_units FROM units GROUP BY language)
        SELECT config, language,
               CASE WHEN n_units <= {MAX_BLOCKS} THEN unit ELSE CAST(hash(unit) % {MAX_BLOCKS} AS VARCHAR) END AS block,
               sum(acc) AS acc, sum(rej) AS rej, sum(sp_tokens) AS sp_tokens, sum(sp_ms) AS sp_ms,
               sum(ar_tokens) AS ar_tokens, sum(ar_ms) AS ar_ms
        FROM units JOIN sizes USING (language) GROUP BY ALL
    """)


def _language_table(con) -> pd.DataFrame:
    rows = con.execute(f"""
        SELECT {CONFIG}, {CONFIG_LABEL} AS config, bool_or(coalesce(is_ar, false)) AS is_ar, language,
               count(*) AS n, count(DISTINCT unit) AS cases,
               sum(accepted) AS accepted, sum(rejected_rounds) AS rejected_rounds, sum(burst_rounds) AS drafting_rounds,
               sum(long_bursts) AS long_bursts, sum(generated_tokens) AS generated_tokens, sum(total_ms) AS total_ms,
               quantile_cont(coalesce(nullif(latency_ms, 0), total_ms), 0.5) AS latency_p50_ms,
               quantile_cont(coalesce(nullif(latency_ms, 0), total_ms), 0.95) AS latency_p95_ms,
               count(*) FILTER (WHERE outcome IN ('accepted', 'partial')) AS user_accepted,
               count(*) FILTER (WHERE outcome IN ('shown', 'accepted', 'partial', 'rejected')) AS user_shown,
               count(*) FILTER (WHERE has_feedback) AS with_feedback
        FROM events GROUP BY ALL ORDER BY config, language
    """).df()
    paired = con.execute("""
        SELECT config, language, count(*) FILTER (WHERE paired) AS paired_cases,
               sum(sp_tokens) AS sp_tokens, sum(sp_ms) AS sp_ms, sum(ar_tokens) AS ar_tokens, sum(ar_ms) AS ar_ms
        FROM units GROUP BY ALL
    """).df()
    df = rows.merge(paired, on=["config", "language"], how="left")
    df["alpha"] = _ratio(df.accepted, df.accepted + df.rejected_rounds)
    df["mean_accepted"] = _ratio(df.accepted, df.drafting_rounds)
    df["p_burst_gt10"] = _ratio(df.long_bursts, df.drafting_rounds)
    df["tokens_per_s"] = _ratio(1000 * df.generated_tokens, df.total_ms)
    df["user_acceptance"] = _ratio(df.user_accepted, df.user_shown).where(df.with_feedback > 0)
    df["speedup"] = _speedup(df.sp_tokens, df.sp_ms, df.ar_tokens, df.ar_ms).where(~df.is_ar)
    return df


def _ratio(num, den):
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / den
    return pd.Series(np.where(den > 0, out, np.nan))


def _speedup(sp_tokens, sp_ms, ar_tokens, ar_ms):
    """(spec tokens/s) / (AR tokens/s), NaN where either side is missing."""
    sp = np.asarray(sp_tokens, dtype=float) / np.where(np.asarray(sp_ms, float) > 0, sp_ms, np.nan)
    ar = np.asarray(ar_tokens, dtype=float) / np.where(np.asarray(ar_ms, float) > 0, ar_ms, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        return pd.Series(np.where(ar > 0, sp / ar, np.nan))


# --------------------------------------------------------------------------- bootstrap


@dataclass
class Replicates:
    """Bootstrap replicates per language of one configuration: arrays of shape (B,)."""
    alpha: dict[str, np.ndarray]
    speedup: dict[str, np.ndarray]


def bootstrap(blocks: pd.DataFrame, reps: int, seed: int) -> dict[str, Replicates]:
    """Poisson bootstrap of cases within each language, `reps` replicates per configuration.

    Each case (or block) gets a Poisson(1) weight per replicate, the standard large-sample stand-in
    for multinomial resampling (Hanley & MacGibbon 2006). The weights belong to the case, not to a
    configuration, so configurations over the same cases are resampled alike: paired differences.
    """
    out: dict[str, Replicates] = {}
    columns = ["acc", "rej", "sp_tokens", "sp_ms", "ar_tokens", "ar_ms"]
    for language, rows in blocks.groupby("language", sort=False):
        codes, names = pd.factorize(rows.block, sort=True)
        rng = np.random.default_rng([seed, zlib.crc32(language.encode())])
        weights = rng.poisson(1.0, size=(reps, len(names))).astype(float)
        values = rows[columns].to_numpy(dtype=float)
        for config, index in rows.groupby("config", sort=False).indices.items():
            sums = weights[:, codes[index]] @ values[index]  # (reps, 6)
            replicates = out.setdefault(config, Replicates({}, {}))
            with np.errstate(divide="ignore", invalid="ignore"):
                replicates.alpha[language] = sums[:, 0] / (sums[:, 0] + sums[:, 1])
                replicates.speedup[language] = (sums[:, 2] / sums[:, 3]) / (sums[:, 4] / sums[:, 5])
    return out


def ci(samples: np.ndarray) -> tuple[float | None, float | None]:
    samples = samples[np.isfinite(samples)]
    if len(samples) == 0:
        return None, None
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return float(lo), float(hi)


# --------------------------------------------------------------------------- disparity


def mean_abs_dev(values: np.ndarray, axis=-1) -> np.ndarray:
    return np.mean(np.abs(values - np.mean(values, axis=axis, keepdims=True)), axis=axis)


def coefficient_of_variation(values: np.ndarray, axis=-1) -> np.ndarray:
    """Population std / mean (ddof = 0), across languages."""
    return np.std(values, axis=axis) / np.mean(values, axis=axis)


def _group_members(groups: dict[str, list[str]], languages: list[str]) -> dict[str, list[str]]:
    members = {name: [lang for lang in langs if lang in languages] for name, langs in groups.items()}
    members[ALL_CODE] = [lang for lang in languages if lang != NATURAL_LANGUAGE]
    return members


def disparity(langs: pd.DataFrame, replicates: dict[str, Replicates], groups: dict[str, list[str]]) -> pd.DataFrame:
    """Per configuration and group: U (and U_std), max/min speedup and CV of speedup, with 95% CIs."""
    rows = []
    for config, frame in langs[~langs.is_ar].groupby("config", sort=False):
        point_alpha = dict(zip(frame.language, frame.alpha))
        point_speedup = dict(zip(frame.language, frame.speedup))
        reps = replicates[config]
        for group, members in _group_members(groups, list(frame.language)).items():
            with_alpha = [m for m in members if np.isfinite(point_alpha[m])]
            with_speedup = [m for m in members if np.isfinite(point_speedup[m])]
            row = {"config": config, **_config_columns(frame), "group": group,
                   "languages": len(members), "language_list": ",".join(members)}
            row |= _stat("U", mean_abs_dev, with_alpha, point_alpha, reps.alpha)
            row |= _stat("U_std", np.std, with_alpha, point_alpha, reps.alpha)
            row |= _stat("alpha_min", np.min, with_alpha, point_alpha, reps.alpha, minimum=1)
            row |= _stat("alpha_max", np.max, with_alpha, point_alpha, reps.alpha, minimum=1)
            row |= _stat("speedup_min", np.min, with_speedup, point_speedup, reps.speedup, minimum=1)
            row |= _stat("speedup_max", np.max, with_speedup, point_speedup, reps.speedup, minimum=1)
            row |= _stat("speedup_cv", coefficient_of_variation, with_speedup, point_speedup, reps.speedup)
            if with_speedup:
                row["slowest"] = min(with_speedup, key=point_speedup.get)
                row["fastest"] = max(with_speedup, key=point_speedup.get)
            rows.append(row)
    return pd.DataFrame(rows)


def _stat(name, fn, members, point, replicates, minimum: int = 2) -> dict:
    """fn over the members' point values, and its 95% CI over the bootstrap replicates."""
    if len(members) < minimum:
        return {name: None, f"{name}_lo": None, f"{name}_hi": None}
    value = float(fn(np.array([point[m] for m in members])))
    lo, hi = ci(fn(np.stack([replicates[m] for m in members], axis=-1), axis=-1))
    return {name: value, f"{name}_lo": lo, f"{name}_hi": hi}


def _config_columns(frame: pd.DataFrame) -> dict:
    first = frame.iloc[0]
    return {"target": first.target, "draft": first.draft, "gamma": first.gamma, "temperature": first.temperature}


def pick_drafts(langs: pd.DataFrame, events_first_seen: dict[str, float], base: str | None) -> tuple[str, str] | None:
    """(base, tuned) draft names when exactly two drafts (besides AR) are present, or base names one of them."""
    drafts = sorted(set(langs.loc[~langs.is_ar, "draft"].dropna()), key=lambda d: events_first_seen.get(d, 0))
    if base is not None:
        others = [d for d in drafts if d != base]
        if base not in drafts or len(others) != 1:
            raise ValueError(f"--base {base!r}: need it and exactly one other draft, found {drafts}")
        return base, others[0]
    return (drafts[0], drafts[1]) if len(drafts) == 2 else None


def delta_disparity(disp: pd.DataFrame, replicates_u: dict, pair: tuple[str, str]) -> pd.DataFrame:
    """Base vs tuned U per group, for each (target, γ, T) both drafts were run with."""
    base, tuned = pair
    rows = []
    keyed = disp.set_index(["draft", "target", "gamma", "temperature", "group"], drop=False)
    for (_, target, gamma, temperature, group), b in keyed.loc[keyed.draft == base].iterrows():
        key = (tuned, target, gamma, temperature, group)
        if key not in keyed.index:
            continue
        t = keyed.loc[key]
        row = {"target": target, "gamma": gamma, "temperature": temperature, "group": group,
               "languages": b.languages, "base": base, "tuned": tuned,
               "U_base": b.U, "U_tuned": t.U, "speedup_cv_base": b.speedup_cv, "speedup_cv_tuned": t.speedup_cv}
        if b.U is not None and t.U is not None and pd.notna(b.U) and pd.notna(t.U):
            row["delta_U"] = t.U - b.U
            row["delta_U_pct"] = 100 * (t.U - b.U) / b.U if b.U else None
            diffs = replicates_u.get((t.config, group), np.array([])) - replicates_u.get((b.config, group), np.array([]))
            row["delta_U_lo"], row["delta_U_hi"] = ci(diffs) if len(diffs) else (None, None)
        rows.append(row)
    return pd.DataFrame(rows)


def _u_replicates(langs, replicates, groups) -> dict:
    """(config, group) -> U bootstrap replicates, for paired Δ U intervals."""
    out = {}
    for config, frame in langs[~langs.is_ar].groupby("config", sort=False):
        point = dict(zip(frame.language, frame.alpha))
        for group, members in _group_members(groups, list(frame.language)).items():
            members = [m for m in members if np.isfinite(point[m])]
            if len(members) >= 2:
                out[(config, group)] = mean_abs_dev(np.stack([replicates[config].alpha[m] for m in members], axis=-1))
    return out


# --------------------------------------------------------------------------- RQ1 and RQ3


def pooled(con, where: str, by: dict[str, str]) -> pd.DataFrame:
    """α̂, burst stats, tokens/s and paired speedup pooled over the events matching `where`, grouped
    by `by` (column name -> SQL expression)."""
    keys = list(by)
    by = ", ".join(f"{expr} AS {name}" for name, expr in by.items())
    stats = con.execute(f"""
        SELECT {by}, count(*) AS n, sum(accepted) AS accepted, sum(rejected_rounds) AS rejected_rounds,
               sum(burst_rounds) AS drafting_rounds, sum(long_bursts) AS long_bursts,
               sum(generated_tokens) AS generated_tokens, sum(total_ms) AS total_ms
        FROM events WHERE NOT coalesce(is_ar, false) AND ({where}) GROUP BY ALL ORDER BY ALL
    """).df()
    paired = con.execute(f"""
        SELECT {by}, sum(sp_tokens) AS sp_tokens, sum(sp_ms) AS sp_ms, sum(ar_tokens) AS ar_tokens,
               sum(ar_ms) AS ar_ms, count(*) FILTER (WHERE paired) AS paired_cases
        FROM units u JOIN (SELECT DISTINCT {CONFIG_LABEL} AS config, {CONFIG} FROM events) USING (config)
        WHERE NOT u.is_ar AND ({where}) GROUP BY ALL
    """).df()
    df = stats.merge(paired, on=keys, how="left")
    df["alpha"] = _ratio(df.accepted, df.accepted + df.rejected_rounds)
    df["mean_burst"] = _ratio(df.accepted, df.drafting_rounds)
    df["p_burst_gt10"] = _ratio(df.long_bursts, df.drafting_rounds)
    df["tokens_per_s"] = _ratio(1000 * df.generated_tokens, df.total_ms)
    df["speedup"] = _speedup(df.sp_tokens, df.sp_ms, df.ar_tokens, df.ar_ms)
    return df


def rq1(con, pair: tuple[str, str]) -> pd.DataFrame:
    """Base vs tuned draft on code and on natural language, per (target, γ, T)."""
    drafts = ", ".join(f"'{d}'" for d in (_sql_text(pair[0]), _sql_text(pair[1])))
    domain = f"CASE WHEN language = '{NATURAL_LANGUAGE}' THEN 'natural language' ELSE 'code' END"
    df = pooled(con, f"draft IN ({drafts})", {"target": "target", "gamma": "gamma", "temperature": "temperature",
                                               "draft": "draft", "domain": domain})
    df["role"] = np.where(df.draft == pair[0], "base", "tuned")
    return df


def rq3(con, by_language: bool = False) -> pd.DataFrame:
    """The fixed-γ sweep: burst length, P(burst > 10), acceptance and speedup per (draft, T, γ)."""
    gammas = ", ".join(f"'{g}'" for g in RQ3_GAMMAS)
    by = {"target": "target", "draft": "draft", "temperature": "temperature", "gamma": "CAST(gamma AS INTEGER)"}
    if by_language:
        by["language"] = "language"
    return pooled(con, f"gamma IN ({gammas})", by)


def _sql_text(value: str) -> str:
    return value.replace("'", "''")


# --------------------------------------------------------------------------- plots


def _plots(out: Path, langs: pd.DataFrame, rq3_table: pd.DataFrame, groups: dict, max_configs: int) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    group_of = {lang: g for g, members in groups.items() for lang in members}
    order = [lang for members in groups.values() for lang in members]
    spec = langs[~langs.is_ar]
    configs = list(spec.groupby("config").n.sum().sort_values(ascending=False).index[:max_configs])
    for column, ylabel, name in (("alpha", "per-token acceptance α̂", "alpha_by_language.png"),
                                 ("speedup", "speedup vs AR", "speedup_by_language.png")):
        data = spec[spec.config.isin(configs) & spec[column].notna()]
        if data.empty:
            continue
        languages = sorted(set(data.language), key=lambda x: (order.index(x) if x in order else len(order), x))
        fig, ax = plt.subplots(figsize=(min(16, max(6, 0.35 * len(languages) * len(configs))), 4.5))
        width = 0.8 / len(configs)
        for i, config in enumerate(configs):
            rows = data[data.config == config].set_index("language").reindex(languages)
            ax.bar(np.arange(len(languages)) + i * width - 0.4 + width / 2, rows[column], width, label=config)
        ax.set_xticks(np.arange(len(languages)))
        ax.set_xticklabels([f"{lang}\n({group_of.get(lang, '-')})" for lang in languages], fontsize=8)
        ax.set_ylabel(ylabel)
        if column == "speedup":
            ax.axhline(1.0, color="black", linewidth=0.8)
        ax.legend(fontsize=7)
        ax.set_title(f"{ylabel} by language")
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)

    sweep = rq3_table[rq3_table.speedup.notna() & rq3_table.temperature.notna()]
    if not sweep.empty:
        drafts = sorted(sweep.draft.unique())
        fig, axes = plt.subplots(1, len(drafts), figsize=(5.5 * len(drafts), 4), squeeze=False)
        for ax, draft in zip(axes[0], drafts):
            grid = sweep[sweep.draft == draft].pivot_table(index="temperature", columns="gamma", values="speedup")
            image = ax.imshow(grid.to_numpy(), cmap="viridis", aspect="auto", origin="lower")
            ax.set_xticks(range(len(grid.columns)), [str(g) for g in grid.columns])
            ax.set_yticks(range(len(grid.index)), [f"{t:g}" for t in grid.index])
            for (i, j), value in np.ndenumerate(grid.to_numpy()):
                if np.isfinite(value):
                    ax.text(j, i, f"{value:.2f}", ha="center", va="center", color="white", fontsize=8)
            ax.set_xlabel("γ")
            ax.set_ylabel("temperature")
            ax.set_title(f"speedup vs AR, draft {draft}")
            fig.colorbar(image, ax=ax)
        fig.tight_layout()
        fig.savefig(out / "rq3_speedup_heatmap.png", dpi=110)
        plt.close(fig)
        written.append("rq3_speedup_heatmap.png")

    bursts = rq3_table[rq3_table.mean_burst.notna()]
    if not bursts.empty:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for (draft, temperature), rows in bursts.groupby(["draft", "temperature"], dropna=False):
            rows = rows.sort_values("gamma")
            label = f"{draft} T={temperature:g}" if pd.notna(temperature) else draft
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


# --------------------------------------------------------------------------- the report


def _md_table(df: pd.DataFrame, columns: list[tuple[str, str]], cis: dict[str, str] | None = None) -> str:
    """Markdown table; `cis` maps a column to the prefix of its _lo/_hi CI columns."""
    cis = cis or {}
    lines = ["| " + " | ".join(title for _, title in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for _, row in df.iterrows():
        cells = []
        for column, _ in columns:
            cell = _fmt(row.get(column))
            if column in cis and _fmt(row.get(f"{cis[column]}_lo")) != "–":
                cell += f" [{_fmt(row.get(cis[column] + '_lo'))}, {_fmt(row.get(cis[column] + '_hi'))}]"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)) or value is pd.NA:
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def _records(df: pd.DataFrame) -> list[dict]:
    return json.loads(df.to_json(orient="records")) if len(df) else []


def build_report(paths: list[str], out: str | Path, groups: dict[str, list[str]] | None = None,
                 base_draft: str | None = None, reps: int = 1000, seed: int = 0,
                 max_plot_configs: int = 6, command: str | None = None) -> dict:
    """Read events, write report.md, report.json, CSV tables and PNG plots into `out`; return the JSON."""
    groups = groups or parse_groups(None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    con = connect(paths, columns=REPORT_COLUMNS)
    n_events = con.execute("SELECT count(*) FROM events").fetchone()[0]
    if not n_events:
        raise ValueError("no completion events in " + ", ".join(map(str, paths)))
    _prepare(con)
    langs = _language_table(con)
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
    delta = delta_disparity(disp, _u_replicates(langs, replicates, groups), pair) if pair and len(disp) else pd.DataFrame()
    rq1_table = rq1(con, pair) if pair else pd.DataFrame()
    rq3_table = rq3(con)
    rq3_langs = rq3(con, by_language=True)

    tables = {"languages": langs.drop(columns=["sp_tokens", "sp_ms", "ar_tokens", "ar_ms"]), "disparity": disp,
              "delta_disparity": delta, "rq1": rq1_table, "rq3": rq3_table, "rq3_by_language": rq3_langs}
    for name, table in tables.items():
        if len(table):
            table.to_csv(out / f"{name}.csv", index=False)
    plots = _plots(out, langs, rq3_table, groups, max_plot_configs)
    data = {
        "events": int(n_events),
        "files": [str(p) for p in paths],
        "command": command,
        "groups": groups,
        "definitions": {"U": U_DEFINITION, "alpha": "Σ accepted / (Σ accepted + Σ rejected_rounds)",
                        "speedup": "spec tokens/s ÷ AR tokens/s over cases with both (same target, device, T, max_new_tokens)",
                        "bootstrap": f"{reps} Poisson-bootstrap resamples of cases within each language; "
                                     "95% percentile intervals"},
        "base_tuned": list(pair) if pair else None,
        "plots": plots,
        **{name: _records(table) for name, table in tables.items()},
    }
    (out / "report.json").write_text(json.dumps(data, indent=1, ensure_ascii=False))
    (out / "report.md").write_text(_markdown(data, tables, groups, pair, plots, reps))
    return data


def _markdown(data, tables, groups, pair, plots, reps) -> str:
    langs, disp = tables["languages"], tables["disparity"]
    md = ["# Speculative decoding report", "",
          f"{data['events']} completion events from {len(data['files'])} input(s)."
          + (f" Reproduce: `{data['command']}`." if data["command"] else ""), "",
          "Definitions: α̂ = Σ accepted / (Σ accepted + Σ rejected rounds) (per-token acceptance; "
          "accepted/drafted is not α). Mean accepted length = accepted drafts per drafting round. "
          "Speedup = spec tokens/s ÷ AR tokens/s over the cases that have AR events with the same target, "
          "device, temperature and max_new_tokens. User acceptance = (accepted + partial) / shown, only where "
          f"outcome records exist. Brackets: bootstrap 95% CIs, {reps} Poisson-bootstrap resamples of cases within each language.",
          "", "Groups: " + "; ".join(f"{g} = {', '.join(m)}" for g, m in groups.items())
          + f"; {ALL_CODE} = every language except '{NATURAL_LANGUAGE}'.", ""]
    spec_configs = langs[~langs.is_ar].groupby("config", sort=False).n.sum().sort_values(ascending=False)
    shown = list(spec_configs.index[:6])
    md += ["## Per language", ""]
    for config in shown + [c for c in langs[langs.is_ar].config.unique()]:
        md += [f"### {config}", "", _md_table(langs[langs.config == config], [
            ("language", "language"), ("group", "group"), ("n", "n"), ("cases", "cases"), ("alpha", "α̂"),
            ("mean_accepted", "acc/round"), ("tokens_per_s", "tok/s"), ("latency_p50_ms", "p50 ms"),
            ("latency_p95_ms", "p95 ms"), ("user_acceptance", "user acc."), ("speedup", "speedup")],
            cis={"alpha": "alpha", "speedup": "speedup"}), ""]
    if len(spec_configs) > len(shown):
        md += [f"{len(spec_configs) - len(shown)} more configurations are in languages.csv.", ""]
    md += ["## Disparity across languages", "", U_DEFINITION, "",
           "Max/min speedup are the extremes of per-language speedup; CV = population std / mean of "
           "per-language speedup. A group needs two languages for U and CV.", ""]
    for config in shown:
        rows = disp[disp.config == config]
        if len(rows):
            md += [f"### {config}", "", _md_table(rows, [
                ("group", "group"), ("languages", "langs"), ("U", "U (MAD of α̂)"), ("U_std", "U_std"),
                ("alpha_min", "min α̂"), ("alpha_max", "max α̂"), ("speedup_min", "min speedup"),
                ("speedup_max", "max speedup"), ("speedup_cv", "CV speedup"), ("slowest", "slowest"),
                ("fastest", "fastest")], cis={"U": "U", "speedup_min": "speedup_min", "speedup_max": "speedup_max",
                                              "speedup_cv": "speedup_cv"}), ""]
    if pair:
        md += ["## Δ disparity: base vs tuned draft", "",
               f"Base = `{pair[0]}`, tuned = `{pair[1]}` (the draft seen first is the base; `--base` picks it). "
               "ΔU = U_tuned − U_base; negative is fairer. Its CI comes from paired resamples of the same cases.", ""]
        if len(tables["delta_disparity"]):
            md += [_md_table(tables["delta_disparity"], [
                ("gamma", "γ"), ("temperature", "T"), ("group", "group"), ("languages", "langs"),
                ("U_base", "U base"), ("U_tuned", "U tuned"), ("delta_U", "ΔU"), ("delta_U_pct", "ΔU %"),
                ("speedup_cv_base", "CV base"), ("speedup_cv_tuned", "CV tuned")], cis={"delta_U": "delta_U"}), ""]
        md += ["## RQ1: base vs tuned draft, code vs natural language", "", _md_table(tables["rq1"], [
            ("gamma", "γ"), ("temperature", "T"), ("role", "role"), ("draft", "draft"), ("domain", "domain"),
            ("n", "n"), ("alpha", "α̂"), ("mean_burst", "acc/round"), ("speedup", "speedup")]), ""]
    if len(tables["rq3"]):
        md += ["## RQ3: γ sweep", "",
               f"Fixed γ ∈ {{{', '.join(map(str, RQ3_GAMMAS))}}}, pooled over languages. Burst = accepted drafts in a "
               f"drafting round; P(burst > {LONG_BURST}) from the accepted histograms.", "",
               _md_table(tables["rq3"], [("draft", "draft"), ("temperature", "T"), ("gamma", "γ"), ("n", "n"),
                                         ("alpha", "α̂"), ("mean_burst", "mean burst"), ("p_burst_gt10", "P(burst>10)"),
                                         ("tokens_per_s", "tok/s"), ("speedup", "speedup")]), ""]
    md += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    return "\n".join(md)
