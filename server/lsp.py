"""The specdec language server: the server object, its LSP handlers and the two request lanes, over
server/completion.py's pipeline.

Beside it: server/protocol_patches.py (pygls' protocol, answering what pygls leaves unanswered),
server/loading.py (the decode worker and model loads), server/outcomes.py (what became of each shown
completion, and typing along one) and server/documents.py (open documents, and the key each request's URI
becomes once, where it enters).

Threads: the asyncio event loop reads and answers messages; one worker thread loads the models
and runs every decode (the models are not thread-safe), so the loop keeps reading while a decode
runs, and a newer request or `$/cancelRequest` can stop it between rounds.

Server -> client notifications beyond LSP:
- `specdec/status` {"state": "loading"|"ready"|"error", "message", "percentage", "acceptance",
  "p50_ms"}: the status bar. `percentage` (0-100, or null) is how far a first run's model conversion
  got, as in the `$/progress` reports; `acceptance` is the share of resolved completions the user
  accepted, `p50_ms` the median latency, both over the last 100.
- `specdec/completed` {"uri", "requestId", "outcome", "latencyMs", "reason", "stage", "debounceMs"} after
  each completion request that reached the pipeline, so a harness can tie its own records to the event's
  request id and a client can say why an answer was empty (`reason`, the event's `empty_reason`; null when
  shown), whether it was a block's first lines (`stage`: "first", "continued" or null, as in the event),
  and how long the server waited for more typing before `latencyMs` began (`debounceMs`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import logging
import os
import statistics
import sys
import threading
import time
import uuid
from collections import deque
from typing import Literal

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.io_ import StdoutWriter
from pygls.lsp.server import LanguageServer

from speccomplete.telemetry.events import Trigger
from speccomplete.telemetry.log import EventLog

from .completion import (
    Completion,
    Engine,
    Request,
    cancelled,
    complete,
    next_lines_request,
    retune,
    reuse,
    served_ahead,
    warm,
)
from .debounce import Debounce
from .documents import document_key, path_of, use_lsp_lines
from .early_stdin import EarlyStdin
from .loading import Loader, Worker
from .log_limits import PopupLimit, limit_logging
from .options import EVENT_LOG_FIELDS, ServerOptions, models_changed, parse_options
from .outcomes import Outcomes
from .positions import PositionError, offset_at, utf16_len
from .protocol_patches import Protocol
from .snippets import MAX_DOCUMENTS, OpenDocument
from .transport import serve_stdio, serve_tcp

log = logging.getLogger(__name__)

VERSION = importlib.metadata.version("speccomplete")  # what the client sees in serverInfo
STATUS = "specdec/status"
COMPLETED = "specdec/completed"
ACCEPT = "specdec.accept"
Lane = Literal["inline", "completion"]  # the two requests a client may send on every key (completion_at)
LANES: tuple[Lane, ...] = ("inline", "completion")


@dataclasses.dataclass
class Ahead:
    """A staged block's next lines (Completion.more), decoding on the worker while the user looks at its first:
    the request at the end of the first lines, once the user took them, is answered with these."""

    text: str  # the document once the first lines are in
    line: int  # the cursor then, at their end
    character: int
    answer: asyncio.Future  # the next lines' Completion
    cancel: threading.Event

    def fits(self, text: str, line: int, character: int) -> bool:
        return (text, line, character) == (self.text, self.line, self.character)


class SpecdecServer(LanguageServer):
    protocol: Protocol

    def __init__(self):
        super().__init__("specdec", VERSION, protocol_cls=Protocol)
        self.options = ServerOptions()
        self.engine: Engine | None = None
        self.state, self.state_message = "loading", "waiting for initialize"
        self.worker = Worker()
        self.events: EventLog | None = None  # made by configure() at initialize
        # by document key (document_key) and lane, the cancel switch of its decode
        self.running: dict[tuple[str, Lane], threading.Event] = {}
        # by (document key, version, line, character): the lane and answer of the request in flight there
        self.pending: dict[tuple, tuple[Lane, asyncio.Future]] = {}
        self.ahead: dict[str, Ahead] = {}  # by document key: a staged block's next lines, decoding ahead
        self.debounce = Debounce()  # how long automatic requests wait: the user's typing pace
        self.outcomes = Outcomes(lambda: self.events)  # the shown completions and the user's verdicts
        self.recent: dict[str, None] = {}  # keys of open documents, the most recently edited or asked for last
        self.loader = Loader(self)  # the model loads, and the compiled step's build after each
        # the document whose prompt the decoder read last (a request's or a warm-up's), and the warm-up's switch
        self.read_last: str | None = None
        self.warming = threading.Event()
        self.latencies: deque[float] = deque(maxlen=100)
        self.popup_limit = PopupLimit()
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
        self.stop_work()
        self.running.clear()
        self.outcomes.end_session()
        self.protocol.end_session()

    # ------------------------------------------------------------------ settings, errors and the status bar

    def configure(self, raw) -> ServerOptions:
        """Apply settings; report rejected keys to the user. Returns the previous options."""
        old = self.options
        self.options, errors = parse_options(raw, old)
        if errors:
            message = "specdec: some settings were rejected and keep their previous value: " + "; ".join(errors)
            log.error("%s", message)
            self.show_error(message)
        new = self.options
        if self.events is None or any(getattr(old, f) != getattr(new, f) for f in EVENT_LOG_FIELDS):
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
        """An error popup in the editor, as often as log_limits.PopupLimit allows; the log has every one."""
        if not self.popup_limit.allows(message):
            log.warning("not shown again: %s", message)
            return
        self.window_show_message(types.ShowMessageParams(type=types.MessageType.Error, message=message))

    def set_status(self, state: str, message: str) -> None:
        self.state, self.state_message = state, message
        self.send_status()

    def send_status(self) -> None:
        verdicts = self.outcomes.verdicts
        self.protocol.notify(
            STATUS,
            {
                "state": self.state,
                "message": self.state_message,
                "percentage": self.loader.progress[0] if self.state == "loading" and self.loader.progress else None,
                "optimizing": self.loader.optimizing,
                "acceptance": sum(verdicts) / len(verdicts) if verdicts else None,
                "p50_ms": statistics.median(self.latencies) if self.latencies else None,
            },
        )

    # ------------------------------------------------------------------ completions

    def touch(self, key: str) -> None:
        self.recent.pop(key, None)
        self.recent[key] = None

    def other_documents(self, key: str) -> tuple[OpenDocument, ...]:
        """The open documents but `uri`'s, the most recently edited or asked for first: the editor's other
        tabs, for context from beyond the prompt (server/snippets.py)."""
        documents = self.workspace.text_documents
        order = [u for u in reversed(self.recent) if u in documents]
        order += [u for u in documents if u not in self.recent]
        others = [u for u in order if u != key][:MAX_DOCUMENTS]
        return tuple(OpenDocument(path_of(u), documents[u].source) for u in others)

    def warm_at_edit(self, uri: str, key: str, change) -> None:
        """At the first edit in a document whose prompt the decoder has not read, read it on the worker while
        the user types on (completion.warm); the next request stops it and prefills only the rest."""
        if not self.options.prefill_on_edit or self.engine is None or key == self.read_last:
            return
        document, end = self.open_document(key), edit_end(change)
        if document is None or end is None:  # a whole-document change says nowhere where the cursor is
            return
        self.read_last = key
        self.warming.set()
        self.warming = threading.Event()
        request = Request(
            "warm-up",
            document.source,
            path_of(uri),
            document.language_id,
            end.line,
            end.character,
            "automatic",
            time.perf_counter(),
            self.other_documents(key) if self.options.context_budget_chars else (),
        )
        self.worker.submit(warm, self.engine, self.options, request, self.warming)

    def open_document(self, key: str):
        """The open document under `key` (document_key), or None."""
        return self.workspace.text_documents.get(key)

    async def completion_at(
        self, uri: str, key: str, position: types.Position, trigger: Trigger, lane: Lane = "inline"
    ) -> Completion | None:
        """The completion to show at `position` in the document at `uri` (whose key is `key`), or None. Raises
        JsonRpcInvalidParams for a bad position.

        Lanes: inline completion and `textDocument/completion` (a completion plugin asks on every key).
        A newer request supersedes only the older one of its own lane, and a request for the very
        position and version the other lane is decoding waits for that decode instead of starting one.
        """
        document = self.open_document(key)
        if document is None:
            log.warning("completion requested for %s, which is not open; empty answer", uri)
            return None
        if self.engine is None:
            log.info("completion requested while the models are %s; empty answer", self.state)
            return None
        spot = (key, document.version, position.line, position.character)
        other_lane, shared = self.pending.get(spot, (lane, None))
        if shared is not None and other_lane != lane:
            result, answered = await asyncio.shield(shared)
            if answered:
                return result
            # the client cancelled the other lane's request (VS Code does, as it opens its suggest widget
            # for the same spot): this one still wants an answer, so it decodes on its own
            document = self.open_document(key)
            if document is None or self.engine is None:
                return None
        ours = (lane, asyncio.get_running_loop().create_future())
        self.pending[spot] = ours
        result, answered = None, False
        try:
            result = await self.complete_in_lane(uri, key, document, position, trigger, lane, self.engine)
            answered = True
            return result
        finally:
            if self.pending.get(spot) is ours:
                del self.pending[spot]
            ours[1].set_result((result, answered))

    async def complete_in_lane(
        self, uri: str, key: str, document, position: types.Position, trigger: Trigger, lane: Lane, engine: Engine
    ) -> Completion | None:
        superseded = self.running.pop((key, lane), None)
        if superseded is not None:
            superseded.set()  # its decode stops at the end of its current round
        version = document.version
        self.touch(key)
        request = Request(
            uuid.uuid4().hex,
            document.source,
            path_of(uri),
            document.language_id,
            position.line,
            position.character,
            trigger,
            time.perf_counter(),
            self.other_documents(key) if self.options.context_budget_chars else (),
        )
        place = (uri, key, version)
        typed = self.outcomes.settle(key, request)
        if typed is not None:
            previous, rest = typed
            return self.deliver(place, request, reuse(engine, self.options, request, previous, rest))
        ahead = self.ahead.get(key)
        if ahead is not None and not ahead.fits(request.text, request.line, request.character):
            ahead = None
        for other in [k for k in self.ahead if self.ahead[k] is not ahead]:  # the user moved on
            self.drop_ahead(other)
        if ahead is not None:  # the user took a staged block's first lines: its next ones, decoded meanwhile
            del self.ahead[key]
            request.continues_block = True
            try:
                result = await asyncio.shield(ahead.answer)
            except asyncio.CancelledError:  # $/cancelRequest
                ahead.cancel.set()
                self.deliver(place, request, cancelled(engine, self.options, request))
                raise
            return self.deliver(place, request, served_ahead(request, result))
        cancel = self.running[key, lane] = threading.Event()
        try:
            wait_ms = self.debounce.wait_ms(self.options.debounce_ms)
            if trigger == "automatic" and wait_ms:
                try:
                    await asyncio.sleep(wait_ms / 1000)
                except asyncio.CancelledError:  # $/cancelRequest
                    self.deliver(place, request, cancelled(engine, self.options, request))
                    raise
                if cancel.is_set() or document.version != version:  # the user typed on; a newer request follows
                    return self.deliver(place, request, cancelled(engine, self.options, request))
                request.received, request.debounce_ms = time.perf_counter(), wait_ms
            if self.engine is None:
                return None  # a reload began while waiting
            engine, options = self.engine, self.options  # settings may have changed while waiting
            # after the debounce: the accept of the block's first lines may come just behind the edit it made
            request.continues_block = self.outcomes.continues_block(key, request)
            self.warming.set()  # the request reads on from where a warm-up got to
            self.read_last = key
            future = self.worker.submit(complete, engine, options, request, cancel)
            try:
                result = await asyncio.wrap_future(future)
            except asyncio.CancelledError:  # $/cancelRequest
                cancel.set()
                if future.cancelled():  # still queued behind another decode: it never ran
                    self.deliver(place, request, cancelled(engine, options, request))
                else:  # it had started: let it stop at a round or prefill chunk boundary and log it
                    self.deliver(place, request, await asyncio.wrap_future(future))
                raise
        finally:
            if self.running.get((key, lane)) is cancel:
                del self.running[key, lane]
        return self.deliver(place, request, result)

    def decode_ahead(self, key: str, request: Request, shown: Completion) -> None:
        """While the user looks at a staged block's first lines, decode its next ones on the worker (an idle
        worker: the user is reading), so that taking the first lines brings the next at once."""
        target = next_lines_request(request, shown)
        current = self.ahead.get(key)
        if current is not None and current.fits(target.text, target.line, target.character):
            return  # typed along: the same next lines are decoding already
        self.drop_ahead(key)
        if self.engine is None:
            return
        cancel = threading.Event()
        answer = asyncio.wrap_future(self.worker.submit(complete, self.engine, self.options, target, cancel))
        self.ahead[key] = Ahead(target.text, target.line, target.character, answer, cancel)
        self.read_last = key

    def stop_work(self) -> None:
        """Stop whatever the worker runs or holds queued: decodes, a warm-up, decodes ahead (each at its next
        round or chunk); and a compiled step's build for the models loaded."""
        for cancel in (*self.running.values(), self.warming):
            cancel.set()
        for key in list(self.ahead):
            self.drop_ahead(key)
        self.loader.stop()

    def reload(self) -> None:
        """Load the models for the options now: the old ones go first (requests answer empty meanwhile), and
        what the worker runs or holds is stopped, so that the load waits behind nothing."""
        self.engine = None
        self.stop_work()
        self.read_last = None
        self.loader.start(self.options)

    def drop_ahead(self, key: str) -> None:
        ahead = self.ahead.pop(key, None)
        if ahead is not None:
            ahead.cancel.set()

    def deliver(self, place: tuple[str, str, int | None], request: Request, result: Completion) -> Completion | None:
        """Record the completion's event and start tracking its outcome; None if there is nothing to show.
        `place`: the document's URI, key and version when the request came."""
        uri, key, version = place
        event = result.event
        document = self.open_document(key)
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
            if event.outcome != "cancelled":
                self.debounce.decoded(event.latency_ms / 1000)
        self.protocol.notify(
            COMPLETED,
            {
                "uri": uri,
                "requestId": event.request_id,
                "outcome": event.outcome,
                "latencyMs": event.latency_ms,
                "reason": event.empty_reason,
                "stage": event.stage,
                "debounceMs": event.debounce_ms,
            },
        )
        self.send_status()
        if isinstance(result.error, PositionError):
            raise JsonRpcInvalidParams(str(result.error))
        if event.outcome != "shown":
            return None
        self.outcomes.show(key, request, result, self.options.track_outcomes, self.options.reject_after_s)
        if result.more:
            self.decode_ahead(key, request, result)
        return result


