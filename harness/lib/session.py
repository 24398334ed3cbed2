"""One LSP session over a `specdec serve` process, held as an editor holds it: what `specdec eval` and the
stress checks share. `start_session` is eval's (ready or an error); the stress checks' session records more
(stress/storm.py) and opens through the same `connect`."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from lsprotocol import types
from pygls.lsp.client import LanguageClient

from speccomplete.server.lsp import COMPLETED, STATUS

log = logging.getLogger(__name__)


def server_command() -> list[str]:
    """`specdec serve` in this interpreter, verbose when this harness is."""
    verbose = ["-v"] if log.isEnabledFor(logging.INFO) else []
    return [sys.executable, "-m", "speccomplete", *verbose, "serve"]


@dataclass
class Session:
    """One server process and the client talking to it. What the server sends goes to `status_arrived`,
    `completion_noted` and `message_shown`: a session that records more overrides them."""

    client: LanguageClient
    statuses: list[dict] = field(default_factory=list)
    completed: dict[str, asyncio.Future] = field(default_factory=dict)  # uri -> the server's specdec/completed
    stderr: deque = field(default_factory=lambda: deque(maxlen=40))  # the server's last log lines, for crashes
    tasks: list[asyncio.Task] = field(default_factory=list)
    # seconds from starting the server's process to its "ready" status: the models loaded and the target's
    # steps built (on CUDA their graphs recorded, decoder/loader.py)
    ready_s: float | None = None

    @property
    def alive(self) -> bool:
        return self.client._server is not None and self.client._server.returncode is None

    @property
    def process(self) -> asyncio.subprocess.Process:
        """The server's process, once `connect` has started it."""
        assert self.client._server is not None, "the server has not been started"
        return self.client._server

    def status_arrived(self, status: dict) -> None:
        """A specdec/status notification."""
        self.statuses.append(status)

    def completion_noted(self, note: dict) -> None:
        """A specdec/completed notification: it resolves its document's future in `completed`, where one waits."""
        future = self.completed.get(note.get("uri", ""))  # no document has the URI ""
        if future is not None and not future.done():
            future.set_result(note)

    def message_shown(self, params: types.ShowMessageParams) -> None:
        log.warning("server says: %s", params.message)


def compiled_step_in_use(statuses: list[dict]) -> int | None:
    """The index of the first status that is no longer `optimizing` after one that was: the server's compiled
    step in use. None where it never optimized, or is still at it."""
    optimizing = False
    for index, status in enumerate(statuses):
        if status.get("optimizing"):
            optimizing = True
        elif optimizing and status.get("state") == "ready":
            return index
    return None


async def connect(
    session: Session, command: list[str], init_options: dict, ready_timeout: float, env: dict | None = None
) -> dict:
    """Start the server's process, initialize it as an editor does and return its first "ready" or "error"
    status; TimeoutError where none comes in `ready_timeout` seconds (the server is left to the caller to stop)."""
    client = session.client
    settled = asyncio.get_running_loop().create_future()

    @client.feature(STATUS)
    def on_status(params):
        status = params._asdict()  # pygls hands a custom notification's params over as a namedtuple
        session.status_arrived(status)
        if status.get("state") in ("ready", "error") and not settled.done():
            settled.set_result(status)

    @client.feature(COMPLETED)
    def on_completed(params):
        session.completion_noted(params._asdict())

    @client.feature(types.WINDOW_SHOW_MESSAGE)
    def on_message(params: types.ShowMessageParams):
        session.message_shown(params)

    await client.start_io(*command, env=env)
    session.tasks.append(asyncio.create_task(drain_stderr(session)))
    await client.initialize_async(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(), process_id=os.getpid(), initialization_options=init_options
        )
    )
    client.initialized(types.InitializedParams())
    return await asyncio.wait_for(settled, ready_timeout)


async def start_session(command: list[str], init_options: dict, ready_timeout: float) -> Session:
    """A session whose server has loaded its models; RuntimeError where it could not."""
    session = Session(LanguageClient("specdec-eval", "0.1.0"))
    started = time.perf_counter()
    status = await connect(session, command, init_options, ready_timeout)
    if status["state"] != "ready":
        await stop_session(session)
        raise RuntimeError(f"the server could not load its models: {status.get('message')}")
    session.ready_s = time.perf_counter() - started
    return session


async def stop_session(session: Session) -> None:
    client = session.client
    if session.alive:
        try:
            await asyncio.wait_for(client.shutdown_async(None), 30)
            client.exit(None)
            await asyncio.wait_for(session.process.wait(), 30)
        except (TimeoutError, RuntimeError, ConnectionError) as e:
            log.warning("server did not shut down cleanly (%s); killing it", e)
            session.process.kill()
    await client.stop()
    for task in session.tasks:
        task.cancel()


async def drain_stderr(session: Session) -> None:
    """Read the server's log (a full pipe would block it); keep the tail, echo it with -v."""
    stream = session.process.stderr
    assert stream is not None  # pygls starts the server with stderr=PIPE
    while line := await stream.readline():
        text = line.decode(errors="replace").rstrip()
        session.stderr.append(text)
        log.info("server: %s", text)
