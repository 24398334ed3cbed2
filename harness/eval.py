"""`specdec eval`: drive the real language server over stdio on completion cases, like an editor would.

For each case: open the document, ask for an inline completion at the cursor (trigger Invoked),
close it. The server writes one telemetry event per completion; this harness tags each with its
case id and copies it to --telemetry, then prints a per-language summary computed from the events.
A case the server answers with an error, crashes on or does not answer in time is counted, not fatal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lsprotocol import types

from speccomplete.metrics import acceptance_rate, percentile
from speccomplete.server.language import detect_language
from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import EventLog

from .lib.cases import Case, read_cases
from .lib.facts import write_summary
from .lib.model_args import add_backend_args, add_model_args, backend_options, model_options
from .lib.output import number
from .lib.session import Session, server_command, start_session, stop_session

log = logging.getLogger(__name__)


# ok: the server answered (maybe with nothing); error: it answered with an error; timeout: no answer
# in time; crash: its process died on the case
AnswerStatus = Literal["ok", "error", "timeout", "crash"]


@dataclass
class CaseAnswer:
    """What the server answered on one case."""

    case: Case
    language: str
    status: AnswerStatus
    completion: str = ""
    request_id: str | None = None
    latency_ms: float | None = None  # as the harness saw it: request sent to answer received
    detail: str = ""


async def run_case(session: Session, index: int, case: Case, timeout: float) -> CaseAnswer:
    client = session.client
    language = detect_language(case.path, text=case.text)
    uri = f"file:///specdec-eval/{index}/{Path(case.path).name or 'document'}"
    session.completed[uri] = asyncio.get_running_loop().create_future()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id=language, version=1, text=case.text)
        )
    )
    params = types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri),
        position=types.Position(case.line, case.character),
        context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
    )
    msg_id = f"eval-{index}"
    start = time.perf_counter()
    try:
        answer = await asyncio.wait_for(
            client.protocol.send_request_async(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=msg_id), timeout
        )
        latency = (time.perf_counter() - start) * 1000
        note = await asyncio.wait_for(session.completed[uri], 10)  # sent before the answer, so already here
        items = (answer.items if isinstance(answer, types.InlineCompletionList) else answer) or []
        text = items[0].insert_text if items else ""
        text = text if isinstance(text, str) else text.value
        return CaseAnswer(case, language, "ok", text, note["requestId"], latency)
    except TimeoutError:
        if session.alive:
            client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
        return CaseAnswer(case, language, "timeout", detail=f"no answer in {timeout:.0f} s")
    except Exception as e:  # the server answered with an error, or its process died
        if not session.alive:
            return CaseAnswer(case, language, "crash", detail="\n".join(session.stderr))
        note = session.completed[uri]
        request_id = note.result()["requestId"] if note.done() else None
        return CaseAnswer(case, language, "error", request_id=request_id, detail=str(e))
    finally:
        session.completed.pop(uri, None)
        if session.alive:
            client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))


async def run_eval(
    cases: list[Case],
    init_options: dict,
    command: list[str] | None = None,
    concurrency: int = 1,
    timeout: float = 300.0,
    ready_timeout: float = 900.0,
    progress=None,
    ready_s: list[float] | None = None,
) -> list[CaseAnswer]:
    """Run every case through the server, restarting it after a crash; each start's seconds to ready
    go into `ready_s`."""
    command = command or server_command()
    session = await start_session(command, init_options, ready_timeout)
    if ready_s is not None and session.ready_s is not None:
        ready_s.append(session.ready_s)
    gate = asyncio.Semaphore(concurrency)
    restart = asyncio.Lock()

    async def one(index: int, case: Case) -> CaseAnswer:
        nonlocal session
        async with gate:
            answer = await run_case(session, index, case, timeout)
            if answer.status == "crash":
                async with restart:
                    if not session.alive:
                        log.error("the server crashed on case %s; restarting it", case.id)
                        await stop_session(session)
                        session = await start_session(command, init_options, ready_timeout)
                        if ready_s is not None and session.ready_s is not None:
                            ready_s.append(session.ready_s)
            if progress:
                progress(answer)
        return answer

    try:
        return await asyncio.gather(*(one(i, case) for i, case in enumerate(cases)))  # in case order
    finally:
        await stop_session(session)


def init_options(args, telemetry_path: str) -> dict:
    """The server settings for a headless run: the CLI's model options, every event to one file, no debounce."""
    return {
        **model_options(args),
        "maxTokensSingleLine": args.max_tokens_single_line,
        "maxTokensMultiLine": args.max_tokens_multi_line,
        "temperature": args.temperature,
        "debounceMs": 0,
        "telemetry": True,
        "telemetryPath": telemetry_path,
        "telemetrySource": "eval",
        "trackOutcomes": False,
        **backend_options(args),
    }


