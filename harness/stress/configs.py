"""Bad configurations: `specdec serve` given wrong settings, at initialize and later, must say what is wrong and
keep serving.

One server starts with bad initializationOptions (a missing model and badly typed values): it must report them
(window/showMessage, and the "error" status for the model), answer requests and recover when a
didChangeConfiguration names a good model. Then bad workspace/didChangeConfiguration cases are sent one at a time;
after each, an inline completion request must be answered without an error by a live process, and the good settings
are sent back. A case whose server died counts as a crash, and the server is restarted.

What a case expects follows server/options.py: a value of the wrong type or out of range is rejected with a message
naming it; an unknown key is logged and ignored (a newer client may send more); a model that cannot load gives a
message and the "error" status. A telemetry file the server cannot write is expected to be reported too, and numbers
too large for the model must not make completions fail.

The server shows at most POPUPS_PER_MINUTE messages a minute (server/log_limits.py; the log has the rest), so a
case due a message runs on a fresh server when the current one has shown that many. The short version runs every
case due no message and SHORT_DUE of the others, picked by the seed; the full version runs every case, and one
initialize whose options are not an object (the server then loads the default model).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lsprotocol import types

from speccomplete.server.log_limits import POPUPS_PER_MINUTE
from speccomplete.server.options import ServerOptions

from ..lib.session import stop_session
from .check import CheckResult
from .storm import StressSession, start_server, wait_for_status
from .wire import save_tiny_model

URI = "file:///specdec-stress/configs.py"
TEXT = "def add(a, b):\n    return \n\n\ndef sub(a, b):\n    "
# Where completions are asked for: at the end of "    return " (one line) and in the empty body of sub (a block)
POSITIONS = (types.Position(1, len("    return ")), types.Position(5, 4))
READY_TIMEOUT_S = 180.0  # for a model load (the default model's, in the full version)
ANSWER_TIMEOUT_S = 30.0
SHORT_DUE = 4  # cases due a message in the short version: two servers' worth of messages
# No model download is ever tried: a mistyped model name must fail at once, here as in a sandbox.
SERVER_ENV = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@dataclass
class Case:
    name: str
    settings: Any  # what goes under "specdec" in didChangeConfiguration (or the initializationOptions)
    mentions: tuple[str, ...] = ()  # what a clear message names; () when no message is due (the key is ignored)
    serves: bool = True  # completions can still work after it (else only a message can help)
    whole_settings: bool = False  # `settings` is didChangeConfiguration's whole settings, not its "specdec" part


@dataclass
class Outcome:
    case: Case
    answered: bool = False  # the request after it got an answer that is not an error
    alive: bool = False
    clear: bool = False  # the message it was due, naming what `mentions` lists (True when none was due)
    served_error: bool = False  # the request after it decoded to an "error" event
    undone: bool = True  # the good settings sent after it made the server ready again
    detail: str = ""

    @property
    def good(self) -> bool:
        return self.answered and self.alive and self.clear and not self.served_error and self.undone


def change_cases(workdir: Path) -> list[Case]:
    """Bad didChangeConfiguration settings, each sent on its own to a server with a good model."""
    a_file = workdir / "a-file"
    a_file.write_text("not a directory\n")
    return [
        Case("wrong type: maxTokensSingleLine", {"maxTokensSingleLine": "lots"}, ("maxTokensSingleLine",)),
        Case("zero: maxTokensSingleLine", {"maxTokensSingleLine": 0}, ("maxTokensSingleLine",)),
        Case("negative: maxTokensMultiLine", {"maxTokensMultiLine": -5}, ("maxTokensMultiLine",)),
        Case("negative: debounceMs", {"debounceMs": -1}, ("debounceMs",)),
        Case("fraction for an integer: debounceMs", {"debounceMs": 1.5}, ("debounceMs",)),
        Case("negative: temperature", {"temperature": -0.5}, ("temperature",)),
        Case("out of range: draftConfidence", {"draftConfidence": 2}, ("draftConfidence",)),
        Case("negative: rejectAfterS", {"rejectAfterS": -1}, ("rejectAfterS",)),
        Case("negative: promptBudgetChars", {"promptBudgetChars": -100}, ("promptBudgetChars",)),
        Case("null for a number: maxDocumentChars", {"maxDocumentChars": None}, ("maxDocumentChars",)),
        Case("unknown gamma policy", {"gamma": "fast"}, ("gamma",)),
        Case("number for a string: gamma", {"gamma": -1}, ("gamma",)),
        Case("unknown quantization", {"quantization": "int4"}, ("quantization",)),
        Case("unknown backend", {"backend": "vllm"}, ("backend",)),
        Case("string for a list: enabledLanguages", {"enabledLanguages": "python"}, ("enabledLanguages",)),
        Case("numbers in a list: enabledLanguages", {"enabledLanguages": [1, 2]}, ("enabledLanguages",)),
        Case("string for a boolean: telemetry", {"telemetry": "yes"}, ("telemetry",)),
        Case("empty string: target", {"target": ""}, ("target",)),
        Case("number for a string: target", {"target": 42}, ("target",)),
        Case("draft ngram+ngram", {"draft": "ngram+ngram"}, ("ngram+ngram",)),
        Case("settings not an object", "fast", ("must be an object",)),
        Case("missing model path", {"target": str(workdir / "no-such-model")}, ("no-such-model",)),
        Case("mistyped draft name", {"draft": "ngram+sefl"}, ("sefl",)),
        Case("draft without layer 0", {"draft": "layers:1,2"}, ("layers:1,2",)),
        Case("unknown device", {"device": "no-such-device"}, ("no-such-device",)),
        Case("unknown dtype", {"dtype": "float13"}, ("float13",)),
        Case(
            "llama.cpp with a missing GGUF",
            {"backend": "llamacpp", "gguf": str(workdir / "missing.gguf")},
            ("missing.gguf",),
        ),
        Case(
            "OpenAI backend at a closed port",
            {"backend": "openai", "openaiUrl": "http://127.0.0.1:9/v1"},
            ("127.0.0.1:9",),
            serves=False,
        ),
        Case(
            "telemetryPath not writable (its parent is a file)", {"telemetryPath": str(a_file / "x.jsonl")}, ("a-file",)
        ),
        Case("mistyped key", {"maxTokenSingleLine": 8}, ("maxTokensSingleLine",)),
        Case("huge: maxTokensSingleLine", {"maxTokensSingleLine": 10**9}, ("maxTokensSingleLine",)),
        Case("huge: maxTokensMultiLine", {"maxTokensMultiLine": 10**9}, ("maxTokensMultiLine",)),
        # due no message: ignored, or to be taken in stride
        Case("unknown key (ignored)", {"someNewerSetting": 8}),
        Case("no specdec section (ignored)", {"other": {"x": 1}}, whole_settings=True),
        Case("settings a list (ignored)", [1, 2], whole_settings=True),
        Case("telemetryPath in a missing directory (created)", {"telemetryPath": str(workdir / "new" / "x.jsonl")}),
    ]


def init_cases(workdir: Path) -> list[Case]:
    """Bad initializationOptions, all in one initialize (two messages: the rejected keys, the failed load)."""
    return [
        Case("initialize: missing model path", {"target": str(workdir / "no-such-model")}, ("no-such-model",)),
        Case("initialize: wrong type", {"maxTokensSingleLine": "lots"}, ("maxTokensSingleLine",)),
        Case("initialize: negative number", {"debounceMs": -3}, ("debounceMs",)),
        Case("initialize: mistyped gamma", {"gamma": "heuristc"}, ("gamma",)),
    ]


def run(seed: int, full: bool, workdir: Path) -> CheckResult:
    workdir = workdir / "configs"  # the checks share `workdir`
    workdir.mkdir(parents=True, exist_ok=True)
    outcomes, recovered = asyncio.run(_run(seed, full, workdir))
    result = CheckResult("configs", seed, full)
    due = [o for o in outcomes if o.case.mentions]
    answered = sum(o.answered and o.alive for o in outcomes)
    clear = sum(o.clear for o in due)
    crashes = sum(not o.alive for o in outcomes)
    served_errors = sum(o.served_error for o in outcomes)
    undone = sum(o.undone for o in outcomes)
    result.metrics = {
        "cases": len(outcomes),
        "cases_answered": answered,
        "cases_due_a_message": len(due),
        "cases_with_a_clear_message": clear,
        "crashes": crashes,
        "completions_failing_after_a_case": served_errors,
        "cases_undone_by_good_settings": undone,
        "recovered_from_a_failed_initialize": recovered,
        "cases_run": [o.case.name for o in outcomes],
    }
    result.target("cases answered by a live server", answered, f"== {len(outcomes)}", answered == len(outcomes))
    result.target("cases with a clear message", clear, f"== {len(due)}", clear == len(due))
    result.target("crashes", crashes, "== 0", crashes == 0)
    result.target("completions failing after a case", served_errors, "== 0", served_errors == 0)
    result.target("cases the good settings undo", undone, f"== {len(outcomes)}", undone == len(outcomes))
    result.target("recovers from a failed initialize", recovered, "== True", recovered)
    result.notes += [f"{o.case.name}: {o.detail}" for o in outcomes if not o.good]
    return result


async def _run(seed: int, full: bool, workdir: Path) -> tuple[list[Outcome], bool]:
    model = save_tiny_model(workdir / "model", seed)
    # Every setting at its default, so that sending them undoes any case; fp32 and no draft: the tiny model is for
    # settings, not speed.
    defaults = {_camel(name): value for name, value in dataclasses.asdict(ServerOptions()).items()}
    good = defaults | {
        "target": str(model),
        "quantization": "none",
        "draft": "none",
        "telemetryPath": str(workdir / "events.jsonl"),
    }
    cases = change_cases(workdir)
    random.Random(seed).shuffle(cases)  # a case must not depend on the ones before it
    due = [case for case in cases if case.mentions]
    silent = [case for case in cases if not case.mentions]
    cases = silent + (due if full else due[:SHORT_DUE])

    outcomes: list[Outcome] = []
    session = await start_server(good | _merged(init_cases(workdir)), READY_TIMEOUT_S, env=SERVER_ENV)
    try:
        recovered = await _bad_initialize(session, good, init_cases(workdir), outcomes)
        session = await _run_cases(session, good, cases, outcomes)
    finally:
        await stop_session(session)
    if full:
        outcomes.append(await _non_object_initialize())
    return outcomes, recovered


def _merged(cases: list[Case]) -> dict:
    return {key: value for case in cases for key, value in case.settings.items()}


async def _bad_initialize(session: StressSession, good: dict, cases: list[Case], outcomes: list[Outcome]) -> bool:
    """Report on the init cases, then ask for the good model: whether the server recovered."""
    _open_document(session)
    failed_load = session.statuses[-1]["state"] == "error"
    answered, detail = await _ask(session)
    for case in cases:
        outcome = Outcome(case, answered, session.alive, _clear(session.messages, case.mentions))
        outcome.detail = detail or f"messages: {_texts(session.messages)}"
        outcomes.append(outcome)
    if not session.alive:
        return False
    before = len(session.statuses)
    _configure(session, good)
    return failed_load and await _settled(session, before) == "ready" and (await _ask(session))[0]


async def _run_cases(session: StressSession, good: dict, cases: list[Case], outcomes: list[Outcome]) -> StressSession:
    """Each case, then the good settings back. A fresh server after a crash or a server stuck unready, and for a
    case due a message when this one has shown all it may (a case shows one message; undoing it shows none)."""
    for case in cases:
        if case.mentions and len(session.messages) >= POPUPS_PER_MINUTE:
            session = await _restart(session, good)
        outcome = await _bad_change(session, case)
        outcomes.append(outcome)
        before = len(session.statuses)
        if session.alive:
            _configure(session, good)
        if not session.alive or await _settled(session, before) != "ready":
            outcome.undone = False
            outcome.detail += f"; the good settings did not bring it back (server alive: {session.alive})"
            session = await _restart(session, good)
    return session


async def _restart(session: StressSession, good: dict) -> StressSession:
    await stop_session(session)
    session = await start_server(good, READY_TIMEOUT_S, env=SERVER_ENV)
    _open_document(session)
    return session


async def _bad_change(session: StressSession, case: Case) -> Outcome:
    outcome = Outcome(case)
    messages, statuses = len(session.messages), len(session.statuses)
    _configure(session, case.settings, whole=case.whole_settings)
    if await _settled(session, statuses) == "unsettled":
        outcome.detail = f"a model load it started did not end in {READY_TIMEOUT_S:.0f} s; "
    notes = len(session.arrivals)
    outcome.answered, detail = await _ask(session)
    outcome.alive = session.alive
    failed = any(a.note and a.note["outcome"] == "error" for a in session.arrivals[notes:])
    outcome.served_error = case.serves and failed
    new = session.messages[messages:]
    outcome.clear = _clear(new, case.mentions)
    outcome.detail += detail or f"messages: {_texts(new)}"
    if outcome.served_error:
        outcome.detail = "the completion after it failed (event outcome error); " + outcome.detail
    if not session.alive:
        outcome.detail = "the server died: " + " | ".join(list(session.stderr)[-3:])
    return outcome


async def _settled(session: StressSession, since: int) -> str:
    """The server's state once a settings change sent after status `since` has taken effect ("unsettled" when a
    model load it started does not end in time).

    A request answered after the change is a sync point: a model load the change started has already said
    "loading" by then (server/lsp.py starts it while handling the change); if one did, its end is waited for."""
    await _ask(session)
    loading = [i for i, s in enumerate(session.statuses) if i >= since and s.get("state") == "loading"]
    if not loading:
        return session.statuses[-1]["state"] if session.statuses else "none"
    try:
        return (await wait_for_status(session, loading[-1] + 1, READY_TIMEOUT_S))["state"]
    except RuntimeError:
        return "unsettled"


async def _non_object_initialize() -> Outcome:
    """initializationOptions that are not an object: reported, and the server goes on with the defaults."""
    case = Case("initialize: options not an object", "fast", ("must be an object",))
    session = await start_server(case.settings, READY_TIMEOUT_S, env=SERVER_ENV)
    try:
        _open_document(session)
        answered, detail = await _ask(session)
        outcome = Outcome(case, answered, session.alive, _clear(session.messages, case.mentions))
        outcome.detail = detail or f"messages: {_texts(session.messages)}"
    finally:
        await stop_session(session)
    return outcome


async def _ask(session: StressSession) -> tuple[bool, str]:
    """Invoked inline completions at POSITIONS: (all answered without an error, what went wrong)."""
    for position in POSITIONS:
        params = types.InlineCompletionParams(
            text_document=types.TextDocumentIdentifier(URI),
            position=position,
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Invoked),
        )
        if not session.alive:
            return False, "the server is not running"
        started = time.monotonic()
        try:
            await asyncio.wait_for(session.client.text_document_inline_completion_async(params), ANSWER_TIMEOUT_S)
        except TimeoutError:
            return False, f"no answer in {ANSWER_TIMEOUT_S:.0f} s"
        except Exception as e:  # an error answer, or the process died
            return False, f"answered with {e!r} after {time.monotonic() - started:.1f} s"
    return True, ""


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def _configure(session: StressSession, settings: Any, whole: bool = False) -> None:
    session.client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings=settings if whole else {"specdec": settings})
    )


def _open_document(session: StressSession) -> None:
    session.client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(uri=URI, language_id="python", version=1, text=TEXT))
    )


def _clear(messages: list[types.ShowMessageParams], mentions: tuple[str, ...]) -> bool:
    """A warning or error message naming everything in `mentions` (a case with none is due no message)."""
    if not mentions:
        return True
    serious = (types.MessageType.Error, types.MessageType.Warning)
    return any(m.type in serious and all(word in m.message for word in mentions) for m in messages)


def _texts(messages: list[types.ShowMessageParams]) -> list[str]:
    return [m.message[:160] for m in messages]