SERVER = SpecdecServer()


@SERVER.feature(types.INITIALIZE)
def initialize(ls: SpecdecServer, params: types.InitializeParams) -> None:
    use_lsp_lines(ls.workspace)  # pygls made it just before this handler; no document is open yet
    options = params.initialization_options
    if isinstance(options, dict):
        options = {k: v for k, v in options.items() if k != "token"}  # TCP's (server/transport.py), not a setting
    ls.configure(options)


@SERVER.feature(types.INITIALIZED)
def initialized(ls: SpecdecServer, params: types.InitializedParams) -> None:
    loaded_with = ls.loader.loaded_with
    if ls.engine is not None and loaded_with is not None and not models_changed(loaded_with, ls.options):
        ls.set_status("ready", ls.state_message)  # a TCP client came back: its models are loaded already
        return
    ls.reload()


@SERVER.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
def did_change_configuration(ls: SpecdecServer, params: types.DidChangeConfigurationParams) -> None:
    settings = params.settings.get("specdec") if isinstance(params.settings, dict) else None
    if settings is None:
        log.info("didChangeConfiguration carries no 'specdec' section; nothing to change")
        return
    old = ls.configure(settings)
    if models_changed(old, ls.options):
        ls.reload()
    elif ls.engine is not None and _pacing(old) != _pacing(ls.options):
        ls.engine = retune(ls.engine, ls.options)
    log.info("settings now %s", dataclasses.asdict(ls.options))


