"""`specdec stress`: the server tried from outside, as a misbehaving client, a typing user and a crash would.

    fuzz     seeded damaged LSP messages and bad frames (fuzz.py)
    tcp      a second local client against a connected one (tcp.py)
    storm    typing with cancellation on the default model: RSS, stale answers, latency (storm.py)
    typist   pauses as a person makes them in real files: latency at the first and later pauses, CPU (typist.py)
    kill     kill -9 during telemetry writes (kill.py)
    configs  bad settings at initialize and later (configs.py)

`--short` runs the seeded versions CI runs (tests/reliability); the full ones print a table of targets
and write JSON (docs/benchmarks/README.md has the latest).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import sys
import tempfile
from pathlib import Path

from .check import CheckResult

CHECKS = ("fuzz", "tcp", "storm", "typist", "kill", "configs")


def run_check(
    name: str, seed: int, full: bool, workdir: Path, files: list[Path] | None = None, rhythm: str = "steady"
) -> CheckResult:
    module = importlib.import_module(f"{__name__}.{name}")
    if name == "typist":
        return module.run(seed, full, workdir, files, rhythm)
    return module.run(seed, full, workdir)


def format_table(results: list[CheckResult]) -> str:
    rows = [("check", "seed", "target", "measured", "goal", "met")]
    for r in results:
        for t in r.targets:
            rows.append((r.check, str(r.seed), t.name, str(t.value), t.goal, "yes" if t.met else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for r in results:
        lines += [f"{r.check} seed {r.seed}: {note}" for note in r.notes[:5]]
    return "\n".join(lines)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("stress")
    p.add_argument("checks", nargs="*", metavar="CHECK", default=[], help=f"default: all of {CHECKS}")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (the fuzzer's target is 3: 0,1,2)")
    p.add_argument("--short", action="store_true", help="the short versions CI runs")
    p.add_argument("--json", type=Path, help="write every result here")
    p.add_argument(
        "--rhythm",
        choices=("steady", "words", "uneven", "compiled"),
        default="steady",
        help="typist: about 10 keys/s (prefillOnEdit on and off), 5 with word pauses (the defaults and debounceMs "
        "300), 8 with gaps as uneven as people's (the defaults and debounceMs 150), or 10 with the compiled step "
        "(off, a first start that builds it, a later one that loads it)",
    )
    p.add_argument("--files", type=Path, nargs="+", help="typist: files to type into (default: a few of ours)")
    return p


def run(args: argparse.Namespace) -> int:
    seeds = [int(s) for s in args.seeds.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="specdec-stress-") as tmp:
        for name in args.checks or CHECKS:
            for seed in seeds if name == "fuzz" else seeds[:1]:
                print(f"running {name} (seed {seed})...", file=sys.stderr, flush=True)
                results.append(run_check(name, seed, not args.short, Path(tmp), args.files, args.rhythm))
    print(format_table(results))
    if args.json:
        payload = [dataclasses.asdict(r) | {"passed": r.passed} for r in results]
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0 if all(r.passed for r in results) else 1
