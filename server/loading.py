"""Loading the models on the decode worker, with the editor's progress bar and the status bar; then
the compiled CPU step, loaded on a thread of its own (built first by `specdec precompile` in a process of
its own where the model cache lacks it) and installed on the worker.

The worker is one thread that runs every job in order: the loads here, and every decode (server/lsp.py).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import queue
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Any, Protocol

from lsprotocol import types

from speccomplete.decoder.healing import warm_up as warm_up_healing
from speccomplete.decoder.loader import compile_steps, wants_compiled_step

from .completion import Engine, load_engine
from .options import ServerOptions

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


class LoadingHost(Protocol):
    """What a Loader needs of the server it loads for: its worker, where the models go, its status, and the
    client's progress bars."""

    worker: Worker
    engine: Engine | None

    @property
    def client_capabilities(self) -> types.ClientCapabilities: ...

    @property
    def work_done_progress(self) -> Any: ...  # pygls' progress API

    def set_status(self, state: str, message: str) -> None: ...

    def send_status(self) -> None: ...

    def show_error(self, message: str) -> None: ...


class Loader:
    """The model loads of one server, each superseding the last, and the compiled step's build or load after
    each: what they have got to, for the status, and the build's process, to stop with the models."""

    def __init__(self, host: LoadingHost):
        self.host = host
        self.loads = 0  # counts model loads, so a superseded load does not install its models
        self.progress: tuple[int, str] | None = None  # the last (percentage, message) reported
        self.task: asyncio.Task | None = None
        self.loaded_with: ServerOptions | None = None  # the options the host's engine was loaded with
        self.optimizing = False  # the compiled CPU step is being built or loaded
        self.compile_task: asyncio.Task | None = None
        self.precompiling: subprocess.Popen | None = None  # `specdec precompile` building the step

    def start(self, options: ServerOptions) -> None:
        """Load the models for `options` on the host's worker (the host has dropped its engine and stopped its
        work first, so that the load waits behind nothing)."""
        self.loads += 1
        self.progress = None
        self.optimizing = False  # a build for the old models may run on, but its step is never installed
        self.loaded_with = None
        self.task = asyncio.ensure_future(self.load(self.loads, options))

    def stop(self) -> None:
        """Stop a compiled step's build for the models loaded, which are going."""
        if self.precompiling is not None and self.precompiling.poll() is None:
            self.precompiling.terminate()

    async def load(self, load_id: int, options: ServerOptions) -> None:
        host = self.host
        what = f"{options.target} with draft {options.draft}"
        host.set_status("loading", f"loading {what}")
        token = await self.begin_progress(f"specdec-load-{load_id}", f"loading {what}")
        loop = asyncio.get_running_loop()

        def progress(fraction: float, message: str) -> None:  # called on the worker thread
            loop.call_soon_threadsafe(self.report_progress, load_id, token, round(fraction * 100), message)

        try:
            engine, compiles = await asyncio.wrap_future(host.worker.submit(_load, options, progress))
        except Exception as e:  # any failure (missing model, OOM, bad draft spec) leaves the server up
            log.exception("could not load %s", what)
            if load_id == self.loads:
                # the message first: a client that sees the error state has the reason already
                host.show_error(f"specdec: could not load the models ({what}): {e}")
                host.set_status("error", f"could not load {what}: {e}")
            self.end_progress(token, "failed")
            return
        finally:
            collect_from_now_on()
        self.end_progress(token, "ready")
        if load_id != self.loads:
            return  # the settings changed while it loaded; the newer load installs its own
        host.engine, self.loaded_with = engine, options
        log.info("models ready: %s on %s", what, engine.device)
        host.set_status("ready", f"{engine.target} + {engine.draft} on {engine.device}")
        if compiles:
            self.compile_task = asyncio.ensure_future(self.compile_step(load_id, engine, options))

    async def compile_step(self, load_id: int, engine: Engine, options: ServerOptions) -> None:
        """Build or load the compiled step on a low-priority thread while the worker answers from the eager one,
        then install it on the worker, between two requests. A failure leaves the eager step in place."""
        from speccomplete.decoder.engine import SpeculativeDecoder
        from speccomplete.decoder.target_steps import EagerTarget

        host = self.host
        decoder = engine.decoder
        assert isinstance(decoder, SpeculativeDecoder) and isinstance(decoder.steps, EagerTarget)  # wants_compiled_step
        steps = decoder.steps
        self.optimizing = True
        host.send_status()
        built: Future = Future()
        loop = asyncio.get_running_loop()

        @functools.cache  # once: as a build begins, or after the load; on the event loop, not the low-priority thread
        def begin_healing_once() -> None:
            if load_id == self.loads:  # not for models a newer load has replaced
                begin_healing(engine, options)

        def precompile() -> None:
            """Build the entry in a process of its own: tracing the model here would break the worker's decodes."""
            loop.call_soon_threadsafe(begin_healing_once)  # a build takes minutes: the table does not wait for it
            self.precompiling = child = subprocess.Popen(
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
        begin_healing_once()
        if compiled is not None and load_id == self.loads and host.engine is engine:
            await asyncio.wrap_future(host.worker.submit(steps.use_compiled, compiled))
            log.info("compiled step in use (%s in %.1f s)", "loaded" if report.loaded else "built", report.seconds)
        if load_id == self.loads:
            self.optimizing = False
            host.send_status()

    async def begin_progress(self, token: str, message: str) -> str | None:
        host = self.host
        if not getattr(host.client_capabilities.window, "work_done_progress", False):
            return None
        try:
            await host.work_done_progress.create_async(token)
        except Exception as e:  # the client refused; loading goes on without a progress bar
            log.warning("window/workDoneProgress/create failed: %s", e)
            return None
        # a percentage in the begin tells the client to draw a bar that the reports fill
        begin = types.WorkDoneProgressBegin(title="specdec", message=message, percentage=0)
        host.work_done_progress.begin(token, begin)
        return token

    def report_progress(self, load_id: int, token: str | None, percentage: int, message: str) -> None:
        """A load's progress, once per whole percent (the reports come twice a second)."""
        if load_id != self.loads or (percentage, message) == self.progress:
            return  # a newer load has its own bar; or nothing new to say
        self.progress = (percentage, message)
        if token is not None:
            report = types.WorkDoneProgressReport(message=message, percentage=percentage)
            self.host.work_done_progress.report(token, report)
        self.host.set_status("loading", f"{message} ({percentage}%)")

    def end_progress(self, token: str | None, message: str) -> None:
        if token is not None:
            self.host.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))