def read_server_events(path: str | Path) -> list[CompletionEvent]:
    """The completion events of the server's own log (it tracks no outcomes in eval runs)."""
    events: list[CompletionEvent] = []
    if not Path(path).exists():
        return events
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:  # a line torn by a server crash
            log.warning("skipping an unreadable event line: %.80s", line)
            continue
        events.append(CompletionEvent.from_dict(record))
    return events


def tag_events(answers: list[CaseAnswer], server_events: list[CompletionEvent]) -> list[CompletionEvent]:
    """The events of the cases, in case order, each with its case id."""
    by_request = {event.request_id: event for event in server_events}
    tagged = []
    for answer in answers:
        if answer.request_id is None:  # the server never said which request it was
            continue
        event = by_request.get(answer.request_id)
        if event is not None:
            event.case_id = answer.case.id
            tagged.append(event)
    return tagged


def summarize_answers(answers: list[CaseAnswer], events: list[CompletionEvent]) -> list[dict]:
    """Per-language rows (and a last 'all' row) from the events; failures counted from the answers."""
    languages = sorted({r.language for r in answers})
    rows = []
    for language in languages + ["all"]:
        mine = [r for r in answers if language in ("all", r.language)]
        ev = [e for e in events if language in ("all", e.language)]
        single = [e.latency_ms for e in ev if not e.multiline]
        multi = [e.latency_ms for e in ev if e.multiline]
        accepted = sum(e.accepted for e in ev)
        rows.append(
            {
                "language": language,
                "cases": len(mine),
                "events": len(ev),
                "single": len(single),
                "multi": len(multi),
                "p50_ms": percentile(single + multi, 50),
                "p95_ms": percentile(single + multi, 95),
                "p50_single_ms": percentile(single, 50),
                "p50_multi_ms": percentile(multi, 50),
                "alpha": acceptance_rate(accepted, sum(e.rejected_rounds for e in ev)),
                "tokens": sum(e.generated_tokens for e in ev),
                "scope_stops": sum(1 for e in ev if e.finish_reason == "predicate"),
                "empty": sum(1 for r in mine if r.status == "ok" and not r.completion),
                "errors": sum(1 for r in mine if r.status == "error"),
                "timeouts": sum(1 for r in mine if r.status == "timeout"),
                "crashes": sum(1 for r in mine if r.status == "crash"),
            }
        )
    return rows


def latency_summary(answers: list[CaseAnswer], events: list[CompletionEvent]) -> dict:
    """The run in one JSON object (--summary): latency p50 and p95, single-line and multi-line, over the events."""

    def latencies(multiline: bool) -> dict:
        values = [e.latency_ms for e in events if e.multiline == multiline]
        return {"n": len(values), "p50_ms": percentile(values, 50), "p95_ms": percentile(values, 95)}

    return {
        "cases": len(answers),
        "events": len(events),
        "unanswered": sum(1 for r in answers if r.status != "ok"),  # errors, timeouts and crashes
        # where the server decoded, as its events say ("device" is the machine's facts: lib/facts.write_summary)
        "decoder_device": events[0].device if events else None,
        "single_line": latencies(multiline=False),
        "multi_line": latencies(multiline=True),
    }


