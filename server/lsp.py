"""The specdec language server: thin LSP handlers over server/completion.py.

Threads: the asyncio event loop reads and answers messages; one worker thread loads the models
and runs every decode (the models are not thread-safe), so the loop keeps reading while a decode
runs, and a newer request or `$/cancelRequest` can stop it between rounds.

Server -> client notifications beyond LSP:
- `specdec/status` {"state": "loading"|"ready"|"error", "message", "percentage", "acceptance",
  "p50_ms"}: the status bar. `percentage` (0-100, or null) is how far a first run's model conversion
  got, as in the `$/progress` reports; `acceptance` is the share of resolved completions the user
  accepted, `p50_ms` the median latency, both over the last 100.
- `specdec/completed` {"uri", "requestId", "outcome", "latencyMs", "reason"} after each completion
  request that reached the pipeline, so a harness can tie its own records to the event's request id and
  a client can say why an answer was empty (`reason`, the event's `empty_reason`; null when shown).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import statistics
import sys
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlparse

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol, lsp_method

from speccomplete.telemetry.events import Outcome, Trigger
from speccomplete.telemetry.log import EventLog

from .completion import (
    Completion,
    Engine,
    Request,
    cancelled,
    complete,
    load_engine,
    retune,
    reuse,
    typed_along,
)
from .documents import use_lsp_lines, valid_text
from .jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, SERVER_NOT_INITIALIZED, Reply
from .log_limits import limit_logging
from .options import ServerOptions, models_changed, parse_options
from .positions import PositionError, offset_at, utf16_len
from .snippets import MAX_DOCUMENTS, OpenDocument
from .transport import serve_stdio, serve_tcp

log = logging.getLogger(__name__)

VERSION = "0.1.0"
STATUS = "specdec/status"
SUPERSEDED_KEPT = 32  # superseded completions an accept may still name
COMPLETED = "specdec/completed"
ACCEPT = "specdec.accept"
Lane = Literal["inline", "completion"]  # the two requests a client may send on every key (completion_at)
LANES: tuple[Lane, ...] = ("inline", "completion")
POPUPS_PER_MINUTE = 3  # a client sending bad settings in a loop must not bury the editor in popups


class AnsweredError(JsonRpcInvalidParams):
    """A malformed request that has already been answered with an error."""


class Protocol(LanguageServerProtocol):
    """pygls' LSP protocol, fed checked messages by server/transport.py, answering every request.

    `receive` adds what pygls leaves out: requests before `initialize`, a second `initialize` and requests
    after `shutdown` get LSP's errors instead of silence, and no error sent to the client carries a
    traceback (the log has it)."""

    initialized = False  # this session has received its initialize request

    def reply(self, reply: Reply) -> None:
        self._send_data(reply.payload())

    def receive(self, message: dict) -> None:
        method, msg_id = message.get("method"), message.get("id")
        is_request = "id" in message and "method" in message
        refusal = self.refusal(method)
        if refusal is not None:
            if is_request:
                self.reply(Reply(msg_id, *refusal))
            else:
                log.warning("dropping %s: %s", method, refusal[1])
            return
        if is_request and method == types.INITIALIZE:
            self.initialized = True
        try:
            structured = self.structure_message(message)
        except AnsweredError:
            return
        except JsonRpcException as e:  # a notification pygls cannot read; nobody to answer
            log.warning("dropping a malformed %s: %s", method, e.__cause__ or e)
            return
        try:
            self.handle_message(structured)
        except Exception as e:  # pygls fails on some values it let through (a dict as $/cancelRequest's id)
            log.exception("could not handle %s", method)
            if is_request:
                self.reply(Reply(msg_id, INTERNAL_ERROR, f"internal error: {type(e).__name__}"))

    def refusal(self, method) -> tuple[int, str] | None:
        """Why a message with `method` is not handled now (LSP's error code and message), or None.
        Responses to the server's own requests (no method) are always handled."""
        if method is None or method == types.EXIT:
            return None
        if method == types.INITIALIZE and self.initialized:
            return INVALID_REQUEST, "initialize was already received"
        if not self.initialized and method != types.INITIALIZE:
            return SERVER_NOT_INITIALIZED, "the server is not initialized"
        if self._shutdown:
            return INVALID_REQUEST, "the server is shutting down"
        return None

    def end_session(self) -> None:
        """Forget the session (its client left): the next client starts with initialize."""
        for future in self._request_futures.values():
            future.cancel()
        self._request_futures.clear()
        self._workspace = None
        self._shutdown = False
        self.initialized = False
        self.writer = None

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        # server/positions.py counts UTF-16 code units, LSP's default; never negotiate UTF-8 or UTF-32.
        general = params.capabilities.general
        if general is not None and general.position_encodings:
            general.position_encodings = [types.PositionEncodingKind.Utf16]
        return (yield from super().lsp_initialize(params))

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except JsonRpcException as e:
            # pygls logs a request it cannot parse and never answers it, so the client would wait forever.
            if "id" in data and "method" in data:
                detail = str(e.__cause__ or e)[:300]
                error = JsonRpcInvalidParams(f"malformed {data['method']} params: {detail}")
                self._send_response(data["id"], error=error.to_response_error())
                raise AnsweredError(error.message) from e
            raise

    def _send_response(self, msg_id, result=None, error=None):
        if error is not None and error.data is not None:
            log.error("error answered to request %s: %s %s", msg_id, error.message, error.data)
            error = types.ResponseError(error.code, error.message)  # a traceback is for the log, not the client
        if error is not None and msg_id is None:  # pygls would drop the null id (Reply.payload says why)
            self._send_data(Reply(None, error.code, error.message).payload())
            return
        super()._send_response(msg_id, result, error)


class Worker:
    """One thread that runs jobs in order: the models are not thread-safe.

    A daemon thread, unlike ThreadPoolExecutor's, so that exiting never waits for a model load.
    """

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def submit(self, fn, *args) -> Future:
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="specdec-decode", daemon=True)
            self.thread.start()
        future: Future = Future()
        self.jobs.put((future, fn, args))
        return future

    def _run(self) -> None:
        while True:
            future, fn, args = self.jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args))
                except BaseException as e:
                    future.set_exception(e)