def collect_from_now_on() -> None:
    """Python's cyclic collector, held off through a server's start (harness/serve.py), on again once a load is done.
    What the start made (the imports' modules, classes and functions, the models) stays for the process's life:
    gc.freeze takes it out of every later collection, so that a full one walks only what serving makes rather than
    pausing a completion to walk it all. The few cycles of garbage among it (a few MB) stay too, until a reload
    (release_dropped_models)."""
    if not gc.isenabled():
        gc.freeze()
        gc.enable()


def release_dropped_models() -> None:
    """At a reload (the collector is on by then; a start holds it off), the models it drops are collected on the
    worker before the new ones load, once the decodes queued before the reload have let go of them. Their parts
    refer to one another, so only a full collection frees them, and the start's objects, those models among them,
    were frozen out of its reach (collect_from_now_on): so they are unfrozen first. Left to the collector, a
    model's GB stayed until its next full pass."""
    if gc.isenabled():
        gc.unfreeze()
        gc.collect()


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


def _load(options: ServerOptions, progress) -> tuple[Engine, bool]:
    """On the worker: the models, and whether to build or load their compiled step (deciding counts the target's
    parameters on the meta device, tens of ms that stay off the event loop); then, where no compiled step is to
    come, token healing's table is begun (begin_healing). A reload first gives back the models it replaces."""
    release_dropped_models()
    engine = load_engine(options, progress)
    compiles = wants_compiled_step(options.compile_step, engine.decoder)
    if not compiles:
        begin_healing(engine, options)
    return engine, compiles


def begin_healing(engine: Engine, options: ServerOptions) -> None:
    """Token healing's table, begun on a thread (decoder/healing.py) so that a first completion seldom waits for
    it. Its second of Python holds the interpreter's lock, and work beside it waits for the lock each time it
    lets go of it, both taking longer than one after the other (docs/cpu.md, "What a start costs"): so it is
    begun after the load's last steps, and after the compiled step's load where one comes."""
    if options.token_healing and engine.tokenizer is not None:
        warm_up_healing(engine.tokenizer)
