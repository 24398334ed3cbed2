"""Loading the models on the decode worker, with the editor's progress bar and the status bar; then
the compiled CPU step, loaded on a thread of its own (built first by `specdec precompile` in a process of
its own where the model cache lacks it) and installed on the worker.

The worker is one thread that runs every job in order: the loads here, and every decode (server/lsp.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from lsprotocol import types

from speccomplete.decoder.loader import compile_steps, wants_compiled_step

from .completion import Engine, load_engine
from .options import ServerOptions

if TYPE_CHECKING:
    from .lsp import SpecdecServer

log = logging.getLogger(__name__)


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


def start_loading(ls: SpecdecServer) -> None:
    ls.loads += 1
    ls.load_progress = None
    ls.optimizing = False  # a build for the old models may run on, but its step is never installed
    ls.engine = None  # free the old models before loading new ones; requests answer empty meanwhile
    ls.stop_work()  # the load waits on the worker behind it
    ls.read_last = None
    ls.load_task = asyncio.ensure_future(load(ls, ls.loads, ls.options))


async def load(ls: SpecdecServer, load_id: int, options: ServerOptions) -> None:
    what = f"{options.target} with draft {options.draft}"
    ls.set_status("loading", f"loading {what}")
    token = await begin_progress(ls, f"specdec-load-{load_id}", f"loading {what}")
    loop = asyncio.get_running_loop()

    def progress(fraction: float, message: str) -> None:  # called on the worker thread
        loop.call_soon_threadsafe(report_progress, ls, load_id, token, round(fraction * 100), message)

    try:
        engine = await asyncio.wrap_future(ls.worker.submit(load_engine, options, progress))
    except Exception as e:  # any failure (missing model, OOM, bad draft spec) leaves the server up
        log.exception("could not load %s", what)
        if load_id == ls.loads:
            # the message first: a client that sees the error state has the reason already
            ls.show_error(f"specdec: could not load the models ({what}): {e}")
            ls.set_status("error", f"could not load {what}: {e}")
        end_progress(ls, token, "failed")
        return
    end_progress(ls, token, "ready")
    if load_id != ls.loads:
        return  # the settings changed while it loaded; the newer load installs its own
    ls.engine, ls.loaded_with = engine, options
    log.info("models ready: %s on %s", what, engine.device)
    ls.set_status("ready", f"{engine.target} + {engine.draft} on {engine.device}")
    if wants_compiled_step(options.compile_step, engine.decoder):
        ls.compile_task = asyncio.ensure_future(compile_step(ls, load_id, engine))


async def compile_step(ls: SpecdecServer, load_id: int, engine: Engine) -> None:
    """Build or load the compiled step on a low-priority thread while the worker answers from the eager one,
    then install it on the worker, between two requests. A failure leaves the eager step in place."""
    from speccomplete.decoder.engine import SpeculativeDecoder
    from speccomplete.decoder.target_steps import EagerTarget

    decoder = engine.decoder
    assert isinstance(decoder, SpeculativeDecoder) and isinstance(decoder.steps, EagerTarget)  # wants_compiled_step
    steps = decoder.steps
    ls.optimizing = True
    ls.send_status()
    built: Future = Future()
    options = ls.loaded_with

    def precompile() -> None:
        """Build the entry in a process of its own: tracing the model here would break the worker's decodes."""
        assert options is not None  # set with the engine
        ls.precompiling = child = subprocess.Popen(
            precompile_command(options), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        _, errors = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"specdec precompile exited with {child.returncode}: {errors.strip()[-2000:]}")

    def build() -> None:
        try:
            # this thread only: the editor's requests keep the cores first (Linux: a thread's own nice value,
            # which the compiler processes it starts inherit)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        try:
            built.set_result(compile_steps(decoder, engine.quantization, build=precompile))
        except BaseException as e:
            built.set_exception(e)

    threading.Thread(target=build, name="specdec-compile", daemon=True).start()
    try:
        compiled, report = await asyncio.wrap_future(built)
    except Exception:
        log.exception("could not compile the CPU step; answering from the eager step")
        compiled = None
    if compiled is not None and load_id == ls.loads and ls.engine is engine:
        await asyncio.wrap_future(ls.worker.submit(steps.use_compiled, compiled))
        log.info("compiled step in use (%s in %.1f s)", "loaded" if report.loaded else "built", report.seconds)
    if load_id == ls.loads:
        ls.optimizing = False
        ls.send_status()


def precompile_command(options: ServerOptions) -> list[str]:
    """`specdec precompile` for the models and settings `options` load, so that it builds the entry the server
    then looks for (compiled_step.entry_key)."""
    return [
        sys.executable,
        "-m",
        "speccomplete.cli",
        "precompile",
        f"--target={options.target}",
        f"--draft={options.draft}",
        f"--device={options.device}",
        f"--dtype={options.dtype}",
        f"--gamma={options.gamma}",
        f"--draft-confidence={options.draft_confidence}",
        f"--quantization={options.quantization}",
    ]


async def begin_progress(ls: SpecdecServer, token: str, message: str) -> str | None:
    if not getattr(ls.client_capabilities.window, "work_done_progress", False):
        return None
    try:
        await ls.work_done_progress.create_async(token)
    except Exception as e:  # the client refused; loading goes on without a progress bar
        log.warning("window/workDoneProgress/create failed: %s", e)
        return None
    # a percentage in the begin tells the client to draw a bar that the reports fill
    begin = types.WorkDoneProgressBegin(title="specdec", message=message, percentage=0)
    ls.work_done_progress.begin(token, begin)
    return token


def report_progress(ls: SpecdecServer, load_id: int, token: str | None, percentage: int, message: str) -> None:
    """A load's progress, once per whole percent (the reports come twice a second)."""
    if load_id != ls.loads or (percentage, message) == ls.load_progress:
        return  # a newer load has its own bar; or nothing new to say
    ls.load_progress = (percentage, message)
    if token is not None:
        ls.work_done_progress.report(token, types.WorkDoneProgressReport(message=message, percentage=percentage))
    ls.set_status("loading", f"{message} ({percentage}%)")


def end_progress(ls: SpecdecServer, token: str | None, message: str) -> None:
    if token is not None:
        ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