@dataclass
class Shown:
    """The latest completion shown in a document, until the user accepts it or moves on."""

    request_id: str
    prefix: str  # the document before the cursor when it was requested
    suffix: str  # and after it
    completion: Completion
    tracked: bool  # whether its outcome is recorded (options.track_outcomes)
    outcome: Outcome | None = None  # the verdict recorded so far
    timer: asyncio.TimerHandle | None = None  # records "rejected" when nothing happens in time


class SpecdecServer(LanguageServer):
    protocol: Protocol

    def __init__(self):
        super().__init__("specdec", VERSION, protocol_cls=Protocol)
        self.options = ServerOptions()
        self.engine: Engine | None = None
        self.state, self.state_message = "loading", "waiting for initialize"
        self.worker = Worker()
        self.events: EventLog | None = None  # made by configure() at initialize
        self.running: dict[tuple[str, Lane], threading.Event] = {}  # by URI and lane, the cancel switch of its decode
        # by (URI, version, line, character): the lane and answer of the request in flight there
        self.pending: dict[tuple, tuple[Lane, asyncio.Future]] = {}
        self.shown: dict[str, Shown] = {}  # by document URI
        # completions another request superseded lately, by request id: an accept can still be on its way
        # (the other lane, or the client's own next request, replaced it a moment before the user took it)
        self.superseded: dict[str, Shown] = {}
        self.recent: dict[str, None] = {}  # URIs of open documents, the most recently edited or asked for last
        self.loads = 0  # counts model loads, so a superseded load does not install its models
        self.load_progress: tuple[int, str] | None = None  # the last (percentage, message) reported
        self.load_task: asyncio.Task | None = None
        self.loaded_with: ServerOptions | None = None  # the options the engine was loaded with
        self.latencies: deque[float] = deque(maxlen=100)
        self.verdicts: deque[bool] = deque(maxlen=100)  # accepted (or typed along) vs rejected
        self.popups: deque[float] = deque()  # when error popups were shown, within the last minute
        self.shown_errors: dict[str, float] = {}  # popup text -> when it was last shown
        self.telemetry_failed = False  # the event log could not be written (shown once per log)

    def report_server_error(self, error, source):
        # Logged (rate-limited: server/log_limits.py), never shown: a popup per malformed message floods the
        # editor, and the user can do nothing about a client's bad message.
        log.warning("%s: %s", source.__name__, error)

    # ------------------------------------------------------------------ TCP sessions (server/transport.py)

    def attach(self, writer) -> None:
        self.protocol.set_writer(writer)

    def detach(self) -> None:
        """The client left: cancel its work, settle its completions and forget its documents."""
        for cancel in self.running.values():
            cancel.set()
        self.running.clear()
        for shown in self.shown.values():
            self.resolve(shown, "rejected")
        self.shown.clear()
        self.superseded.clear()  # the next client cannot accept this one's
        self.protocol.end_session()

    # ------------------------------------------------------------------ settings and models

    def configure(self, raw) -> ServerOptions:
        """Apply settings; report rejected keys to the user. Returns the previous options."""
        old = self.options
        self.options, errors = parse_options(raw, old)
        if errors:
            message = "specdec: some settings were rejected and keep their previous value: " + "; ".join(errors)
            log.error("%s", message)
            self.show_error(message)
        new = self.options
        log_fields = ("telemetry", "telemetry_path", "telemetry_retention_days", "telemetry_max_megabytes")
        if self.events is None or any(getattr(old, f) != getattr(new, f) for f in log_fields):
            if self.events is not None:
                self.events.close()
            self.events = EventLog(
                new.telemetry_path,
                enabled=new.telemetry,
                keep_days=new.telemetry_retention_days,
                keep_bytes=new.telemetry_max_megabytes * 2**20,
            )
            self.telemetry_failed = False
        return old

    def show_error(self, message: str) -> None:
        """An error popup in the editor: at most POPUPS_PER_MINUTE, and the same text at most once in
        ten minutes (a failing backend fails every completion alike). The log has every one."""
        now = time.monotonic()
        while self.popups and now - self.popups[0] > 60:
            self.popups.popleft()
        if len(self.popups) >= POPUPS_PER_MINUTE or now - self.shown_errors.get(message, -600.0) < 600:
            log.warning("not shown again: %s", message)
            return
        self.popups.append(now)
        self.shown_errors[message] = now
        self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=message))

    def start_loading(self) -> None:
        self.loads += 1
        self.load_progress = None
        self.engine = None  # free the old models before loading new ones; requests answer empty meanwhile
        for cancel in self.running.values():
            cancel.set()  # the load waits on the worker behind them
        self.load_task = asyncio.ensure_future(self.load(self.loads, self.options))

    async def load(self, load_id: int, options: ServerOptions) -> None:
        what = f"{options.target} with draft {options.draft}"
        self.set_status("loading", f"loading {what}")
        token = await self.begin_progress(f"specdec-load-{load_id}", f"loading {what}")
        loop = asyncio.get_running_loop()

        def progress(fraction: float, message: str) -> None:  # called on the worker thread
            loop.call_soon_threadsafe(self.report_progress, load_id, token, round(fraction * 100), message)

        try:
            engine = await asyncio.wrap_future(self.worker.submit(load_engine, options, progress))
        except Exception as e:  # any failure (missing model, OOM, bad draft spec) leaves the server up
            log.exception("could not load %s", what)
            if load_id == self.loads:
                # the message first: a client that sees the error state has the reason already
                self.show_error(f"specdec: could not load the models ({what}): {e}")
                self.set_status("error", f"could not load {what}: {e}")
            self.end_progress(token, "failed")
            return
        self.end_progress(token, "ready")
        if load_id != self.loads:
            return  # the settings changed while it loaded; the newer load installs its own
        self.engine, self.loaded_with = engine, options
        log.info("models ready: %s on %s", what, engine.device)
        self.set_status("ready", f"{engine.target} + {engine.draft} on {engine.device}")

    async def begin_progress(self, token: str, message: str) -> str | None:
        if not getattr(self.client_capabilities.window, "work_done_progress", False):
            return None
        try:
            await self.work_done_progress.create_async(token)
        except Exception as e:  # the client refused; loading goes on without a progress bar
            log.warning("window/workDoneProgress/create failed: %s", e)
            return None
        # a percentage in the begin tells the client to draw a bar that the reports fill
        begin = types.WorkDoneProgressBegin(title="specdec", message=message, percentage=0)
        self.work_done_progress.begin(token, begin)
        return token

    def report_progress(self, load_id: int, token: str | None, percentage: int, message: str) -> None:
        """A load's progress, once per whole percent (the reports come twice a second)."""
        if load_id != self.loads or (percentage, message) == self.load_progress:
            return  # a newer load has its own bar; or nothing new to say
        self.load_progress = (percentage, message)
        if token is not None:
            self.work_done_progress.report(token, types.WorkDoneProgressReport(message=message, percentage=percentage))
        self.set_status("loading", f"{message} ({percentage}%)")

    def end_progress(self, token: str | None, message: str) -> None:
        if token is not None:
            self.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))

    def set_status(self, state: str, message: str) -> None:
        self.state, self.state_message = state, message
        self.send_status()

    def send_status(self) -> None:
        self.protocol.notify(
            STATUS,
            {
                "state": self.state,
                "message": self.state_message,
                "percentage": self.load_progress[0] if self.state == "loading" and self.load_progress else None,
                "acceptance": sum(self.verdicts) / len(self.verdicts) if self.verdicts else None,
                "p50_ms": statistics.median(self.latencies) if self.latencies else None,
            },
        )

    # ------------------------------------------------------------------ completions

    def touch(self, uri: str) -> None:
        self.recent.pop(uri, None)
        self.recent[uri] = None

    def other_documents(self, uri: str) -> tuple[OpenDocument, ...]:
        """The open documents but `uri`'s, the most recently edited or asked for first: the editor's other
        tabs, for context from beyond the prompt (server/snippets.py)."""
        documents = self.workspace.text_documents
        order = [u for u in reversed(self.recent) if u in documents]
        order += [u for u in documents if u not in self.recent]
        others = [u for u in order if u != unquote(uri)][:MAX_DOCUMENTS]
        return tuple(OpenDocument(path_of(u), documents[u].source) for u in others)

    def open_document(self, uri: str):
        """The open document at `uri`, or None. pygls files documents under their unquoted URIs, so a
        percent-encoded one (spaces, non-ASCII names, `file:///c%3A/...`) is looked up unquoted too."""
        return self.workspace.text_documents.get(unquote(uri))

    async def completion_at(
        self, uri: str, position: types.Position, trigger: Trigger, lane: Lane = "inline"
    ) -> Completion | None:
        """The completion to show at `position`, or None. Raises JsonRpcInvalidParams for a bad position.

        Lanes: inline completion and `textDocument/completion` (a completion plugin asks on every key).
        A newer request supersedes only the older one of its own lane, and a request for the very
        position and version the other lane is decoding waits for that decode instead of starting one.
        """
        document = self.open_document(uri)
        if document is None:
            log.warning("completion requested for %s, which is not open; empty answer", uri)
            return None
        if self.engine is None:
            log.info("completion requested while the models are %s; empty answer", self.state)
            return None
        key = (uri, document.version, position.line, position.character)
        other_lane, shared = self.pending.get(key, (lane, None))
        if shared is not None and other_lane != lane:
            result, answered = await asyncio.shield(shared)
            if answered:
                return result
            # the client cancelled the other lane's request (VS Code does, as it opens its suggest widget
            # for the same spot): this one still wants an answer, so it decodes on its own
            document = self.open_document(uri)
            if document is None or self.engine is None:
                return None
        ours = (lane, asyncio.get_running_loop().create_future())
        self.pending[key] = ours
        result, answered = None, False
        try:
            result = await self.complete_in_lane(uri, document, position, trigger, lane, self.engine)
            answered = True
            return result
        finally:
            if self.pending.get(key) is ours:
                del self.pending[key]
            ours[1].set_result((result, answered))

    async def complete_in_lane(
        self, uri: str, document, position: types.Position, trigger: Trigger, lane: Lane, engine: Engine
    ) -> Completion | None:
        superseded = self.running.pop((uri, lane), None)
        if superseded is not None:
            superseded.set()  # its decode stops at the end of its current round
        version = document.version
        self.touch(unquote(uri))
        request = Request(
            uuid.uuid4().hex,
            document.source,
            path_of(uri),
            document.language_id,
            position.line,
            position.character,
            trigger,
            time.perf_counter(),
            self.other_documents(uri) if self.options.context_budget_chars else (),
        )
        rest = self.settle_shown(uri, request)
        if rest is not None:
            return self.deliver(
                uri, version, request, reuse(engine, self.options, request, self.shown[uri].completion, rest)
            )
        cancel = self.running[uri, lane] = threading.Event()
        try:
            if trigger == "automatic" and self.options.debounce_ms:
                try:
                    await asyncio.sleep(self.options.debounce_ms / 1000)
                except asyncio.CancelledError:  # $/cancelRequest
                    self.deliver(uri, version, request, cancelled(engine, self.options, request))
                    raise
                if cancel.is_set() or document.version != version:  # the user typed on; a newer request follows
                    return self.deliver(uri, version, request, cancelled(engine, self.options, request))
                request.received = time.perf_counter()
            if self.engine is None:
                return None  # a reload began while waiting
            engine, options = self.engine, self.options  # settings may have changed while waiting
            future = self.worker.submit(complete, engine, options, request, cancel)
            try:
                result = await asyncio.wrap_future(future)
            except asyncio.CancelledError:  # $/cancelRequest
                cancel.set()
                if future.cancelled():  # still queued behind another decode: it never ran
                    self.deliver(uri, version, request, cancelled(engine, options, request))
                else:  # it had started: let it stop at a round or prefill chunk boundary and log it
                    self.deliver(uri, version, request, await asyncio.wrap_future(future))
                raise
        finally:
            if self.running.get((uri, lane)) is cancel:
                del self.running[uri, lane]
        return self.deliver(uri, version, request, result)

    def settle_shown(self, uri: str, request: Request) -> str | None:
        """Resolve the document's previous completion as typed along or rejected; return what is left of it."""
        previous = self.shown.get(uri)
        if previous is None:
            return None
        rest = None
        try:
            offset = offset_at(request.text, request.line, request.character)
            rest = typed_along(previous.prefix, previous.suffix, previous.completion.text, request.text, offset)
        except PositionError:
            pass
        if rest is None:
            self.resolve(self.shown.pop(uri), "rejected")
        else:  # kept: the reuse serves the rest of it
            self.resolve(previous, "partial", len(previous.completion.text) - len(rest))
        return rest

    def deliver(self, uri: str, version: int | None, request: Request, result: Completion) -> Completion | None:
        """Record the completion's event and start tracking its outcome; None if there is nothing to show."""
        event = result.event
        document = self.open_document(uri)
        if event.outcome == "shown" and (document is None or document.version != version):
            log.info("dropping a completion for %s version %s: the document has changed", uri, version)
            event.outcome, event.empty_reason = "cancelled", "stale"
        if event.outcome != "shown":
            log.info("%s: empty answer (%s)", uri, event.empty_reason)
        assert self.events is not None  # configure() makes it at initialize, before any completion
        if not self.events.write(event) and self.events.enabled and not self.telemetry_failed:
            self.telemetry_failed = True
            self.show_error(f"specdec: cannot write telemetry events to {self.events.path} (the server log says why)")
        if result.error is not None and not isinstance(result.error, PositionError):
            self.show_error(f"specdec: completion failed: {result.error}")
        if event.prompt_tokens:  # it decoded: refusals and reuse take no time worth reporting
            self.latencies.append(event.latency_ms)
        self.protocol.notify(
            COMPLETED,
            {
                "uri": uri,
                "requestId": event.request_id,
                "outcome": event.outcome,
                "latencyMs": event.latency_ms,
                "reason": event.empty_reason,
            },
        )
        self.send_status()
        if isinstance(result.error, PositionError):
            raise JsonRpcInvalidParams(str(result.error))
        if event.outcome != "shown":
            return None
        offset = offset_at(request.text, request.line, request.character)
        shown = Shown(
            event.request_id, request.text[:offset], request.text[offset:], result, self.options.track_outcomes
        )
        if shown.tracked:
            shown.timer = asyncio.get_running_loop().call_later(
                self.options.reject_after_s, self.resolve, shown, "rejected"
            )
        self.shown[uri] = shown
        return result

    def resolve(self, shown: Shown, outcome: Outcome, accepted_chars: int | None = None) -> None:
        """Record the user's verdict on a shown completion (a later verdict overrides an earlier one)."""
        if outcome in ("rejected", "partial"):
            self.superseded[shown.request_id] = shown
            while len(self.superseded) > SUPERSEDED_KEPT:
                del self.superseded[next(iter(self.superseded))]  # the oldest
        if shown.timer is not None:
            shown.timer.cancel()
            shown.timer = None
        if not shown.tracked or shown.outcome == outcome:
            return
        shown.outcome = outcome
        assert self.events is not None  # configure() makes it at initialize, before any completion
        self.events.update_outcome(shown.request_id, outcome, accepted_chars)
        self.verdicts.append(outcome != "rejected")


