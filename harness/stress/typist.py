"""A typist against the real `specdec serve`: pauses as a person makes them, in real files.

For each file: open it with one line's text cut out after its indentation, as if about to write it; type a
dozen keys of it at about 10 keys/s and pause; a dozen more and pause; then the rest of the line, Enter and
the next line's indentation, and pause. Where that last answer is a block's first lines (`blockBudgetMs`),
take them as Tab does and ask where they end. Each key is a didChange, a `$/cancelRequest` for the previous
request if unanswered and an automatic inline completion request, as VS Code sends them. At a pause the
typist waits for the answer and a moment more.

Measured per pause, key to answer: the first pause in a file just opened apart from the later ones,
single-line and block answers apart (the server's own `multiline`), p50 and p90; the answers shown; the wait
for a block's next lines after taking its first; and the server's CPU while the keys come, in cores (its user
and system time over the typing's wall time, pauses left out).

It runs the server on the same files and keys under each setting of one rhythm (`RHYTHMS`): steady typing at
about 10 keys/s on the defaults and with `prefillOnEdit` off (what reading a file's prompt at its first edit
buys); 5 keys/s with a short pause after each word, on the defaults and at a 300 ms debounce (what the
debounce costs in decodes started and cancelled, and in CPU); about 8 keys/s with gaps as uneven as people's,
on the defaults and at a 150 ms debounce; or 10 keys/s with `compileStep` off, then on the defaults at
a first start (which builds the step while the keys come, unless the model cache holds it) and again (which
loads it).
The full version types into a few of the package's own modules with the default model (`--files` names
others); the short one into one, with a tiny random model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from lsprotocol import types

from speccomplete.metrics import percentile
from speccomplete.server.language import detect_language
from speccomplete.server.lsp import ACCEPT
from speccomplete.server.positions import utf16_len

from ..lib.output import rounded
from ..lib.session import compiled_step_in_use, stop_session
from .check import CheckResult
from .storm import Storm, start_server
from .wire import save_tiny_model

BURST = 12  # keys before a pause
SETTLE_S = 1.0  # after a pause's answer, before the next key
MIN_LINE = 2 * BURST + 4  # a line typed: long enough for two bursts and a rest
# real files of a few sizes and kinds: the package's own (installed with it)
MODULES = (
    "speccomplete.server.prompt",
    "speccomplete.server.lsp",
    "speccomplete.decoder.engine",
    "speccomplete.decoder.sampling",
    "speccomplete.decoder.kv_cache",
    "speccomplete.telemetry.analysis.statistics",
    "speccomplete.harness.bench.summary",
    "speccomplete.server.filters",
)
TAKEN = "next lines after taking a block's first"


@dataclass(frozen=True)
class Rhythm:
    """How the keys come, and the server settings compared under it (each run on the same files and keys)."""

    key_s: tuple[float, float]  # between two keys: uniform over it
    word_pause_s: tuple[float, float]  # after a space, besides: the short pause between words
    settings: dict[str, dict]
    key_spread: float = 0.0  # if set, the gap between two keys is log-normal: key_s[0] times e^N(0, key_spread)

    def key_gap(self, rng: random.Random) -> float:
        if self.key_spread:
            return self.key_s[0] * rng.lognormvariate(0, self.key_spread)
        return rng.uniform(*self.key_s)


RHYTHMS = {
    # about 10 keys/s without stopping inside a line: what reading a file's prompt at its first edit buys
    "steady": Rhythm((0.07, 0.13), (0.0, 0.0), {"defaults": {}, "prefillOnEdit off": {"prefillOnEdit": False}}),
    # about 5 keys/s with a short pause after each word, long enough for the debounce to fire: what the
    # debounce costs in decodes started and cancelled, and in CPU
    "words": Rhythm((0.15, 0.25), (0.3, 0.6), {"defaults": {}, "debounceMs 300": {"debounceMs": 300}}),
    # about 8 keys/s, the gaps between keys as uneven as people's (log-normal, a median of 120 ms): what the
    # debounce waits and costs for such a typist, at its default floor and at 150 ms
    "uneven": Rhythm((0.12, 0.12), (0.0, 0.0), {"defaults": {}, "debounceMs 150": {"debounceMs": 150}}, 0.45),
    # about 10 keys/s, without the compiled step and with it (the default): the defaults' first start builds it
    # while the keys come (unless the model cache holds it), and their second loads what the first built
    "compiled": Rhythm(
        (0.07, 0.13),
        (0.0, 0.0),
        {"compileStep off": {"compileStep": False}, "defaults": {}, "defaults again": {}},
    ),
}


@dataclass(frozen=True)
class Plan:
    files: int
    ready_timeout_s: float
    answer_timeout_s: float


FULL = Plan(files=len(MODULES), ready_timeout_s=900, answer_timeout_s=120)
SHORT = Plan(files=1, ready_timeout_s=180, answer_timeout_s=60)


@dataclass
class Pause:
    file: str
    first: bool  # the first pause in the file just opened
    latency_ms: float | None  # key sent to answer; None: never answered
    multiline: bool | None  # the server's: a block was asked for (None: no event for it)
    shown: bool


@dataclass
class Taken:
    """A staged block's first lines taken (Tab): the wait for its next lines."""

    latency_ms: float | None  # None: never answered
    shown: bool


