"""`specdec quality`: what users see, through the server's own pipeline, on held-out cases.

Each case runs once through `speccomplete.server.completion.complete()` in-process (one engine, loaded
once; an invoked request), exactly as the language server would answer it: prompt, decode, trim. Per
case it records whether a completion was shown, whether it loops, how long it took, and, where the case
has a reference line, whether its first line is the real one.

The reference. `specdec cases` puts the cursor after the indentation of a real line of a held-out
file, so the rest of that line (`Case.expected_line`) is what the user was about to type. Such a case is
*scored*: the rest of its line is cut out of the document before the request (otherwise the model would
see the answer in its fill-in-the-middle suffix), which leaves the cursor on an empty, indented line with
the rest of the file below it, as after pressing Enter (a multi-line request). The completion's first line,
joined to the text before the cursor, is compared stripped with the real line, stripped: exact match, and
difflib's similarity ratio for a signal below exact. Any other case (cursor mid-line, or on an empty line,
as the bundled docs/examples/cases.jsonl holes are) is sent as it is and has no reference: it counts for
shown, empty, loops and latency, and its exact and similarity are null.

At the end of a finished line. `specdec cases --line-end` puts the cursor at the end of the line before a real
line (no block opener there: the server asks for a single line) and marks the case `line_end`: the next line is
the reference, cut out of the document with its line break (the user has finished a line and paused). What such
a case sends is `--at-line-end`'s choice (`AtLineEnd`): as the server answers it today, the next line offered
below it (the server's change emulated here), or the baseline, the usual scored case on the same reference line
(the user has pressed Enter). Its completion is scored on the line after its first line break, stripped, against
the real next line; text it adds to the finished line counts against it.

`loops` is this harness's own definition of a looping completion, independent of the server's filters
(which exist to stop loops, so this measures what gets past them); its rules are in its docstring.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Literal, get_args

from speccomplete.metrics import percentile
from speccomplete.server import gate
from speccomplete.server.completion import Completion, Engine, Request, complete, load_engine
from speccomplete.server.options import ServerOptions, parse_options
from speccomplete.server.positions import utf16_len
from speccomplete.server.snippets import OpenDocument

from .lib.cases import Case, read_cases, sample_cases
from .lib.model_args import (
    add_backend_args,
    add_model_args,
    add_options_arg,
    backend_options,
    extra_options,
    model_options,
)
from .lib.output import number
from .lib.pipeline import warm_up

OVERALL = "OVERALL"
NUMBER = re.compile(r"(?<![\w.])\d[\w.]*")  # a number literal with its suffix or base letters (`0x00`, `1.5f`)
DIGITS = re.compile(r"\d+")

LoopKind = Literal["line", "block", "phrase", "counting", "run"]
LOOP_KINDS: tuple[LoopKind, ...] = get_args(LoopKind)

# (kind, lines in the block: one, or two and more; times in a row; lines compared with their numbers masked)
LINE_RULES: tuple[tuple[LoopKind, Literal["one", "more"], int, bool], ...] = (
    ("line", "one", 3, False),
    ("block", "more", 2, False),
    ("counting", "one", 5, True),
    ("counting", "more", 3, True),
)
PHRASE_CHARS, PHRASE_REPEATS = 3, 3  # a phrase this long at least, with a letter, this many times back to back
RUN_CHARS = 80  # any phrase of two different characters or more, back to back over this many characters

# What a `line_end` case sends: "as-is", the request at the end of the finished line (today's server answers it with
# that line's rest, so nearly always nothing); "next-line", the next line offered below it, as if the server sent the
# model a line break after the cursor (`next_line_request`); "after-enter", the baseline: the cursor after the real
# next line's indentation, its text cut out (`after_enter`), the usual scored case.
AtLineEnd = Literal["as-is", "next-line", "after-enter"]
AT_LINE_END: tuple[AtLineEnd, ...] = get_args(AtLineEnd)


# --------------------------------------------------------------------------- loops


def _counts(line: str) -> bool:
    """A line that can make a loop: one with a letter or digit. Blank lines and lines of brackets and
    punctuation only (`}`, `});`, `*/`, `# ----`) are structure that real code repeats."""
    return any(c.isalnum() for c in line)


def _repeated_lines(lines: list[str], size: Literal["one", "more"], times: int) -> bool:
    """One line, or a block of two or more, holding a line that counts, `times` times in a row."""
    for i in range(len(lines)):
        sizes = range(1, 2) if size == "one" else range(2, (len(lines) - i) // times + 1)
        for block_size in sizes:
            block = lines[i : i + block_size]
            if any(_counts(row) for row in block) and lines[i : i + times * block_size] == block * times:
                return True
    return False


def _repeated_in_line(line: str) -> LoopKind | None:
    """ "phrase": a phrase of PHRASE_CHARS or more characters, one of them a letter outside a number, PHRASE_REPEATS
    times back to back; "run": any phrase of two different characters or more, back to back over RUN_CHARS."""
    n = len(line)
    words = NUMBER.sub(lambda m: "0" * len(m.group()), line)  # numbers hold no letters
    for start in range(n):
        for size in range(1, (n - start) // 2 + 1):
            phrase = line[start : start + size]
            if line[start + size : start + 2 * size] != phrase:
                continue
            times = 2
            while line[start + times * size : start + (times + 1) * size] == phrase:
                times += 1
            if size >= PHRASE_CHARS and times >= PHRASE_REPEATS:
                if any(c.isalpha() for c in words[start : start + size]):
                    return "phrase"
            if times * size >= RUN_CHARS and len(set(phrase)) > 1:
                return "run"
    return None


def loop_kind(text: str) -> LoopKind | None:
    """How a completion repeats itself the way a looping model does, the first rule that holds; None if none.

    Lines are compared whole, with their indentation (trailing spaces aside):

    - "line": one line 3 or more times in a row;
    - "block": a block of two or more lines twice in a row;
    - "counting": the same, but for the numbers in them (`if n == 1 then`, `if n == 2 then`, ...; `"7": 7,`):
      a line 5 or more times in a row, or a block of two or more lines 3 or more times in a row.

    Inside one line:

    - "phrase": a phrase of 3 or more characters holding a letter (outside number literals), 3 or more times
      back to back (`a & b & b & b & b`: " & b" four times; `foo(foo(foo(`);
    - "run": any phrase of two different characters or more (`* `, `0, `), back to back over 80 characters
      or more (` * * * * ...` to the token limit).

    What does not count:

    - a line twice in a row (`i++;` twice, two equal assignments): real code does that;
    - lines without a letter or digit, and blocks made only of them: closing brackets (`}` three times at
      one indentation), blank lines, comment rulers;
    - short phrases without a letter outside number literals: `x = [0, 0, 0, 0]`, `{0x00, 0x00, 0x00, 0x00}`:
      data repeats them on purpose; and a single character repeated (`-----`, `=====`: rulers), however long.

    The rules are this harness's, not the server's filters' (server/filters/self_repeat.py, phrase_repeat.py),
    though they overlap: the filters stop loops, this measures what gets past them. "counting" can flag 5 rows of
    a data table (`{0, 1},`, `{1, 0},`, ...) or `case 1:` to `case 5:`, which a completion rarely writes on
    purpose.
    """
    lines = [line.rstrip() for line in text.split("\n")]
    masked = [DIGITS.sub("0", line) for line in lines]
    for kind, size, times, numbers_masked in LINE_RULES:
        if _repeated_lines(masked if numbers_masked else lines, size, times):
            return kind
    return next((found for line in lines if (found := _repeated_in_line(line))), None)


def loops(text: str) -> bool:
    """Whether a completion loops: any rule of `loop_kind`."""
    return loop_kind(text) is not None


# --------------------------------------------------------------------------- one case


def scored(case: Case) -> bool:
    """A case whose cursor is after the indentation of a line with text, or marked `cut` (inside its text): the
    rest of that line is the reference; or marked `line_end` with a next line with text, the reference (the
    `specdec cases` shapes)."""
    if case.line_end:
        return bool(case.next_line.strip())
    line_before = case.prefix[case.prefix.rfind("\n") + 1 :]
    return (case.cut or not line_before.strip()) and bool(case.expected_line.strip())


def request_document(case: Case) -> str:
    """What the editor holds when the user asks: a scored case's line cut out after the cursor (the user has
    not typed it yet), a `line_end` case's next line with its line break; any other case's text as it is."""
    if not scored(case):
        return case.text
    if case.line_end:
        return case.prefix + case.text[case.offset + 1 + len(case.next_line) :]
    return case.prefix + case.text[case.offset + len(case.expected_line) :]


def line_match(case: Case, text: str) -> tuple[bool, float, str, str] | None:
    """(exact, similarity, got, want) for a scored case: the completion's first line joined to the text before
    the cursor against the real line, both stripped (for a `line_end` case, the completion's line after its first
    line break, after any text it adds to the finished line, against the next line); None for a case without a
    reference."""
    if not scored(case):
        return None
    if case.line_end:
        added, _, below = text.partition("\n")
        got = "\n".join(part for part in (added.strip(), below.split("\n", 1)[0].strip()) if part)
        want = case.next_line.strip()
        return got == want, difflib.SequenceMatcher(None, got, want).ratio(), got, want
    line_before = case.prefix[case.prefix.rfind("\n") + 1 :]
    got = (line_before + text.split("\n", 1)[0]).strip()
    want = (line_before + case.expected_line).strip()
    return got == want, difflib.SequenceMatcher(None, got, want).ratio(), got, want


def lines_right(case: Case, text: str) -> int | None:
    """For a scored case that is not `line_end`: how many of the completion's lines, from the first, are the
    file's own lines from the cursor on (each stripped; the first joined to the text before the cursor). What
    a user taking the block line by line keeps; None for a case without a reference."""
    if not scored(case) or case.line_end:
        return None
    line_before = case.prefix[case.prefix.rfind("\n") + 1 :]
    real = (line_before + case.text[case.offset :]).split("\n")
    right = 0
    for got, want in zip((line_before + text).split("\n"), real):
        if not got.strip() or got.strip() != want.strip():
            break
        right += 1
    return right


def after_enter(case: Case) -> Case:
    """A `line_end` case after the user pressed Enter and the editor indented: the cursor after the real next
    line's indentation, the usual scored case on the same reference line."""
    row = case.next_line
    indent = row[: len(row) - len(row.lstrip())]
    return dataclasses.replace(case, line=case.line + 1, character=utf16_len(indent), line_end=False)


