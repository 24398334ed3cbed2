"""A typing storm against the real `specdec serve`: a source file typed character by character, as an editor sends it.

Each keystroke is a didChange, a `$/cancelRequest` for the previous request if it is still unanswered, and an
automatic inline completion request; keys come 30-80 ms apart, with the odd hesitation longer than the server's
debounce (so decodes start, and are cancelled by the next key). Every `pause_every` keys the typist pauses: the last
request runs to its end, and the server's memory (VmRSS) is sampled.

Measured: stale completions (a non-empty answer for a version older than one the server had been sent well before
it answered: the server must drop those), requests never answered, latency after a pause (request sent to answer),
the share of the prompt the decoder reused from its cache after a pause (the telemetry events' prompt_reused_tokens),
and cancel to idle: for a request cancelled while it decoded, the time from `$/cancelRequest` to its
`specdec/completed` notification (server/lsp.py sends it when the decode has stopped, before the cancelled answer).

The full version types with the default model (gemma3-270m); the short one with a tiny random model.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pygls.lsp.client import LanguageClient

import speccomplete.telemetry.log
from speccomplete.metrics import percentile
from speccomplete.server.positions import utf16_len

from ..lib.output import rounded
from ..lib.session import Session, connect, server_command, stop_session
from .check import CheckResult
from .wire import save_tiny_model

log = logging.getLogger(__name__)

TYPING_S = (0.03, 0.08)  # between two keys
HESITATION_S = (0.25, 0.7)  # now and then: longer than the debounce, so a decode starts
HESITATION_SHARE = 0.1
PAUSE_S = (1.0, 2.0)  # from the last key of a burst to the next key, or longer if its completion takes longer
# A didChange sent this shortly before an answer arrived may still have been in the pipe when the server answered:
# such an answer crossed the change in flight and is counted apart from the stale ones.
STALE_GRACE_S = 0.1
WARM_UP_SHARE = 0.2  # RSS samples in the first fifth of the run are the warm-up
SOURCE = Path(speccomplete.telemetry.log.__file__)  # what is typed: a real Python module, installed with the package
URI = "file:///specdec-stress/log.py"


@dataclass(frozen=True)
class Plan:
    keystrokes: int
    pause_every: int
    start_share: float  # the document opens with this share of the file; the typing goes on from there
    ready_timeout_s: float  # for the models to load
    answer_timeout_s: float  # for one completion


FULL = Plan(keystrokes=1200, pause_every=30, start_share=0.25, ready_timeout_s=900, answer_timeout_s=120)
SHORT = Plan(keystrokes=60, pause_every=20, start_share=0.4, ready_timeout_s=180, answer_timeout_s=60)


# ---------------------------------------------------------------------------------------------- the server


@dataclass
class StressSession(Session):
    """The harness's session (lib/session.py), also recording the server's messages and its specdec/completed
    notifications in order."""

    messages: list[types.ShowMessageParams] = field(default_factory=list)
    arrivals: list[Arrival] = field(default_factory=list)  # notifications and answers, as they arrived
    status_times: list[float] = field(default_factory=list)  # time.monotonic() each of `statuses` arrived

    def status_arrived(self, status: dict) -> None:
        super().status_arrived(status)
        self.status_times.append(time.monotonic())

    def completion_noted(self, note: dict) -> None:
        self.arrivals.append(Arrival(time.monotonic(), note=note))

    def message_shown(self, params: types.ShowMessageParams) -> None:
        self.messages.append(params)


@dataclass
class Arrival:
    at: float  # time.monotonic()
    note: dict | None = None  # a specdec/completed notification
    answer: Sent | None = None  # or the answer to this request


async def start_server(init_options: dict, ready_timeout: float, env: dict | None = None) -> StressSession:
    """`specdec serve` over stdio, initialized like an editor initializes it; returns at its first "ready" or
    "error" status (a server whose models fail to load is still up: its last status says so)."""
    session = StressSession(LanguageClient("specdec-stress", "0.1.0"))
    try:
        await connect(session, server_command(), init_options, ready_timeout, env=env)
    except TimeoutError:
        await stop_session(session)
        raise RuntimeError(f"the server reported neither ready nor error in {ready_timeout:.0f} s") from None
    return session


async def wait_for_status(session: Session, after: int, timeout: float) -> dict:
    """The first "ready" or "error" status at index >= `after` in `session.statuses`."""
    deadline = time.monotonic() + timeout
    while True:
        settled = [s for s in session.statuses[after:] if s.get("state") in ("ready", "error")]
        if settled:
            return settled[0]
        if time.monotonic() > deadline or not session.alive:
            raise RuntimeError(f"no ready or error status in {timeout:.0f} s")
        await asyncio.sleep(0.05)


def rss_kib(pid: int) -> int | None:
    """The process's resident memory (VmRSS) in KiB; None where /proc has no such line."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