@dataclass
class Typed:
    """One setting's run: its pauses, the blocks taken, and the server's CPU over the typing."""

    pauses: list[Pause] = field(default_factory=list)
    taken: list[Taken] = field(default_factory=list)
    decodes: int = 0  # decodes the server started (its events with a prompt read)
    decodes_cancelled: int = 0  # of those, stopped by the next key
    typing_s: float = 0.0
    cpu_s: float = 0.0
    compiled_in_use_s: float | None = None  # from the server's start to its compiled step in use (compileStep)


def module_file(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    return Path(spec.origin)


def cpu_seconds(pid: int) -> float:
    """The process's user and system time (/proc/<pid>/stat); 0 where there is none."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def typing_spot(text: str) -> tuple[int, str] | None:
    """Where to type in `text`: the offset after the indentation of the first long line past its middle, and
    that line's text from there, with Enter and the next line's indentation; None if no line will do."""
    lines = text.splitlines(keepends=True)
    offset = 0
    for index, line in enumerate(lines):
        body = line.strip()
        if offset >= len(text) // 2 and len(body) >= MIN_LINE and index + 1 < len(lines):
            indent = len(line) - len(line.lstrip(" \t"))
            following = lines[index + 1]
            return offset + indent, line[indent:] + following[: len(following) - len(following.lstrip(" \t"))]
        offset += len(line)
    return None


async def _type_file(
    session, events: Path, path: Path, label: str, plan: Plan, rhythm: Rhythm, rng: random.Random, typed: Typed
) -> None:
    text = path.read_text()
    spot = typing_spot(text)
    if spot is None:
        return
    start, keys = spot
    document = text[:start] + text[start + len(keys) :]
    uri = f"file:///specdec-typist/{label}/{path.name}"
    storm = Storm(session, uri=uri)
    session.client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri, detect_language(str(path), None, text), storm.version, document)
        )
    )
    lines = text[:start].split("\n")
    line, column = len(lines) - 1, utf16_len(lines[-1])
    pauses_at = {BURST, 2 * BURST, len(keys)}
    burst_began, burst_cpu = time.monotonic(), cpu_seconds(session.process.pid)
    await asyncio.sleep(rhythm.key_gap(rng))
    for index, character in enumerate(keys, start=1):
        storm.type_key(character, line, column)
        line, column = (line + 1, 0) if character == "\n" else (line, column + utf16_len(character))
        sent = storm.request(line, column, before_pause=index in pauses_at)
        if index not in pauses_at:
            await asyncio.sleep(rhythm.key_gap(rng) + (rng.uniform(*rhythm.word_pause_s) if character == " " else 0))
            continue
        typed.typing_s += time.monotonic() - burst_began
        typed.cpu_s += cpu_seconds(session.process.pid) - burst_cpu
        deadline = sent.sent + plan.answer_timeout_s
        while sent.answered is None and time.monotonic() < deadline and session.alive:
            await asyncio.sleep(0.005)
        event = await _event_of(session, events, sent)
        typed.pauses.append(
            Pause(
                path.name,
                first=index == BURST,
                latency_ms=sent.latency_ms if not sent.cancelled_answer else None,
                multiline=None if event is None else event["multiline"],
                shown=bool(sent.text),
            )
        )
        await asyncio.sleep(SETTLE_S)
        if index == len(keys) and sent.text and event is not None and event["stage"] == "first":
            typed.taken.append(await _take(storm, sent, line, column, plan))
        burst_began, burst_cpu = time.monotonic(), cpu_seconds(session.process.pid)
    session.client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))


async def _take(storm: Storm, sent, line: int, column: int, plan: Plan) -> Taken:
    """Tab on a staged block's first lines, as VS Code does it: the lines inserted in one change, the item's
    command, and a request where they end. The wait from then to the next lines."""
    storm.type_key(sent.text, line, column)
    storm.session.client.protocol.send_request(
        types.WORKSPACE_EXECUTE_COMMAND, types.ExecuteCommandParams(command=ACCEPT, arguments=[sent.request_id])
    )
    lines = sent.text.split("\n")
    end = (line + len(lines) - 1, (column if len(lines) == 1 else 0) + utf16_len(lines[-1]))
    following = storm.request(*end, before_pause=True)
    while following.answered is None and time.monotonic() < following.sent + plan.answer_timeout_s:
        await asyncio.sleep(0.005)
    return Taken(following.latency_ms if not following.cancelled_answer else None, bool(following.text))


async def _event_of(session, events: Path, sent) -> dict | None:
    """The request's telemetry event (its `multiline` is the server's): the server sends a request's
    `specdec/completed`, which names it, just before its answer, and writes the event before both."""
    arrivals = session.arrivals
    at = next((i for i, a in enumerate(arrivals) if a.answer is sent), None)
    note = arrivals[at - 1].note if at else None
    if note is None:
        return None
    for line in reversed(events.read_text().splitlines() if events.exists() else []):
        event = json.loads(line)
        if event.get("request_id") == note["requestId"] and event.get("record") != "outcome":
            return event
    return None


async def _run_setting(
    name: str, settings: dict, files: list[Path], plan: Plan, rhythm: Rhythm, seed: int, workdir: Path, model
) -> Typed:
    events_path = workdir / f"events-{name.replace(' ', '-')}.jsonl"
    events_path.unlink(missing_ok=True)
    options = {"telemetryPath": str(events_path)} | settings
    if model is not None:
        options |= {"target": str(model), "quantization": "none"}
    started = time.monotonic()
    session = await start_server(options, plan.ready_timeout_s)
    typed = Typed()
    try:
        if session.statuses[-1]["state"] != "ready":
            raise RuntimeError(f"the server could not load its models: {session.statuses[-1].get('message')}")
        rng = random.Random(seed)
        for path in files:
            await _type_file(session, events_path, path, name.replace(" ", "-"), plan, rhythm, rng, typed)
    finally:
        await stop_session(session)
    typed.compiled_in_use_s = _compiled_in_use_s(session.statuses, session.status_times, started)
    events = [json.loads(line) for line in events_path.read_text().splitlines()] if events_path.exists() else []
    decoded = [e for e in events if e.get("record") != "outcome" and e["prompt_tokens"] > 0]
    typed.decodes = len(decoded)
    typed.decodes_cancelled = sum(e["outcome"] == "cancelled" for e in decoded)
    return typed


def _compiled_in_use_s(statuses: list[dict], times: list[float], started: float) -> float | None:
    """Seconds from the start to the first status that is no longer `optimizing` after one that was; None
    where the server never optimized, or was still at it when the typing ended."""
    index = compiled_step_in_use(statuses)
    return None if index is None else round(times[index] - started, 1)


def run(seed: int, full: bool, workdir: Path, files: list[Path] | None = None, rhythm: str = "steady") -> CheckResult:
    plan = FULL if full else SHORT
    workdir = workdir / "typist"
    workdir.mkdir(parents=True, exist_ok=True)
    chosen = files or [module_file(module) for module in MODULES[: plan.files]]
    model = None if full else save_tiny_model(workdir / "model", seed)
    keys = RHYTHMS[rhythm]
    runs = {
        name: asyncio.run(_run_setting(name, settings, chosen, plan, keys, seed, workdir, model))
        for name, settings in keys.settings.items()
    }
    return report(runs, seed, full)


def summary(typed: Typed) -> dict:
    """p50 and p90 latency (ms) and shown counts per kind of pause, and the CPU while typing."""
    kinds = {
        "first pause, single line": lambda p: p.first and p.multiline is False,
        "first pause, block": lambda p: p.first and p.multiline is True,
        "later pause, single line": lambda p: not p.first and p.multiline is False,
        "later pause, block": lambda p: not p.first and p.multiline is True,
        "first pause, any": lambda p: p.first,
        "later pause, any": lambda p: not p.first,
    }
    out: dict = {}
    for kind, chosen in kinds.items():
        pauses = [p for p in typed.pauses if chosen(p)]
        latencies = [p.latency_ms for p in pauses if p.latency_ms is not None]
        out[kind] = {
            "n": len(pauses),
            "p50_ms": rounded(percentile(latencies, 50), 1),
            "p90_ms": rounded(percentile(latencies, 90), 1),
            "shown": sum(p.shown for p in pauses),
            "unanswered": len(pauses) - len(latencies),
        }
    waits = [t.latency_ms for t in typed.taken if t.latency_ms is not None]
    out[TAKEN] = {
        "n": len(typed.taken),
        "p50_ms": rounded(percentile(waits, 50), 1),
        "p90_ms": rounded(percentile(waits, 90), 1),
        "shown": sum(t.shown for t in typed.taken),
        "unanswered": len(typed.taken) - len(waits),
    }
    out["compiled_in_use_s"] = typed.compiled_in_use_s
    out["decodes_started"] = typed.decodes
    out["decodes_cancelled"] = typed.decodes_cancelled
    out["cores_while_typing"] = rounded(typed.cpu_s / typed.typing_s, 3) if typed.typing_s else None
    return out


def report(runs: dict[str, Typed], seed: int, full: bool) -> CheckResult:
    result = CheckResult("typist", seed, full)
    result.metrics = {name: summary(typed) for name, typed in runs.items()}
    result.metrics["pauses"] = {name: [vars(p) for p in typed.pauses] for name, typed in runs.items()}
    result.metrics["taken"] = {name: [vars(t) for t in typed.taken] for name, typed in runs.items()}
    defaults = result.metrics["defaults"]
    everything = [p for typed in runs.values() for p in typed.pauses]
    unanswered = sum(p.latency_ms is None for p in everything)
    result.target("pauses never answered", unanswered, "== 0", unanswered == 0)
    result.target("pauses", len(everything), ">= 3", len(everything) >= 3)
    if full:
        first = defaults["first pause, any"]["p50_ms"]
        later = defaults["later pause, single line"]["p50_ms"]
        cores = defaults["cores_while_typing"]
        result.target(
            "first pause in a file just opened, p50 (ms)", first, "<= 500", first is not None and first <= 500
        )
        result.target("later single-line pause, p50 (ms)", later, "<= 200", later is not None and later <= 200)
        result.target("cores while typing", cores, "<= 0.25", cores is not None and cores <= 0.25)
    for name, typed in runs.items():
        summary_ = result.metrics[name]
        result.notes.append(
            f"{name}: first pause p50/p90 {summary_['first pause, any']['p50_ms']}/"
            f"{summary_['first pause, any']['p90_ms']} ms, later single-line "
            f"{summary_['later pause, single line']['p50_ms']}/{summary_['later pause, single line']['p90_ms']} ms, "
            f"later block {summary_['later pause, block']['p50_ms']}/{summary_['later pause, block']['p90_ms']} ms, "
            f"shown {sum(p.shown for p in typed.pauses)}/{len(typed.pauses)}, next lines after a Tab "
            f"{summary_[TAKEN]['p50_ms']} ms (n={len(typed.taken)}), "
            f"{summary_['cores_while_typing']} cores while typing, decodes started {typed.decodes}, "
            f"cancelled {typed.decodes_cancelled}"
            + (f", compiled step in use {typed.compiled_in_use_s} s after the start" if typed.compiled_in_use_s else "")
        )
    return result