def format_summary(rows: list[dict]) -> str:
    """The table; `scope` counts completions the syntax check ended inside the decode loop."""

    header = (
        f"{'language':<11}{'n':>4}{'1-line':>7}{'multi':>6}{'p50 ms':>9}{'p95 ms':>9}"
        f"{'p50 1-line':>11}{'p50 multi':>10}{'alpha':>7}{'tokens':>7}{'scope':>6}{'empty':>6}{'err':>5}{'t/o':>5}"
        f"{'crash':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        if r["language"] == "all":
            lines.append("-" * len(header))
        lines.append(
            f"{r['language']:<11}{r['cases']:>4}{r['single']:>7}{r['multi']:>6}"
            f"{number(r['p50_ms']):>9}{number(r['p95_ms']):>9}{number(r['p50_single_ms']):>11}"
            f"{number(r['p50_multi_ms']):>10}{number(r['alpha'], 2):>7}{r['tokens']:>7}"
            f"{r['scope_stops']:>6}{r['empty']:>6}{r['errors']:>5}{r['timeouts']:>5}{r['crashes']:>6}"
        )
    return "\n".join(lines)


def format_failures(answers: list[CaseAnswer]) -> str:
    """One line per case that got no answer: errors, timeouts and crashes, with the reason."""
    lines = []
    for r in answers:
        if r.status != "ok":
            reason = r.detail.strip().splitlines()[-1] if r.detail.strip() else ""
            lines.append(f"{r.status}: {r.case.id} ({r.language}) {reason}")
    return "\n".join(lines)


def evaluate(
    cases: list[Case], args, progress=None, ready_s: list[float] | None = None
) -> tuple[list[CaseAnswer], list[CompletionEvent]]:
    """Run the cases; write the tagged events to args.telemetry and, if asked, the completions to args.results.
    ready_s: each server start's seconds to ready (run_eval)."""
    with tempfile.TemporaryDirectory(prefix="specdec-eval-") as tmp:
        server_log = os.path.join(tmp, "events.jsonl")
        answers = asyncio.run(
            run_eval(
                cases,
                init_options(args, server_log),
                concurrency=args.concurrency,
                timeout=args.timeout,
                progress=progress,
                ready_s=ready_s,
            )
        )
        events = tag_events(answers, read_server_events(server_log))
    with EventLog(args.telemetry) as out:
        for event in events:
            out.write(event)
    if args.results:
        with open(args.results, "w") as f:
            for r in answers:
                latency = r.latency_ms if r.latency_ms is None else round(r.latency_ms, 1)
                f.write(
                    json.dumps(
                        {
                            "id": r.case.id,
                            "language": r.language,
                            "completion": r.completion,
                            "latency_ms": latency,
                            "status": r.status,
                        }
                    )
                    + "\n"
                )
    return answers, events


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("eval")
    p.add_argument("cases", help="CASES.jsonl in the `specdec cases` format")
    p.add_argument("--telemetry", required=True, help="write the completion events here (JSONL)")
    p.add_argument("--results", help="also write each case's completion text here (opt-in: it is source code)")
    p.add_argument("--summary", help="also write the latency summary and the machine's facts here (JSON)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for one completion")
    p.add_argument("--max-tokens-single-line", type=int, default=32)
    p.add_argument("--max-tokens-multi-line", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    add_model_args(p)
    add_backend_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    cases = read_cases(args.cases)
    bar = tqdm(total=len(cases), desc="eval", unit="case")
    ready_s: list[float] = []
    try:
        answers, events = evaluate(cases, args, progress=lambda r: bar.update(1), ready_s=ready_s)
    except (RuntimeError, TimeoutError) as e:  # the server could not start or load its models
        print(f"specdec eval: {e}", file=sys.stderr)
        if args.summary:  # a summary still says what happened, and on which machine
            write_summary(args.summary, {"cases": len(cases), "events": 0, "error": str(e)})
        return 2
    finally:
        bar.close()
    print(
        f"target={args.target} draft={args.draft} gamma={args.gamma} cases={args.cases} "
        f"(latency: server-side, from request to trimmed completion)"
    )
    print(format_summary(summarize_answers(answers, events)))
    if failures := format_failures(answers):
        print(failures)
    print(f"server ready {ready_s[0]:.1f} s after its start (models loaded, target steps built)")
    if args.summary:
        summary = latency_summary(answers, events) | {
            "ready_s": round(ready_s[0], 2),
            "restarts_ready_s": [round(s, 2) for s in ready_s[1:]],
        }
        print(json.dumps(write_summary(args.summary, summary)))
    print(f"events: {args.telemetry}" + (f", results: {args.results}" if args.results else ""))
    return 0