# ---------------------------------------------------------------------------------------------- the storm


@dataclass
class Sent:
    """One inline completion request and what became of it."""

    msg_id: str
    version: int  # the document version it was asked for
    sent: float
    before_pause: bool  # the last key before a pause: nothing cancels it
    cancelled: float | None = None  # when $/cancelRequest was sent for it
    answered: float | None = None
    cancelled_answer: bool = False  # answered with the RequestCancelled error
    error: str | None = None  # answered with another error
    text: str = ""  # the completion, "" for none
    request_id: str | None = None  # the server's id for it (its event's), where known
    newer_change_sent: float | None = None  # when the answer arrived for an old version: when the next was sent

    @property
    def latency_ms(self) -> float | None:
        return None if self.answered is None else (self.answered - self.sent) * 1000

    @property
    def changed_before_answer_s(self) -> float | None:
        """How long before its answer arrived the document had changed on (None: it had not)."""
        if self.answered is None or self.newer_change_sent is None:
            return None
        return self.answered - self.newer_change_sent


@dataclass
class Storm:
    session: StressSession
    requests: list[Sent] = field(default_factory=list)
    change_sent: dict[int, float] = field(default_factory=dict)  # document version -> when its didChange was sent
    version: int = 1
    rss: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the run, KiB)
    uri: str = URI  # the document typed into

    def answer(self, sent: Sent, future: Future) -> None:
        """The request's answer arrived (called in the reading loop, so in order with the notifications)."""
        sent.answered = time.monotonic()
        if sent.version < self.version:
            sent.newer_change_sent = self.change_sent[sent.version + 1]
        self.session.arrivals.append(Arrival(sent.answered, answer=sent))
        if future.cancelled():  # the client gave up on it (its connection closed): no answer came
            sent.answered = None
            return
        error = future.exception()
        if isinstance(error, JsonRpcException) and error.code == types.LSPErrorCodes.RequestCancelled:
            sent.cancelled_answer = True
        elif error is not None:
            sent.error = repr(error)
        else:
            result = future.result()
            items = (result.items if isinstance(result, types.InlineCompletionList) else result) or []
            if items:
                text = items[0].insert_text
                sent.text = text if isinstance(text, str) else text.value
                arguments = items[0].command.arguments if items[0].command else None
                sent.request_id = arguments[0] if arguments else None

    def type_key(self, character: str, line: int, column: int) -> None:
        self.version += 1
        self.change_sent[self.version] = time.monotonic()
        at = types.Position(line, column)
        self.session.client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=self.uri, version=self.version),
                content_changes=[types.TextDocumentContentChangePartial(range=types.Range(at, at), text=character)],
            )
        )

    def request(self, line: int, column: int, before_pause: bool) -> Sent:
        """Cancel the previous request if it is unanswered, as editors do, and ask for a completion at the cursor."""
        protocol = self.session.client.protocol
        previous = self.requests[-1] if self.requests else None
        if previous is not None and previous.answered is None:
            previous.cancelled = time.monotonic()
            protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=previous.msg_id))
        sent = Sent(f"storm-{len(self.requests)}", self.version, time.monotonic(), before_pause)
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(self.uri),
            position=types.Position(line, column),
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
        )
        future = protocol.send_request(types.TEXT_DOCUMENT_INLINE_COMPLETION, params, msg_id=sent.msg_id)
        future.add_done_callback(lambda done: self.answer(sent, done))
        self.requests.append(sent)
        return sent

    def sample_rss(self, started: float) -> None:
        kib = rss_kib(self.session.process.pid)
        if kib is not None:
            self.rss.append((time.monotonic() - started, kib))