def next_line_request(case: Case) -> tuple[str, int, int]:
    """The request that offers a `line_end` case the next line: (document, line, character) with a line break
    after the cursor and the cursor after it, at column 0 (the model writes the indentation: after a finished
    line it may dedent). What the server would send in place of the request at the line end; its completion is
    shown after a line break, as ghost text on the line below."""
    document = request_document(case)
    return document[: case.offset] + "\n" + document[case.offset :], case.line + 1, 0


def run_case(
    engine: Engine, options: ServerOptions, case: Case, request_id: str, at_line_end: AtLineEnd = "as-is"
) -> dict:
    """One request through the server's pipeline, and the row that records it; the case's neighbours are the
    editor's other open documents. A `line_end` case sends what `at_line_end` says (`AtLineEnd`)."""
    if case.line_end and at_line_end == "after-enter":
        case = after_enter(case)
    below = case.line_end and at_line_end == "next-line"
    text, line, character = next_line_request(case) if below else (request_document(case), case.line, case.character)
    open_documents = tuple(OpenDocument(n["path"], n["text"]) for n in case.neighbours)
    start = time.perf_counter()
    request = Request(
        request_id, text, case.path, None, line, character, "invoked", start, open_documents=open_documents
    )
    completion: Completion = complete(engine, options, request, threading.Event())
    wall_ms = (time.perf_counter() - start) * 1000
    event = completion.event
    offered = "\n" + completion.text if below and completion.text else completion.text
    shown = bool(offered)
    kind = loop_kind(offered) if shown else None
    match = line_match(case, offered)
    return {
        "id": case.id,
        "path": case.path,
        "line_end": case.line_end,
        "language": case.label or completion.language,
        "multiline": completion.multiline,
        "shown": shown,
        "scored": match is not None,
        "exact": None if match is None else match[0],
        "lines_shown": len(offered.strip("\n").split("\n")) if shown else 0,
        "lines_right": lines_right(case, offered) if shown else None,
        "similarity": None if match is None else round(match[1], 4),
        "loops": kind is not None,
        "loop_kind": kind,
        "latency_ms": round(event.latency_ms or wall_ms, 1),
        "generated_tokens": event.generated_tokens,
        "prompt_tokens": event.prompt_tokens,
        "finish_reason": event.finish_reason,
        "outcome": event.outcome,
        "error": None if completion.error is None else str(completion.error),
        "completion": offered,
        "first_line": None if match is None else match[2],
        "expected_line": None if match is None else match[3],
        "evidence": None if completion.evidence is None else dataclasses.asdict(completion.evidence),
    }