SERVER = SpecdecServer()


def path_of(uri: str) -> str:
    """The file path in a URI: for language detection, and snippets name it in the prompt (so it is made
    valid text: a lone surrogate in it would fail the tokenizer)."""
    return valid_text(unquote(urlparse(uri).path))


@SERVER.feature(types.INITIALIZE)
def initialize(ls: SpecdecServer, params: types.InitializeParams) -> None:
    use_lsp_lines(ls.workspace)  # pygls made it just before this handler; no document is open yet
    options = params.initialization_options
    if isinstance(options, dict):
        options = {k: v for k, v in options.items() if k != "token"}  # TCP's (server/transport.py), not a setting
    ls.configure(options)


@SERVER.feature(types.INITIALIZED)
def initialized(ls: SpecdecServer, params: types.InitializedParams) -> None:
    if ls.engine is not None and ls.loaded_with is not None and not models_changed(ls.loaded_with, ls.options):
        ls.set_status("ready", ls.state_message)  # a TCP client came back: its models are loaded already
        return
    ls.start_loading()


@SERVER.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def did_change_configuration(ls: SpecdecServer, params: types.DidChangeConfigurationParams) -> None:
    settings = params.settings.get("specdec") if isinstance(params.settings, dict) else None
    if settings is None:
        log.info("didChangeConfiguration carries no 'specdec' section; nothing to change")
        return
    old = ls.configure(settings)
    if models_changed(old, ls.options):
        ls.start_loading()
    elif ls.engine is not None and (old.gamma, old.draft_confidence) != (ls.options.gamma, ls.options.draft_confidence):
        ls.engine = retune(ls.engine, ls.options)
    log.info("settings now %s", dataclasses.asdict(ls.options))