@SERVER.feature(types.SHUTDOWN)
def shutdown(ls: SpecdecServer, params: None) -> None:
    ls.stop_work()


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: SpecdecServer, params: types.DidChangeTextDocumentParams) -> None:
    """Stop the document's decodes: what they would show is for a version that is gone (`deliver` would
    drop it), and the worker is wanted for the request the typing brings next."""
    key = document_key(params.text_document.uri)
    ls.touch(key)
    ls.debounce.key()
    for lane in LANES:
        cancel = ls.running.get((key, lane))
        if cancel is not None:
            cancel.set()
    if params.content_changes:
        ls.warm_at_edit(params.text_document.uri, key, params.content_changes[-1])


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: SpecdecServer, params: types.DidCloseTextDocumentParams) -> None:
    key = document_key(params.text_document.uri)
    ls.recent.pop(key, None)
    ls.drop_ahead(key)
    for lane in LANES:
        cancel = ls.running.pop((key, lane), None)
        if cancel is not None:
            cancel.set()
    ls.outcomes.reject(key)


def edit_end(change) -> types.Position | None:
    """Where an incremental change leaves the cursor, as a typist's edit does: after its inserted text (None
    for a whole-document change)."""
    if not isinstance(change, types.TextDocumentContentChangePartial):
        return None
    start, lines = change.range.start, change.text.split("\n")
    if len(lines) == 1:
        return types.Position(start.line, start.character + utf16_len(lines[0]))
    return types.Position(start.line + len(lines) - 1, utf16_len(lines[-1]))