# --------------------------------------------------------------------------- summary


def _rate(count: float, total: int) -> float | None:
    return count / total if total else None


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per language (sorted) and OVERALL: the rates the table shows. Exact and similarity over shown count only
    scored cases that showed something; over all, every scored case, an empty one as 0."""

    def one(mine: list[dict]) -> dict:
        shown = [r for r in mine if r["shown"]]
        ref = [r for r in mine if r["scored"]]
        ref_shown = [r for r in ref if r["shown"]]
        latencies = [r["latency_ms"] for r in mine]
        return {
            "n": len(mine),
            "shown": len(shown),
            "scored": len(ref),
            "errors": sum(1 for r in mine if r["error"]),
            "multiline_rate": _rate(sum(r["multiline"] for r in mine), len(mine)),
            "shown_rate": _rate(len(shown), len(mine)),
            "empty_rate": _rate(len(mine) - len(shown), len(mine)),
            "exact_shown": _rate(sum(r["exact"] for r in ref_shown), len(ref_shown)),
            "exact_all": _rate(sum(r["exact"] for r in ref_shown), len(ref)),
            "similarity_shown": _rate(sum(r["similarity"] for r in ref_shown), len(ref_shown)),
            "similarity_all": _rate(sum(r["similarity"] for r in ref_shown), len(ref)),
            "loop_rate": _rate(sum(r["loops"] for r in shown), len(shown)),
            "loop_kinds": {kind: sum(1 for r in shown if r.get("loop_kind") == kind) for kind in LOOP_KINDS},
            "mean_latency_ms": _rate(sum(latencies), len(latencies)),
            "p50_latency_ms": percentile(latencies, 50),
            "mean_generated_tokens": _rate(sum(r["generated_tokens"] for r in mine), len(mine)),
            "mean_lines_shown": _rate(sum(r["lines_shown"] for r in shown), len(shown)),
            "mean_lines_right": _rate(sum(r["lines_right"] or 0 for r in ref_shown), len(ref_shown)),
        }

    languages = sorted({r["language"] for r in rows})
    summary = {language: one([r for r in rows if r["language"] == language]) for language in languages}
    summary[OVERALL] = one(rows)
    return summary


GATE_THRESHOLDS = (0.0, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8)


def gate_curve(rows: list[dict], thresholds=GATE_THRESHOLDS) -> list[dict]:
    """What `minConfidence` would show at each threshold (server/gate.py decides), from one run's rows: the
    gate decides after decoding and trimming, so a completion shown with the gate off is shown at t
    exactly when the gate lets its evidence through. Valid for thresholds at or above the run's own."""
    curve = []
    for t in thresholds:
        gated = [r | {"shown": r["shown"] and not _silenced(r["evidence"], t)} for r in rows]
        overall = summarize(gated)[OVERALL]
        keys = ("shown_rate", "exact_shown", "similarity_shown", "similarity_all", "loop_rate")
        curve.append({"min_confidence": t} | {k: overall[k] for k in keys})
    return curve


