"""`specdec replay`: completion latency while source files are typed line by line, with pauses.

The server's own pipeline runs in-process (server/completion.py: prompt, decode, trim), on the backend
and draft the arguments name, and nothing else competes with it. Each file is typed from its top. At a
few line positions spread over it (--lines), the user pauses twice:

    multi-line   after pressing Enter above the line: the document ends in an empty line, indented as the
                 line will be (a new statement or block: a multi-line request)
    single-line  halfway through typing the line (a single-line request)

What kind each request is, is what the server's prompt decides (server/prompt.py), not what the position
suggests: a pause inside a docstring asks for a single line. Before each position the user has paused at
the end of the line above too: an unmeasured request whose prefill is all that counts (one token), as the
server's cancelled requests leave the cache while the user types.

    warm   the backend's cache holds the file as typed up to the line above (KV reuse of the prefix),
           as far as the prompt starts alike: past promptBudgetChars its start moves when the cursor's
           line enters the next page (server/prompt.py), so the reused tokens say how warm a request
           really was
    cold   the same request again, right after one on an unrelated document (the user switched files):
           its prefix is prefilled whole. Every --cold-every-th position only (from the middle of the
           first N), to bound the time.

Latency is the server's, from taking the request up to the trimmed completion (no debounce). One unmeasured
request of each kind on the unrelated document warms allocators and kernels first. The table gives p50 and
p95 per kind and cache, against the targets: single-line p50 <= 250 ms, multi-line p50 <= 800 ms.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from speccomplete.metrics import percentile
from speccomplete.server.completion import Completion, Engine, complete, load_engine
from speccomplete.server.language import detect_language
from speccomplete.server.options import ServerOptions, parse_options

from .lib.model_args import (
    add_backend_args,
    add_model_args,
    add_options_arg,
    backend_options,
    extra_options,
    model_options,
)
from .lib.output import number
from .lib.pipeline import UNRELATED_DOCUMENT, UNRELATED_PATH, Pause, request_at, warm_up

TARGET_P50_MS = {"single": 250.0, "multi": 800.0}
KINDS = ("single", "multi")
CACHES = ("warm", "cold")
MIN_LINE_CHARS = 4  # a line typed halfway must have something before the pause

Cache = Literal["warm", "cold"]
ProgressFn = Callable[[], None]


def chosen_lines(lines: list[str], count: int) -> list[int]:
    """Up to `count` line numbers spread evenly over the file, each with something to type halfway, in file order
    (never the first line: it has nothing above it)."""
    eligible = [i for i, line in enumerate(lines) if i > 0 and len(line.strip()) >= MIN_LINE_CHARS]
    if count >= len(eligible):
        return eligible
    return [eligible[(2 * k + 1) * len(eligible) // (2 * count)] for k in range(count)]


def end_of_line_above(lines: list[str], i: int) -> Pause:
    return Pause.at_end("\n".join(lines[:i]))


def after_enter(lines: list[str], i: int) -> Pause:
    """Line i not typed yet: an empty line, indented as line i will be."""
    line = lines[i]
    return Pause.at_end("\n".join(lines[:i]) + "\n" + line[: len(line) - len(line.lstrip())])


def halfway(lines: list[str], i: int) -> Pause:
    """Line i typed up to the middle of its text."""
    line = lines[i]
    indent = len(line) - len(line.lstrip())
    return Pause.at_end("\n".join(lines[:i]) + "\n" + line[: indent + len(line.strip()) // 2])


def prefill_only(options: ServerOptions) -> ServerOptions:
    """The settings of a request that only fills the cache: one token of either kind."""
    return dataclasses.replace(options, max_tokens_single_line=1, max_tokens_multi_line=1)


def replay_file(
    engine: Engine,
    options: ServerOptions,
    path: str,
    text: str,
    count: int,
    cold_every: int,
    progress: ProgressFn | None = None,
) -> list[dict]:
    """The measured requests of typing one file: one record each, in the order they ran."""
    lines = text.split("\n")
    records: list[dict] = []
    requests = 0

    def ask(pause: Pause, on: str, settings: ServerOptions) -> Completion:
        nonlocal requests
        requests += 1
        completion = complete(engine, settings, request_at(pause, on, f"replay-{requests}"), threading.Event())
        if completion.error is not None:
            raise ValueError(f"{path}: the server could not complete line {pause.line + 1}: {completion.error}")
        return completion

    def measure(i: int, pause: Pause, at: str, cache: Cache) -> None:
        completion = ask(pause, path, options)
        event = completion.event
        records.append(
            {
                "file": path,
                "line": i + 1,
                "at": at,
                "kind": "multi" if completion.multiline else "single",
                "cache": cache,
                "language": completion.language,
                "latency_ms": event.latency_ms,
                "prompt_tokens": event.prompt_tokens,
                "prompt_reused_tokens": event.prompt_reused_tokens,
                "generated_tokens": event.generated_tokens,
                "drafted": event.drafted,
                "accepted": event.accepted,
                "draft_counts": event.draft_counts,
                "finish_reason": event.finish_reason,
                "completion_chars": len(completion.text),
            }
        )

    unrelated = Pause.at_end(UNRELATED_DOCUMENT)
    for k, i in enumerate(chosen_lines(lines, count)):
        ask(end_of_line_above(lines, i), path, prefill_only(options))
        pauses = (("line start", after_enter(lines, i)), ("mid-line", halfway(lines, i)))
        for at, pause in pauses:
            measure(i, pause, at, "warm")
        if k % cold_every == cold_every // 2:
            for at, pause in pauses:
                ask(unrelated, UNRELATED_PATH, prefill_only(options))
                measure(i, pause, at, "cold")
        if progress:
            progress()
    return records


def run_replay(
    engine: Engine,
    options: ServerOptions,
    files: dict[str, str],
    count: int,
    cold_every: int = 3,
    progress: ProgressFn | None = None,
) -> list[dict]:
    """Type each file (path -> text) in turn; the measured requests' records."""
    if cold_every < 1:
        raise ValueError(f"cold_every must be >= 1, got {cold_every}")
    warm_up(engine, options)
    records = []
    for path, text in files.items():
        records += replay_file(engine, options, path, text, count, cold_every, progress)
    return records