@SERVER.feature(types.SHUTDOWN)
def shutdown(ls: SpecdecServer, params: None) -> None:
    for cancel in ls.running.values():
        cancel.set()


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: SpecdecServer, params: types.DidChangeTextDocumentParams) -> None:
    """Stop the document's decodes: what they would show is for a version that is gone (`deliver` would
    drop it), and the worker is wanted for the request the typing brings next."""
    ls.touch(unquote(params.text_document.uri))
    for lane in LANES:
        cancel = ls.running.get((params.text_document.uri, lane))
        if cancel is not None:
            cancel.set()


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: SpecdecServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.recent.pop(unquote(uri), None)
    for lane in LANES:
        cancel = ls.running.pop((uri, lane), None)
        if cancel is not None:
            cancel.set()
    shown = ls.shown.pop(uri, None)
    if shown is not None:
        ls.resolve(shown, "rejected")


def replaced_range(ls: SpecdecServer, uri: str, position: types.Position, result: Completion) -> types.Range:
    """From the cursor over the closers the completion retypes (none: an empty range at the cursor), in the
    client's UTF-16 units."""
    document = ls.open_document(uri)
    if not result.replaces or document is None:
        return types.Range(position, position)
    start = offset_at(document.source, position.line, position.character)
    replaced = document.source[start : start + result.replaces]
    return types.Range(position, types.Position(position.line, position.character + utf16_len(replaced)))


