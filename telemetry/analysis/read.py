"""Read event files into DuckDB, for the report's aggregations.

Many files and globs are read in one pass by DuckDB's JSON reader. A line that is not a
complete JSON object (a line torn by a crash) becomes a row of NULLs, which is dropped with
a warning naming its file; every other line is kept. Outcome records are joined onto their
event: the latest outcome per request_id wins.
"""

from __future__ import annotations

import glob
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import duckdb

from ..log import rotated_paths

LONG_BURST = 10  # a drafting round that accepted more than this many drafts is a long burst

# Columns read from every line; keys a newer writer adds are ignored, missing ones are NULL (or DEFAULTS).
COLUMNS = {
    "schema": "INTEGER",
    "record": "VARCHAR",
    "time": "DOUBLE",
    "request_id": "VARCHAR",
    "language": "VARCHAR",
    "trigger": "VARCHAR",
    "multiline": "BOOLEAN",
    "prompt_tokens": "BIGINT",
    "prompt_truncated_tokens": "BIGINT",
    "prompt_reused_tokens": "BIGINT",
    "generated_tokens": "BIGINT",
    "drafted": "BIGINT",
    "accepted": "BIGINT",
    "rounds": "BIGINT",
    "rejected_rounds": "BIGINT",
    "lookup_drafted": "BIGINT",
    "lookup_accepted": "BIGINT",
    "lookup_rejected_rounds": "BIGINT",
    "gammas": "BIGINT[]",
    "accepted_histogram": "BIGINT[]",
    "draft_ms": "DOUBLE",
    "verify_ms": "DOUBLE",
    "prefill_ms": "DOUBLE",
    "total_ms": "DOUBLE",
    "ttft_ms": "DOUBLE",
    "latency_ms": "DOUBLE",
    "finish_reason": "VARCHAR",
    "target": "VARCHAR",
    "draft": "VARCHAR",
    "device": "VARCHAR",
    "backend": "VARCHAR",
    "draft_counts": "VARCHAR",
    "settings": "JSON",
    "outcome": "VARCHAR",
    "accepted_chars": "BIGINT",
    "stage": "VARCHAR",
    "debounce_ms": "DOUBLE",
    "case_id": "VARCHAR",
    "source": "VARCHAR",
    "text": "VARCHAR",
}


# What a field missing from a line means: files written before the field existed hold events of
# that default (our own decoder, every round recorded), as CompletionEvent's defaults say. Before
# lookup_rejected_rounds was a field, `specdec study` kept it in the event's settings.
DEFAULTS = {
    "backend": "'local'",
    "draft_counts": "'rounds'",
    "lookup_rejected_rounds": "TRY_CAST(settings->>'lookup_rejected_rounds' AS BIGINT), 0",
}
# Every row and group is split by these, so a query never pools two backends: always read.
ALWAYS = {"backend", "draft_counts"}


class UnreadableLineWarning(UserWarning):
    """A line that is not a JSON object was skipped (usually the last line, torn by a crash)."""


def expand_paths(paths: Sequence[str | Path]) -> list[str]:
    """Files, globs and directories (all *.jsonl inside); a file brings its rotated siblings along."""
    found: list[str] = []
    for item in paths:
        item = os.path.expanduser(str(item))
        if os.path.isdir(item):
            matches = sorted(glob.glob(os.path.join(item, "*.jsonl")))
        elif glob.has_magic(item):
            matches = sorted(glob.glob(item))
        else:
            if not os.path.exists(item) and not rotated_paths(item):
                raise FileNotFoundError(f"no such events file: {item}")
            matches = [str(p) for p in rotated_paths(item)] + ([item] if os.path.exists(item) else [])
        found.extend(matches)
    unique = list(dict.fromkeys(os.path.abspath(p) for p in found))
    if not unique:
        raise FileNotFoundError(f"no events files match {', '.join(map(str, paths))}")
    return unique


def connect(
    paths: Sequence[str | Path], columns: list[str] | None = None, con: duckdb.DuckDBPyConnection | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection holding table `events`: one row per completion, latest outcome joined.

    Derived columns: gamma (the settings' gamma policy, as text), temperature, max_new_tokens,
    is_ar (draft "none" or gamma "0"), run (the settings' run id, where a harness sets one), unit
    (case_id, or request_id for editor events: the bootstrap's resampling unit), has_feedback (an
    outcome record exists), and burst_rounds / long_bursts (drafting rounds, and those that accepted
    more than LONG_BURST drafts: histogram entry n counts the rounds that accepted n, and DuckDB
    lists count from 1, so those rounds start at list index LONG_BURST + 2). `columns` limits the
    event fields read (the report skips the long `gammas` lists and `text`); `backend` and
    `draft_counts` are always read, and lines written before those fields existed get
    CompletionEvent's defaults (local, rounds).
    """
    files = expand_paths(paths)
    con = con or duckdb.connect()
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")
    keep = set(columns or COLUMNS) | {"schema", "time", "request_id", "outcome", "accepted_chars", "draft", "case_id"}
    keep |= ALWAYS
    read = keep | {"record", "settings", "accepted_histogram"}
    spec = "{" + ", ".join(f"'{k}': '{v}'" for k, v in COLUMNS.items() if k in read) + "}"
    # Derived columns are computed while reading, so the wide settings and histogram columns
    # are only materialized when asked for.
    con.execute(
        f"""
        CREATE OR REPLACE TEMP TABLE raw AS
        SELECT {", ".join(_select(k) for k in COLUMNS if k in keep and k != "record")}, record, filename,
               coalesce(settings->>'gamma', '') AS gamma,
               TRY_CAST(settings->>'temperature' AS DOUBLE) AS temperature,
               TRY_CAST(settings->>'max_new_tokens' AS BIGINT) AS max_new_tokens,
               (draft = 'none' OR settings->>'gamma' = '0') AS is_ar,
               settings->>'run' AS run,
               coalesce(case_id, request_id) AS unit,
               CAST(coalesce(list_sum(accepted_histogram), 0) AS BIGINT) AS burst_rounds,
               CAST(coalesce(list_sum(accepted_histogram[{LONG_BURST + 2}:]), 0) AS BIGINT) AS long_bursts
        FROM read_json(?, format='newline_delimited', ignore_errors=true, columns={spec}, filename=true,
                       maximum_object_size=67108864)
    """,
        [files],
    )
    bad = con.execute("SELECT filename, count(*) FROM raw WHERE schema IS NULL GROUP BY filename").fetchall()
    for filename, count in bad:
        warnings.warn(
            f"{filename}: skipped {count} line(s) that are not complete JSON records (a torn last line from a crash?)",
            UnreadableLineWarning,
            stacklevel=2,
        )
    con.execute("""
        CREATE OR REPLACE TEMP TABLE events AS
        WITH outcomes AS (
            SELECT request_id, arg_max(outcome, time) AS outcome, arg_max(accepted_chars, time) AS accepted_chars
            FROM raw WHERE record = 'outcome' GROUP BY request_id
        )
        SELECT e.* EXCLUDE (outcome, accepted_chars, record, filename),
               coalesce(o.outcome, e.outcome) AS outcome,
               coalesce(o.accepted_chars, e.accepted_chars) AS accepted_chars,
               o.request_id IS NOT NULL AS has_feedback,
               e.filename AS file
        FROM raw e LEFT JOIN outcomes o USING (request_id)
        WHERE e.schema IS NOT NULL AND e.record IS NULL
    """)
    con.execute("DROP TABLE raw")
    return con


def _select(column: str) -> str:
    return f"coalesce({column}, {DEFAULTS[column]}) AS {column}" if column in DEFAULTS else column
