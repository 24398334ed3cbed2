"""The report's aggregations over the `events` table of read.connect: per-language rows, the
per-case sums the bootstrap resamples, and the pooled RQ1 / RQ3 rows.

DuckDB sums the counts and pairs each case's runs with its AR run (pairing.py); the ratios and percentiles
made of those sums are speccomplete.metrics's (α̂, τ, speed-up, latency percentiles), applied per row in
Python: one row per configuration and language.

Every row and pooled group is split by decode backend (local, llamacpp, openai), so two backends never
share a number. Each acceptance number is summed over the events whose `draft_counts` carry it: α̂, τ
and the burst statistics over "rounds" events only (they need every drafting round), accepted/drafted
over "rounds" and "totals" events (llama.cpp reports draft_n and draft_n_accepted per request), and
neither over "unreported" ones (vLLM reports no draft counts). Speed and user acceptance use every event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from speccomplete.metrics import acceptance_rate, mean_accepted_length, percentile, speedup

from .groups import NATURAL_LANGUAGE
from .pairing import pair_with_ar

MAX_BLOCKS = 2000  # above this many cases in a language, cases are resampled in hashed blocks
RQ3_GAMMAS = (1, 2, 4, 8, 16, 32)
# The event fields the report reads (read.connect adds the ones every query needs).
REPORT_COLUMNS = [
    "language",
    "generated_tokens",
    "drafted",
    "accepted",
    "rejected_rounds",
    "prefill_ms",
    "total_ms",
    "latency_ms",
    "multiline",
    "stage",
    "debounce_ms",
    "target",
    "device",
    "backend",
    "draft_counts",
]

# A configuration is (target, draft, γ policy, temperature, backend); CONFIG_LABEL names one in tables
# and plots, and is the key the bootstrap groups by, so it names the backend (all but our own, local,
# whose labels stay as they were before backends existed).
CONFIG = "target, draft, gamma, temperature, backend"
CONFIG_LABEL = (
    "concat_ws(' ', coalesce(draft, '?'), 'γ=' || gamma, "
    "'T=' || coalesce(CAST(temperature AS VARCHAR), '-'), '[' || coalesce(target, '?') || ']', "
    "'via ' || nullif(backend, 'local'))"
)
# Which events carry which counts (events.DraftCounts).
ROUNDS = "draft_counts = 'rounds'"
COUNTED = "draft_counts IN ('rounds', 'totals')"
# The draft counts of a row or pooled group, each summed over the events that report it. round_accepted
# (accepted over "rounds" events) is α̂'s and τ's numerator; `accepted` also holds the totals-only events.
COUNT_SUMS = f"""
    count(*) FILTER (WHERE {ROUNDS}) AS n_rounds, count(*) FILTER (WHERE draft_counts = 'totals') AS n_totals,
    string_agg(DISTINCT draft_counts, '+' ORDER BY draft_counts) AS draft_counts,
    sum(drafted) FILTER (WHERE {COUNTED}) AS drafted, sum(accepted) FILTER (WHERE {COUNTED}) AS accepted,
    sum(accepted) FILTER (WHERE {ROUNDS}) AS round_accepted,
    sum(rejected_rounds) FILTER (WHERE {ROUNDS}) AS rejected_rounds,
    sum(burst_rounds) FILTER (WHERE {ROUNDS}) AS drafting_rounds,
    sum(long_bursts) FILTER (WHERE {ROUNDS}) AS long_bursts