def replaced_range(ls: SpecdecServer, key: str, position: types.Position, result: Completion) -> types.Range:
    """From the cursor over the closers the completion retypes (none: an empty range at the cursor), in the
    client's UTF-16 units."""
    document = ls.open_document(key)
    if not result.replaces or document is None:
        return types.Range(position, position)
    start = offset_at(document.source, position.line, position.character)
    replaced = document.source[start : start + result.replaces]
    return types.Range(position, types.Position(position.line, position.character + utf16_len(replaced)))


@SERVER.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(ls: SpecdecServer, params: types.InlineCompletionParams) -> types.InlineCompletionList:
    invoked = params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    uri = params.text_document.uri
    key = document_key(uri)
    result = await ls.completion_at(uri, key, params.position, "invoked" if invoked else "automatic")
    if result is None:
        return types.InlineCompletionList(items=[])
    item = types.InlineCompletionItem(
        insert_text=result.text,
        range=replaced_range(ls, key, params.position, result),
        command=types.Command(title="accept", command=ACCEPT, arguments=[result.event.request_id]),
    )
    return types.InlineCompletionList(items=[item])


@SERVER.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions())
async def completion(ls: SpecdecServer, params: types.CompletionParams) -> types.CompletionList:
    """The fallback for clients without inline completion: one item holding the whole completion."""
    invoked = params.context is None or params.context.trigger_kind == types.CompletionTriggerKind.Invoked
    trigger: Trigger = "invoked" if invoked else "automatic"
    uri = params.text_document.uri
    key = document_key(uri)
    result = await ls.completion_at(uri, key, params.position, trigger, lane="completion")
    if result is None:
        return types.CompletionList(is_incomplete=True, items=[])
    first_line = result.text.split("\n", 1)[0].strip() or result.text.strip()
    item = types.CompletionItem(
        label=first_line[:60] or "(whitespace)",
        kind=types.CompletionItemKind.Text,
        detail="specdec",
        documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=result.text),
        # The edit starts at the cursor, so the client filters on nothing the user typed before it.
        text_edit=types.TextEdit(range=replaced_range(ls, key, params.position, result), new_text=result.text),
        command=types.Command(title="accept", command=ACCEPT, arguments=[result.event.request_id]),
    )
    # Incomplete: the client asks again as the user types, instead of filtering this one item.
    return types.CompletionList(is_incomplete=True, items=[item])


