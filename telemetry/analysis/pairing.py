"""The pairing speed-up is measured over, for `specdec report` (queries.prepare) and `specdec study`
(study.py): each speculative run beside the AR run of the same case.

An AR run (draft "none" or γ "0") pairs with the speculative runs that share its target, backend, device,
temperature, max_new_tokens, case and run id (where a harness sets one: it timed both sides together). So
llama.cpp's speculative runs are compared with llama.cpp's AR, ours with ours, and a case's runs with its own
AR only. speccomplete.metrics.speedup then divides the two sides' pooled tokens/s.
"""

from __future__ import annotations

# What a speculative run shares with the AR run it is paired with: all but the draft and γ.
AR_MATCH = ("target", "backend", "device", "temperature", "max_new_tokens", "unit", "run")
# A run's timed sums; decode_ms leaves out the prefill, the same work on both sides.
TIMES = {"tokens": "generated_tokens", "ms": "total_ms", "decode_ms": "total_ms - coalesce(prefill_ms, 0)"}


def pair_with_ar(con, config: str, counts: dict[str, str]) -> None:
    """Table `units` from table `events` (read.connect): one row per configuration, language and unit (a case).

    `config` is the SQL expression that names a configuration; `counts` maps column names to SQL aggregates
    over a unit's events (the draft counts a caller needs). Each row has those counts, `tokens`, `ms` and
    `decode_ms` of its runs, `sp_tokens`, `sp_ms` and `sp_decode_ms` of the runs that have an AR run to pair
    with and `ar_tokens`, `ar_ms` and `ar_decode_ms` of those AR runs (0 where none), `paired` (whether any
    has), `is_ar`, and `first_time`, when its first run finished (the order runs were made in).
    """
    match = ", ".join(AR_MATCH)
    joined = " AND ".join(f"ar.{key} IS NOT DISTINCT FROM r.{key}" for key in AR_MATCH if key != "unit")
    run_sums = ", ".join(f"{sql} AS {name}" for name, sql in counts.items())
    run_times = ", ".join(f"sum({sql}) AS {name}" for name, sql in TIMES.items())
    unit_sums = ", ".join(f"sum(r.{name}) AS {name}" for name in [*counts, *TIMES])
    spec = ", ".join(f"sum(CASE WHEN ar.unit IS NOT NULL THEN r.{name} ELSE 0 END) AS sp_{name}" for name in TIMES)
    ar = ", ".join(f"coalesce(sum(ar.ar_{name}), 0) AS ar_{name}" for name in TIMES)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE units AS
        WITH runs AS (
            SELECT {config} AS config, coalesce(is_ar, false) AS is_ar, language, {match},
                   min(time) AS first_time, {run_sums}, {run_times}
            FROM events GROUP BY ALL
        ), ar AS (
            SELECT {match}, {", ".join(f"sum({name}) AS ar_{name}" for name in TIMES)}
            FROM runs WHERE is_ar GROUP BY ALL
        )
        SELECT r.config, any_value(r.is_ar) AS is_ar, r.language, r.unit, min(r.first_time) AS first_time,
               {unit_sums}, {spec}, {ar}, bool_or(ar.unit IS NOT NULL) AS paired
        FROM runs r LEFT JOIN ar ON NOT r.is_ar AND ar.unit = r.unit AND {joined}
        GROUP BY r.config, r.language, r.unit
    """)