@SERVER.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(ls: SpecdecServer, params: types.InlineCompletionParams) -> types.InlineCompletionList:
    invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    result = await ls.completion_at(params.text_document.uri, params.position, "invoked" if invoked else "automatic")
    if result is None:
        return types.InlineCompletionList(items=[])
    item = types.InlineCompletionItem(
        insert_text=result.text,
        range=replaced_range(ls, params.text_document.uri, params.position, result),
        command=types.Command(title="accept", command=ACCEPT, arguments=[result.event.request_id]),
    )
    return types.InlineCompletionList(items=[item])


@SERVER.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
async def completion(ls: SpecdecServer, params: types.CompletionParams) -> types.CompletionList:
    """The fallback for clients without inline completion: one item holding the whole completion."""
    invoked = params.context is None or params.context.trigger_kind == types.CompletionTriggerKind.Invoked
    trigger: Trigger = "invoked" if invoked else "automatic"
    result = await ls.completion_at(params.text_document.uri, params.position, trigger, lane="completion")
    if result is None:
        return types.CompletionList(is_incomplete=True, items=[])
    first_line = result.text.split("\n", 1)[0].strip() or result.text.strip()
    item = types.CompletionItem(
        label=first_line[:60] or "(whitespace)",
        kind=types.CompletionItemKind.Text,
        detail="specdec",
        documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=result.text),
        # The edit starts at the cursor, so the client filters on nothing the user typed before it.
        text_edit=types.TextEdit(
            range=replaced_range(ls, params.text_document.uri, params.position, result), new_text=result.text
        ),
        command=types.Command(title="accept", command=ACCEPT, arguments=[result.event.request_id]),
    )
    # Incomplete: the client asks again as the user types, instead of filtering this one item.
    return types.CompletionList(is_incomplete=True, items=[item])


@SERVER.command(ACCEPT)
def accept(ls: SpecdecServer, request_id: str) -> bool:
    """The client ran the item's command: the user accepted the completion. False if it is unknown."""
    for uri, shown in ls.shown.items():
        if shown.request_id == request_id:
            del ls.shown[uri]
            ls.resolve(shown, "accepted", len(shown.completion.text))
            return True
    late = ls.superseded.pop(request_id, None)
    if late is not None:  # replaced a moment before the user took it: the accept overrides that verdict
        ls.resolve(late, "accepted", len(late.completion.text))
        return True
    log.info("accept for unknown or already accepted completion %s", request_id)
    return False


def serve(tcp: bool = False, port: int = 2087) -> None:
    limit_logging()
    if tcp:
        serve_tcp(SERVER.protocol, SERVER, port)
    else:
        SERVER.protocol.set_writer(StdoutWriter(sys.stdout.buffer))
        serve_stdio(SERVER.protocol)