def summarize(records: list[dict]) -> list[dict]:
    """One row per kind and cache: how many, latency percentiles, and the mean tokens behind them."""

    def mean(rows: list[dict], key: str) -> float | None:
        return sum(r[key] for r in rows) / len(rows) if rows else None

    rows = []
    for kind in KINDS:
        for cache in CACHES:
            mine = [r for r in records if r["kind"] == kind and r["cache"] == cache]
            latencies = [r["latency_ms"] for r in mine]
            rows.append(
                {
                    "kind": kind,
                    "cache": cache,
                    "n": len(mine),
                    "p50_ms": percentile(latencies, 50),
                    "p95_ms": percentile(latencies, 95),
                    "mean_generated_tokens": mean(mine, "generated_tokens"),
                    "mean_prompt_tokens": mean(mine, "prompt_tokens"),
                    "mean_prompt_reused_tokens": mean(mine, "prompt_reused_tokens"),
                }
            )
    return rows


def target_verdicts(summary: list[dict]) -> dict:
    """For each kind and cache: is its p50 within the target? None where it had no requests."""
    return {
        f"{row['kind']}_{row['cache']}": {
            "p50_ms": row["p50_ms"],
            "target_ms": TARGET_P50_MS[row["kind"]],
            "met": None if row["p50_ms"] is None else row["p50_ms"] <= TARGET_P50_MS[row["kind"]],
        }
        for row in summary
    }