@SERVER.command(ACCEPT)
def accept(ls: SpecdecServer, request_id: str) -> bool:
    """The client ran the item's command: the user accepted the completion. False if it is unknown."""
    if ls.outcomes.accept(request_id):
        return True
    log.info("accept for unknown or already accepted completion %s", request_id)
    return False


def serve(tcp: bool = False, port: int = 2087, stdin: EarlyStdin | None = None) -> None:
    """Serve on stdio, or on TCP `port`; `stdin`: stdio's reader, where one was started before this module's imports."""
    limit_logging()
    # The server reports loading itself ($/progress, specdec/status); transformers' and the hub's progress bars
    # on stderr would land in the editors' logs as warnings or errors, a line per redraw.
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    disable_progress_bars()
    transformers_logging.disable_progress_bar()
    os.environ.setdefault("TQDM_DISABLE", "1")  # the bars that use tqdm directly (transformers' GGUF loading)
    if tcp:
        serve_tcp(SERVER.protocol, SERVER, port)
    else:
        SERVER.protocol.set_writer(StdoutWriter(sys.stdout.buffer))
        serve_stdio(SERVER.protocol, stdin)


def _pacing(options) -> tuple:
    """The settings a loaded decoder takes without a reload (completion.retune)."""
    return options.gamma, options.draft_confidence, options.draft_tree_nodes