async def _type(storm: Storm, text: str, start: int, plan: Plan, rng: random.Random) -> None:
    """Open the document with text[:start] and type the next `plan.keystrokes` characters at its end."""
    client = storm.session.client
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=URI, language_id="python", version=storm.version, text=text[:start])
        )
    )
    lines = text[:start].split("\n")
    line, column = len(lines) - 1, utf16_len(lines[-1])
    typed = text[start : start + plan.keystrokes]
    started = time.monotonic()
    storm.sample_rss(started)
    for index, character in enumerate(typed):
        storm.type_key(character, line, column)
        line, column = (line + 1, 0) if character == "\n" else (line, column + utf16_len(character))
        key_sent = time.monotonic()
        pause = (index + 1) % plan.pause_every == 0 or index == len(typed) - 1
        sent = storm.request(line, column, before_pause=pause)
        if not pause:
            hesitate = rng.random() < HESITATION_SHARE
            await asyncio.sleep(rng.uniform(*(HESITATION_S if hesitate else TYPING_S)))
            continue
        deadline = key_sent + plan.answer_timeout_s
        while sent.answered is None and time.monotonic() < deadline and storm.session.alive:
            await asyncio.sleep(0.01)
        storm.sample_rss(started)
        await asyncio.sleep(max(0.0, key_sent + rng.uniform(*PAUSE_S) - time.monotonic()))


async def _storm(seed: int, full: bool, workdir: Path) -> tuple[Storm, list[dict], bool]:
    """Type, wait for every answer, stop the server; (the storm, its completion events, whether it lived on)."""
    plan = FULL if full else SHORT
    events_path = workdir / "events.jsonl"
    events_path.unlink(missing_ok=True)
    options: dict = {"telemetryPath": str(events_path)}
    if not full:
        # fp32: the tiny model's int8 weights would gain nothing and its random outputs shift enough to matter
        options |= {"target": str(save_tiny_model(workdir / "model", seed)), "quantization": "none"}
    session = await start_server(options, plan.ready_timeout_s)
    if session.statuses[-1]["state"] != "ready":
        await stop_session(session)
        raise RuntimeError(f"the server could not load its models: {session.statuses[-1].get('message')}")
    storm = Storm(session)
    text = SOURCE.read_text()
    start = text.find("\n", int(len(text) * plan.start_share)) + 1
    try:
        await _type(storm, text, start, plan, random.Random(seed))
        deadline = time.monotonic() + plan.answer_timeout_s  # every request must be answered, cancelled or not
        while any(r.answered is None for r in storm.requests) and time.monotonic() < deadline and session.alive:
            await asyncio.sleep(0.05)
        alive = session.alive
    finally:
        await stop_session(session)
    events = [json.loads(line) for line in events_path.read_text().splitlines()] if events_path.exists() else []
    return storm, [e for e in events if e.get("record") != "outcome"], alive


def run(seed: int, full: bool, workdir: Path) -> CheckResult:
    workdir = workdir / "storm"  # the checks share `workdir`
    workdir.mkdir(parents=True, exist_ok=True)
    storm, events, alive = asyncio.run(_storm(seed, full, workdir))
    return report(storm, events, alive, seed, full)