def format_table(data: dict) -> str:
    lines = [
        f"replay {data['label']}: backend {data['backend']}, target {data['target']}, draft {data['draft']}, "
        f"device {data['device']}",
        "files: " + ", ".join(f"{f['path']} ({f['language']}, {f['positions']} positions)" for f in data["files"]),
        "",
        f"{'kind':<12}{'cache':<7}{'n':>4}{'p50 ms':>9}{'p95 ms':>9}{'gen tok':>9}{'prompt tok':>12}{'reused tok':>12}",
    ]
    for row in data["summary"]:
        lines.append(
            f"{row['kind'] + '-line':<12}{row['cache']:<7}{row['n']:>4}"
            f"{number(row['p50_ms']):>9}{number(row['p95_ms']):>9}"
            f"{number(row['mean_generated_tokens'], 1):>9}{number(row['mean_prompt_tokens']):>12}"
            f"{number(row['mean_prompt_reused_tokens']):>12}"
        )
    lines.append("")
    for kind in KINDS:
        verdicts = [(cache, data["targets"][f"{kind}_{cache}"]) for cache in CACHES]
        said = ", ".join(
            f"{cache} {number(v['p50_ms'])} ms " + ("-" if v["met"] is None else "met" if v["met"] else "MISSED")
            for cache, v in verdicts
        )
        lines.append(f"target {kind}-line p50 <= {TARGET_P50_MS[kind]:.0f} ms: {said}")
    return "\n".join(lines)


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The server's settings for the replay: the CLI's model and backend, no telemetry, no outcome tracking, then
    --options on top."""
    raw = {
        **model_options(args),
        "maxTokensSingleLine": args.max_tokens_single_line,
        "maxTokensMultiLine": args.max_tokens_multi_line,
        "telemetry": False,
        "telemetrySource": "eval",
        "trackOutcomes": False,
        **backend_options(args),
        **extra_options(args),
    }
    options, errors = parse_options(raw)
    if errors:
        raise ValueError("; ".join(errors))
    return options


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("replay")
    p.add_argument("--files", nargs="+", required=True, help="source files to type, in any language the server knows")
    p.add_argument("--lines", type=int, default=12, help="line positions per file, spread over it (default: 12)")
    p.add_argument(
        "--cold-every", type=int, default=3, help="repeat every Nth position cold, after an unrelated document"
    )
    p.add_argument("--max-tokens-single-line", type=int, default=ServerOptions.max_tokens_single_line)
    p.add_argument("--max-tokens-multi-line", type=int, default=ServerOptions.max_tokens_multi_line)
    p.add_argument("--label", help="the name of this run's row (default: backend and draft)")
    p.add_argument("--json", help="write the summary and every measured request here")
    add_options_arg(p)
    add_model_args(p)
    add_backend_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.lines < 1:
        raise ValueError(f"--lines must be >= 1, got {args.lines}")
    if args.steps != "auto" or args.no_pack:
        print(
            "specdec replay: the pipeline loads as the server does: --steps and --no-pack are ignored", file=sys.stderr
        )
    files = {path: Path(path).read_text() for path in args.files}
    options = server_options(args)
    engine = load_engine(options)
    positions = sum(len(chosen_lines(text.split("\n"), args.lines)) for text in files.values())
    bar = tqdm(total=positions, desc="replay", unit="line")
    try:
        records = run_replay(engine, options, files, args.lines, args.cold_every, progress=lambda: bar.update(1))
    finally:
        bar.close()
    summary = summarize(records)
    data = {
        "label": args.label or f"{engine.backend} {engine.draft}",
        "backend": engine.backend,
        "target": engine.target,
        "draft": engine.draft,
        "device": engine.device,
        "settings": options.settings(),
        "options": extra_options(args),
        "files": [
            {
                "path": path,
                "language": detect_language(path, text=text),
                "positions": len(chosen_lines(text.split("\n"), args.lines)),
            }
            for path, text in files.items()
        ],
        "cold_every": args.cold_every,
        "argv": getattr(args, "argv", None),
        "summary": summary,
        "targets": target_verdicts(summary),
        "requests": records,
    }
    print(format_table(data))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
        print(f"results: {args.json}", file=sys.stderr)
    return 0
