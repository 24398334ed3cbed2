"""How long `specdec report` takes on N synthetic events: prints a table and writes JSON.

python -m speccomplete.telemetry.analysis.benchmark --events 1000000 --json docs/benchmarks/telemetry_report.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import tempfile
import time

from .queries import REPORT_COLUMNS
from .read import connect
from .report import build_report
from .synthetic import write_synthetic


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--file", help="reuse (or create) this synthetic events file")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    workdir = tempfile.mkdtemp(prefix="specdec-telemetry-bench-")
    path = args.file or os.path.join(workdir, "events.jsonl")
    if not os.path.exists(path):
        start = time.perf_counter()
        write_synthetic(path, args.events)
        print(f"generated {args.events} events in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()
    con = connect([path], columns=REPORT_COLUMNS)
    [(n,)] = con.execute("SELECT count(*) FROM events").fetchall()
    read_s = time.perf_counter() - start
    con.close()
    start = time.perf_counter()
    build_report([path], os.path.join(workdir, "report"))
    report_s = time.perf_counter() - start
    row = {
        "events": n,
        "file_mb": round(os.path.getsize(path) / 2**20, 1),
        "read_s": round(read_s, 2),
        "report_s": round(report_s, 2),
        "cpus": os.cpu_count(),
        "host": platform.machine(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "date": datetime.date.today().isoformat(),
    }
    print(f"{'events':>9} {'MB':>7} {'read s':>7} {'report s':>9} {'cpus':>5} {'load':>5}")
    print(f"{n:>9} {row['file_mb']:>7} {read_s:>7.1f} {report_s:>9.1f} {row['cpus']:>5} {row['load_avg_1m']:>5}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