"""
# End-to-end latency where the producer measured it, else the decoder's time.
LATENCY = "coalesce(nullif(latency_ms, 0), total_ms)"


def prepare(con) -> None:
    """Tables `units` (per config, language, case: sums paired with that case's AR sums, pairing.py) and `blocks`."""
    # α̂'s counts come from "rounds" events only
    counts = {
        "acc": f"coalesce(sum(accepted) FILTER (WHERE {ROUNDS}), 0)",
        "rej": f"coalesce(sum(rejected_rounds) FILTER (WHERE {ROUNDS}), 0)",
    }
    pair_with_ar(con, CONFIG_LABEL, counts)
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


def language_table(con) -> pd.DataFrame:
    """One row per configuration and language: counts, α̂, τ, accepted/drafted, tokens/s, latency
    percentiles, user acceptance and paired speedup. Needs `prepare`."""
    rows = con.execute(f"""
        SELECT {CONFIG}, {CONFIG_LABEL} AS config, bool_or(coalesce(is_ar, false)) AS is_ar, language,
               count(*) AS n, count(DISTINCT unit) AS cases, {COUNT_SUMS},
               sum(generated_tokens) AS generated_tokens, sum(total_ms) AS total_ms,
               count(*) FILTER (WHERE outcome IN ('accepted', 'partial')) AS user_accepted,
               count(*) FILTER (WHERE outcome IN ('shown', 'accepted', 'partial', 'rejected')) AS user_shown,
               count(*) FILTER (WHERE has_feedback) AS with_feedback
        FROM events GROUP BY ALL ORDER BY config, language
    """).df()
    # Sorted in DuckDB, so metrics.percentile's sort is one linear pass over each group.
    latencies = con.execute(f"""
        SELECT {CONFIG_LABEL} AS config, language,
               list({LATENCY} ORDER BY {LATENCY}) FILTER (WHERE {LATENCY} IS NOT NULL)
        FROM events GROUP BY ALL
    """).fetchall()
    latency = pd.DataFrame(
        [
            (config, language, percentile(values or [], 50), percentile(values or [], 95))
            for config, language, values in latencies
        ],
        columns=["config", "language", "latency_p50_ms", "latency_p95_ms"],
    ).astype({"latency_p50_ms": float, "latency_p95_ms": float})
    paired = con.execute("""
        SELECT config, language, count(*) FILTER (WHERE paired) AS paired_cases,
               sum(sp_tokens) AS sp_tokens, sum(sp_ms) AS sp_ms, sum(ar_tokens) AS ar_tokens, sum(ar_ms) AS ar_ms
        FROM units GROUP BY ALL
    """).df()
    latency_at = rows.columns.get_loc("total_ms") + 1
    df = rows.merge(latency, on=["config", "language"], how="left")
    df = df[[*rows.columns[:latency_at], "latency_p50_ms", "latency_p95_ms", *rows.columns[latency_at:]]]
    df = df.merge(paired, on=["config", "language"], how="left")
    acceptance(df, "mean_accepted")
    df["tokens_per_s"] = ratio(1000 * df.generated_tokens, df.total_ms)
    df["user_acceptance"] = ratio(df.user_accepted, df.user_shown).where(df.with_feedback > 0)
    df["speedup"] = per_row(speedup, df.sp_tokens, df.sp_ms, df.ar_tokens, df.ar_ms).where(~df.is_ar)
    return df


# What an answer was, for the wait per stage: a single line, or a block whole, its first lines (answered at
# the block's time budget) or its next lines after those were taken.
ANSWER_KIND = """CASE WHEN NOT coalesce(multiline, false) THEN 'single line'
    WHEN stage = 'first' THEN 'block, first lines' WHEN stage = 'continued' THEN 'block, next lines'
    ELSE 'block, whole' END"""


def stage_table(con) -> pd.DataFrame:
    """One row per configuration and kind of answer (ANSWER_KIND), answered ones only: the server's wait for
    more typing (debounce) and its latency after it, p50 and p95, and their sum's p50: the wait from the last
    key that the server accounts for."""
    rows = con.execute(f"""
        SELECT {CONFIG_LABEL} AS config, {ANSWER_KIND} AS answer, count(*) AS n,
               list(coalesce(debounce_ms, 0) ORDER BY coalesce(debounce_ms, 0)) AS debounces,
               list({LATENCY} ORDER BY {LATENCY}) AS latencies,
               list(coalesce(debounce_ms, 0) + {LATENCY} ORDER BY coalesce(debounce_ms, 0) + {LATENCY}) AS waits
        FROM events WHERE outcome <> 'cancelled' AND {LATENCY} IS NOT NULL GROUP BY ALL ORDER BY config, answer
    """).fetchall()
    return pd.DataFrame(
        [
            (
                config,
                answer,
                n,
                percentile(debounces, 50),
                percentile(latencies, 50),
                percentile(latencies, 95),
                percentile(waits, 50),
                percentile(waits, 95),
            )
            for config, answer, n, debounces, latencies, waits in rows
        ],
        columns=[
            "config",
            "answer",
            "n",
            "debounce_p50_ms",
            "latency_p50_ms",
            "latency_p95_ms",
            "wait_p50_ms",
            "wait_p95_ms",
        ],
    )


def pooled(con, where: str, by: dict[str, str]) -> pd.DataFrame:
    """α̂, burst stats, accepted/drafted, tokens/s and paired speedup pooled over the events matching
    `where`, grouped by backend and `by` (column name -> SQL expression). Needs `prepare`."""
    by = {"backend": "backend", **by}  # whatever else a caller groups by, backends are never pooled
    keys = list(by)
    select = ", ".join(f"{expr} AS {name}" for name, expr in by.items())
    stats = con.execute(f"""
        SELECT {select}, count(*) AS n, {COUNT_SUMS},
               sum(generated_tokens) AS generated_tokens, sum(total_ms) AS total_ms
        FROM events WHERE NOT coalesce(is_ar, false) AND ({where}) GROUP BY ALL ORDER BY ALL
    """).df()
    paired = con.execute(f"""
        SELECT {select}, sum(sp_tokens) AS sp_tokens, sum(sp_ms) AS sp_ms, sum(ar_tokens) AS ar_tokens,
               sum(ar_ms) AS ar_ms, count(*) FILTER (WHERE paired) AS paired_cases
        FROM units u JOIN (SELECT DISTINCT {CONFIG_LABEL} AS config, {CONFIG} FROM events) USING (config)
        WHERE NOT u.is_ar AND ({where}) GROUP BY ALL
    """).df()
    df = stats.merge(paired, on=keys, how="left")
    acceptance(df, "mean_burst")
    df["tokens_per_s"] = ratio(1000 * df.generated_tokens, df.total_ms)
    df["speedup"] = per_row(speedup, df.sp_tokens, df.sp_ms, df.ar_tokens, df.ar_ms)
    return df


def rq1(con, pair: tuple[str, str]) -> pd.DataFrame:
    """Base vs tuned draft on code and on natural language, per (target, γ, T)."""
    drafts = ", ".join(f"'{d}'" for d in (_sql_text(pair[0]), _sql_text(pair[1])))
    domain = f"CASE WHEN language = '{NATURAL_LANGUAGE}' THEN 'natural language' ELSE 'code' END"
    df = pooled(
        con,
        f"draft IN ({drafts})",
        {"target": "target", "gamma": "gamma", "temperature": "temperature", "draft": "draft", "domain": domain},
    )
    df["role"] = np.where(df.draft == pair[0], "base", "tuned")
    return df


def rq3(con, by_language: bool = False) -> pd.DataFrame:
    """The fixed-γ sweep: burst length, P(burst > 10), acceptance and speedup per (draft, T, γ)."""
    gammas = ", ".join(f"'{g}'" for g in RQ3_GAMMAS)
    by = {"target": "target", "draft": "draft", "temperature": "temperature", "gamma": "CAST(gamma AS INTEGER)"}
    if by_language:
        by["language"] = "language"
    return pooled(con, f"gamma IN ({gammas})", by)


def acceptance(df: pd.DataFrame, tau: str) -> None:
    """Add alpha (α̂), `tau` (τ), p_burst_gt10 and accepted_per_drafted to rows of COUNT_SUMS, and drop
    round_accepted. α̂ and τ are NaN where no event recorded its rounds (llama.cpp, vLLM): α̂ is not
    accepted/drafted, which is its own column, NaN where no event reported even totals."""
    df["alpha"] = per_row(acceptance_rate, df.round_accepted.fillna(0), df.rejected_rounds.fillna(0))
    df[tau] = per_row(mean_accepted_length, df.round_accepted.fillna(0), df.drafting_rounds.fillna(0))
    df["p_burst_gt10"] = ratio(df.long_bursts, df.drafting_rounds)
    df["accepted_per_drafted"] = ratio(df.accepted, df.drafted)
    del df["round_accepted"]


def per_row(formula: Callable[..., float | None], *columns: Iterable) -> pd.Series:
    """A speccomplete.metrics formula applied to each row's sums; its None (nothing to divide) is NaN."""
    return pd.Series([formula(*values) for values in zip(*columns)], dtype=float)


def ratio(num, den) -> pd.Series:
    """num / den, NaN where den is not positive."""
    num = np.asarray(num, dtype=float)
    den = np.asarray(den, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = num / den
    return pd.Series(np.where(den > 0, out, np.nan))


def _sql_text(value: str) -> str:
    return value.replace("'", "''")
