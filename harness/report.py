"""`specdec report`: tables and plots from completion events.

The analysis (speccomplete.telemetry.analysis) runs on duckdb, pandas and matplotlib, the optional
`analysis` extra that the language server does without: it is imported only when this subcommand runs.
"""

from __future__ import annotations

import argparse
import os
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("report")
    p.add_argument("events", nargs="+", help="event files, globs or directories")
    p.add_argument("--out", required=True, help="directory for report.md, report.json, CSVs and PNGs")
    p.add_argument(
        "--groups",
        action="append",
        help="a language group, name=lang1,lang2 (repeat, or join with ';'); replaces the defaults",
    )
    p.add_argument("--base", help="the base draft for base-vs-tuned tables (default: the draft seen first)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0)
    return p


# what the `analysis` extra installs (pyproject.toml)
ANALYSIS_LIBRARIES = ("duckdb", "pandas", "matplotlib", "numpy")


def run(args: argparse.Namespace) -> int:
    try:
        from speccomplete.telemetry.analysis.groups import parse_groups
        from speccomplete.telemetry.analysis.report import build_report
    except ModuleNotFoundError as e:
        if e.name not in ANALYSIS_LIBRARIES:
            raise
        print(
            f"specdec report: {e.name} is missing: install the analysis extra, pip install 'speccomplete[analysis]'",
            file=sys.stderr,
        )
        return 2

    data = build_report(
        args.events,
        args.out,
        groups=parse_groups(args.groups),
        base_draft=args.base,
        reps=args.bootstrap,
        seed=args.seed,
        command=" ".join(["specdec", *args.argv]),
    )
    print(f"{data['events']} events -> {os.path.join(args.out, 'report.md')} ({len(data['plots'])} plots)")
    return 0