def _silenced(evidence: dict | None, min_confidence: float) -> bool:
    return evidence is not None and gate.silenced(gate.Evidence(**evidence), min_confidence)


def format_curve(curve: list[dict]) -> str:
    lines = ["minConfidence  shown  exact/sh  sim/sh  sim/all  loops"]
    for row in curve:
        lines.append(
            f"{row['min_confidence']:13.2f}  {number(row['shown_rate'], 2):>5}  {number(row['exact_shown'], 2):>8}"
            f"  {number(row['similarity_shown'], 2):>6}  {number(row['similarity_all'], 2):>7}"
            f"  {number(row['loop_rate'], 2):>5}"
        )
    return "\n".join(lines)


def format_table(data: dict) -> str:
    header = (
        f"{'language':>11}{'n':>4}{'shown':>7}{'empty':>7}{'ref':>5}{'exact/sh':>10}{'exact/all':>10}"
        f"{'sim/sh':>8}{'sim/all':>8}{'loops':>7}{'mean ms':>9}{'p50 ms':>8}{'gen tok':>8}"
    )
    lines = [
        f"quality {data['cases']}: backend {data['backend']}, target {data['target']}, draft {data['draft']}, "
        f"device {data['device']}",
        "settings: " + json.dumps(data["settings"]),
        *([f"at the end of a finished line: {data['at_line_end']}"] if data.get("at_line_end") else []),
        "exact and sim(ilarity) of the first line on scored cases (ref): /sh over those shown, /all over all "
        "(empty = 0); loops among shown",
        "",
        header,
        "-" * len(header),
    ]
    for name, r in data["languages"].items():
        if name == OVERALL:
            lines.append("-" * len(header))
        lines.append(
            f"{name:>11}{r['n']:>4}{number(r['shown_rate'], 2):>7}{number(r['empty_rate'], 2):>7}{r['scored']:>5}"
            f"{number(r['exact_shown'], 2):>10}{number(r['exact_all'], 2):>10}{number(r['similarity_shown'], 2):>8}"
            f"{number(r['similarity_all'], 2):>8}{number(r['loop_rate'], 2):>7}{number(r['mean_latency_ms'], 0):>9}"
            f"{number(r['p50_latency_ms'], 0):>8}{number(r['mean_generated_tokens'], 1):>8}"
        )
    errors = data["languages"][OVERALL]["errors"]
    if errors:
        lines.append(f"{errors} case(s) ended in an error: see their rows' `error`")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command