def report(storm: Storm, events: list[dict], alive: bool, seed: int, full: bool) -> CheckResult:
    result = CheckResult("storm", seed, full)
    requests = storm.requests
    by_request_id = {e["request_id"]: e for e in events}
    _pair_notes(storm.session.arrivals)

    unanswered = [r for r in requests if r.answered is None]
    errors = [r for r in requests if r.error is not None]
    late = [r.changed_before_answer_s for r in requests if r.text and r.changed_before_answer_s is not None]
    stale = [r for r in requests if r.text and (r.changed_before_answer_s or 0) >= STALE_GRACE_S]

    after_pause = [r for r in requests if r.before_pause and r.latency_ms is not None and not r.cancelled_answer]
    latency: dict[str, list[float]] = {"single": [], "multi": [], "unknown": []}
    reused = prompt = 0
    for index, r in enumerate(after_pause):
        event = by_request_id.get(r.request_id or "")
        kind = "unknown" if event is None else "multi" if event["multiline"] else "single"
        latency[kind].append(r.latency_ms or 0.0)
        if event is not None and index > 0:  # the first decode finds the cache cold
            reused += event["prompt_reused_tokens"]
            prompt += event["prompt_tokens"]

    cancel_to_idle = []
    for r in requests:
        event = by_request_id.get(r.request_id or "")
        if r.cancelled is not None and r.cancelled_answer and event is not None and event["prompt_tokens"] > 0:
            completed = next(a.at for a in storm.session.arrivals if a.note and a.note["requestId"] == r.request_id)
            cancel_to_idle.append((completed - r.cancelled) * 1000)

    rss = [kib for _, kib in storm.rss]
    warm = rss[int(len(rss) * WARM_UP_SHARE) :]
    growth = max(warm) / min(warm) - 1 if warm else None
    single_p50 = percentile(latency["single"], 50)
    reuse_share = reused / prompt if prompt else None

    result.metrics = {
        "keystrokes": len(requests),
        "requests_answered": len(requests) - len(unanswered),
        "requests_cancelled": sum(r.cancelled is not None for r in requests),
        "answered_cancelled": sum(r.cancelled_answer for r in requests),
        "non_empty_answers": sum(bool(r.text) for r in requests),
        "request_errors": len(errors),
        "stale_completions": len(stale),
        "answers_crossing_a_change": len(late) - len(stale),
        "server_alive_at_end": alive,
        "completion_events": len(events),
        "completed_notifications": sum(a.note is not None for a in storm.session.arrivals),
        "event_outcomes": _count(e["outcome"] for e in events),
        "pauses": len(after_pause),
        "latency_after_pause_ms": {
            kind: {
                "n": len(values),
                "p50": rounded(percentile(values, 50), 1),
                "p95": rounded(percentile(values, 95), 1),
            }
            for kind, values in latency.items()
            if values
        },
        "server_latency_after_pause_ms_p50": rounded(
            percentile([e["latency_ms"] for r in after_pause if (e := by_request_id.get(r.request_id or ""))], 50), 1
        ),
        "prompt_reused_share_after_pause": rounded(reuse_share, 3),
        "cancel_to_idle_ms": {
            "n": len(cancel_to_idle),
            "p50": rounded(percentile(cancel_to_idle, 50), 1),
            "p95": rounded(percentile(cancel_to_idle, 95), 1),
            "max": rounded(max(cancel_to_idle, default=None), 1),
        },
        "rss_kib": [[round(t, 1), kib] for t, kib in storm.rss],
        "rss_growth_after_warm_up": rounded(growth, 4),
    }
    result.target("stale completions", len(stale), "== 0", not stale)
    result.target("requests never answered", len(unanswered), "== 0", not unanswered)
    result.target("requests answered with an error", len(errors), "== 0", not errors)
    result.target("server alive at the end", alive, "== True", alive)
    result.target("RSS samples", len(rss), ">= 2", len(rss) >= 2)
    if full:
        result.target("RSS growth after warm-up (max/min - 1)", rounded(growth, 4), "<= 0.05", (growth or 0) <= 0.05)
        result.target(
            "single-line latency after a pause, p50 (ms)",
            rounded(single_p50, 1),
            "<= 400",
            single_p50 is not None and single_p50 <= 400,
        )
        result.target(
            "prompt share reused from the cache after a pause",
            rounded(reuse_share, 3),
            ">= 0.8",
            reuse_share is not None and reuse_share >= 0.8,
        )
    result.notes += [f"stale: {r.msg_id} for version {r.version}: {r.text[:40]!r}" for r in stale[:3]]
    result.notes += [f"error: {r.msg_id}: {r.error}" for r in errors[:3]]
    if not alive:
        result.notes.append("server died: " + " | ".join(list(storm.session.stderr)[-5:]))
    return result


def _pair_notes(arrivals: list[Arrival]) -> None:
    """Give answers without a completion their server request id: server/lsp.py sends a request's specdec/completed
    just before its answer, so a notification arriving right before an answer is that request's."""
    for previous, current in zip(arrivals, arrivals[1:]):
        sent = current.answer
        if sent is not None and sent.request_id is None and previous.note is not None:
            if previous.note["uri"] == URI:
                sent.request_id = previous.note["requestId"]


def _count(values) -> dict:
    counts: dict = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts
