"""`specdec cases`: sample completion cases from corpus split lists into a case file (its format, and where
each option puts the cursor: lib/cases.py)."""

from __future__ import annotations

import argparse

from .lib.cases import sample_cases, write_cases


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cases")
    p.add_argument("--splits", required=True, help="directory of <lang>.<split>.txt lists of source files")
    p.add_argument("--split", default="dev")
    p.add_argument("--per-language", type=int, default=2)
    p.add_argument("--nl-roots", help="ROOTS.txt of the corpus: also sample natural-language (README/docs) cases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--neighbours",
        type=int,
        default=0,
        metavar="N",
        help="also store up to N other files of the same directory and language as open documents",
    )
    p.add_argument(
        "--mid-line",
        action="store_true",
        help="put the cursor inside the line's text, not after its indentation: the rest of the line is cut out "
        "and scored (the user paused while typing it)",
    )
    p.add_argument(
        "--line-end",
        action="store_true",
        help="put the cursor at the end of the finished line before the drawn line (no block opener there): "
        "the drawn line is cut out and scored (the user paused after finishing a line)",
    )
    p.add_argument(
        "--refill",
        action="store_true",
        help="a language with fewer usable files than --per-language gets more cursors in the same files, at "
        "other rows, until it has --per-language cases (their cases are not independent: say so where CIs are read)",
    )
    p.add_argument(
        "--workspace",
        metavar="ROOTS",
        help="ROOTS.txt of the corpus: each case's workspace is its package's root (the rest of its package is "
        "what `specdec bench --compare-workspace` lets a lookup copy from)",
    )
    p.add_argument("--out", required=True)
    return p


def run(args: argparse.Namespace) -> int:
    if args.mid_line and args.line_end:
        raise ValueError("--mid-line and --line-end put the cursor in different places: choose one")
    from speccomplete.decoder.training.corpus import package_roots

    nl_roots = package_roots(args.nl_roots) if args.nl_roots else None
    cases = sample_cases(
        args.splits,
        args.per_language,
        seed=args.seed,
        split=args.split,
        nl_roots=nl_roots,
        neighbours=args.neighbours,
        mid_line=args.mid_line,
        line_end=args.line_end,
        refill=args.refill,
        workspace_roots=package_roots(args.workspace) if args.workspace else None,
    )
    write_cases(cases, args.out)
    print(f"wrote {len(cases)} cases to {args.out}")
    return 0