def server_options(args: argparse.Namespace) -> ServerOptions:
    """The server's settings: the CLI's model and backend, no telemetry, then --options on top."""
    raw = {
        **model_options(args),
        "telemetry": False,
        "telemetrySource": "eval",
        "trackOutcomes": False,
        **backend_options(args),
        **extra_options(args),
    }
    options, errors = parse_options(raw)
    if errors:
        raise ValueError("--options: " + "; ".join(errors))
    return options


def load_cases(args: argparse.Namespace) -> tuple[list[Case], str]:
    """The cases, and how the results name where they came from."""
    if args.cases:
        cases, source = read_cases(args.cases), args.cases
    else:
        cases = sample_cases(args.splits, args.per_language, seed=args.seed, split="dev", neighbours=args.neighbours)
        open_too = f", {args.neighbours} neighbours" if args.neighbours else ""
        source = f"{args.splits} (dev, {args.per_language} per language, seed {args.seed}{open_too})"
    return (cases[: args.limit] if args.limit else cases), source


def run_quality(
    engine: Engine, options: ServerOptions, cases: list[Case], progress=None, at_line_end: AtLineEnd = "as-is"
) -> list[dict]:
    """Every case's row, in case order, after an unmeasured request of each kind on an unrelated document
    (allocators, kernels: the warm-up `specdec replay` runs too, lib/pipeline.py), so that the first case is not
    charged for them."""
    warm_up(engine, options)
    rows = []
    for index, case in enumerate(cases):
        rows.append(run_case(engine, options, case, f"quality-{index}", at_line_end))
        if progress:
            progress(rows[-1])
    return rows


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("quality")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--cases", help="CASES.jsonl in the `specdec cases` format")
    source.add_argument("--splits", help="sample dev-split cases from the <lang>.dev.txt file lists in this directory")
    p.add_argument("--per-language", type=int, default=8, help="with --splits: cases per language (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="with --splits: the sampling seed")
    p.add_argument(
        "--neighbours",
        type=int,
        default=0,
        metavar="N",
        help="with --splits: also open up to N other files of each case's directory and language (default: 0)",
    )
    p.add_argument("--limit", type=int, help="use only the first N cases")
    p.add_argument(
        "--at-line-end",
        choices=AT_LINE_END,
        default="as-is",
        help="what a case at the end of a finished line (`specdec cases --line-end`) sends: as-is (the server's "
        "request there), next-line (the next line offered below it), after-enter (the cursor on the next line "
        "after its indentation: the baseline) (default: as-is)",
    )
    add_options_arg(p)
    p.add_argument("--json", help="write the summary and every case's row here, and the table beside it (.txt)")
    add_model_args(p)
    add_backend_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    if args.steps != "auto" or args.no_pack:
        print(
            "specdec quality: the pipeline loads as the server does: --steps and --no-pack are ignored",
            file=sys.stderr,
        )
    options = server_options(args)
    cases, source = load_cases(args)
    if not cases:
        raise ValueError(f"no cases in {source}")
    engine = load_engine(options)
    bar = tqdm(total=len(cases), desc="quality", unit="case")
    try:
        rows = run_quality(engine, options, cases, progress=lambda row: bar.update(1), at_line_end=args.at_line_end)
    finally:
        bar.close()
    curve = gate_curve(rows)
    data = {
        "cases": source,
        "backend": engine.backend,
        "target": engine.target,
        "draft": engine.draft,
        "device": engine.device,
        "settings": options.settings(),
        "options": extra_options(args) if args.options else None,
        "at_line_end": args.at_line_end if any(case.line_end for case in cases) else None,
        "argv": getattr(args, "argv", None),
        "languages": summarize(rows),
        "gate_curve": curve,
        "rows": rows,
    }
    table = format_table(data) + "\n\nThe confidence gate, from these rows (docs/quality.md):\n" + format_curve(curve)
    print(table)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1, default=str)
        Path(os.path.splitext(args.json)[0] + ".txt").write_text(table + "\n")
        print(f"results: {args.json}", file=sys.stderr)
    return 0
