"""server/loading.py: token healing's table is begun after the load's last steps, only where healing is on and the
backend has a tokenizer; where a compiled step comes, after it is loaded, or as its build begins (a build takes
minutes), never beside the load. The cyclic collector, held off through a start, runs again once a load is done."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from helpers.lsp import save_random_model

from speccomplete.server import loading
from speccomplete.server.completion import load_engine
from speccomplete.server.options import ServerOptions


@pytest.mark.parametrize(
    ("healing", "tokenizer", "compiles", "warmed"),
    [(True, "tok", False, True), (False, "tok", False, False), (True, None, False, False), (True, "tok", True, False)],
)
def test_the_healing_table_is_begun_last_where_healing_is_on_and_no_step_compiles(
    monkeypatch, healing, tokenizer, compiles, warmed
):
    said = []
    engine = SimpleNamespace(decoder="decoder", tokenizer=tokenizer)
    monkeypatch.setattr(loading, "load_engine", lambda options, progress: said.append("load") or engine)
    monkeypatch.setattr(loading, "wants_compiled_step", lambda setting, decoder: said.append("count") or compiles)
    monkeypatch.setattr(loading, "warm_up_healing", lambda tok: said.append(f"heal {tok}"))
    assert loading._load(ServerOptions(token_healing=healing), None) == (engine, compiles)
    assert said == (["load", "count", "heal tok"] if warmed else ["load", "count"])


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return load_engine(ServerOptions(target=str(save_random_model(tmp_path_factory.mktemp("model")))))


class Host:
    """What compile_step asks of the server; its engine is not the one compiled for, so no step is installed."""

    engine = None

    def __init__(self, worker: ThreadPoolExecutor):
        self.worker = worker

    def send_status(self) -> None:
        pass


@pytest.fixture
def host():
    with ThreadPoolExecutor(1) as worker:
        yield Host(worker)


@pytest.mark.parametrize("cached", [True, False])
async def test_healing_begins_after_a_compiled_step_loads_and_as_a_build_begins(engine, monkeypatch, host, cached):
    said, healers = [], []

    def healed() -> bool:
        return "heal" in said

    class Build:  # `specdec precompile`, done once healing has begun
        returncode = 0

        def __init__(self, command, **kwargs):
            said.append("build")

        def communicate(self):
            deadline = time.monotonic() + 10
            while not healed() and time.monotonic() < deadline:
                time.sleep(0.01)
            return "", ""

    def compile_steps(decoder, quantization, build):
        said.append("compile")
        if not cached:
            build()
        said.append("compiled")
        return object(), SimpleNamespace(loaded=cached, seconds=0.0)

    def warm_up_healing(tokenizer) -> None:
        said.append("heal")
        healers.append(threading.current_thread())

    monkeypatch.setattr(loading, "compile_steps", compile_steps)
    monkeypatch.setattr(loading, "subprocess", SimpleNamespace(Popen=Build, DEVNULL=None, PIPE=None))
    monkeypatch.setattr(loading, "warm_up_healing", warm_up_healing)
    loader = loading.Loader(host)
    await asyncio.wait_for(loader.compile_step(loader.loads, engine, ServerOptions()), 30)
    if cached:
        assert said == ["compile", "compiled", "heal"]
    else:  # healing begins as the build does (either may be said first), and once, though the build ends after
        assert said[0] == "compile" and sorted(said[1:3]) == ["build", "heal"] and said[3:] == ["compiled"]
    assert healers == [threading.main_thread()]  # the event loop's, not the low-priority compile thread
    assert not loader.optimizing


async def test_no_healing_for_models_a_newer_load_replaced(engine, monkeypatch, host):
    said = []
    loader = loading.Loader(host)

    def compile_steps(decoder, quantization, build):
        loader.loads += 1  # the settings changed while the step loaded
        return object(), SimpleNamespace(loaded=True, seconds=0.0)

    monkeypatch.setattr(loading, "compile_steps", compile_steps)
    monkeypatch.setattr(loading, "warm_up_healing", lambda tokenizer: said.append("heal"))
    await asyncio.wait_for(loader.compile_step(loader.loads, engine, ServerOptions()), 30)
    assert said == []


class LoadingHost(Host):
    """What a load asks of the server: no progress bars, the statuses it is given."""

    client_capabilities = SimpleNamespace(window=None)

    def __init__(self, worker: ThreadPoolExecutor):
        super().__init__(worker)
        self.statuses: list[str] = []

    def set_status(self, state: str, message: str) -> None:
        self.statuses.append(state)

    def show_error(self, message: str) -> None:
        pass


@pytest.mark.parametrize("fails", [False, True], ids=["loaded", "failed"])
async def test_the_collector_runs_again_once_the_first_load_is_done(engine, monkeypatch, fails):
    """`specdec serve` holds the collector off from its start (harness/serve.py); a load, done or failed, turns it on,
    with what the start made frozen out of its reach."""

    def load(options, progress):
        assert not gc.isenabled()  # still off while the models load
        if fails:
            raise OSError("no such model")
        return engine, False

    monkeypatch.setattr(loading, "_load", load)
    frozen = gc.get_freeze_count()
    gc.disable()
    try:
        with ThreadPoolExecutor(1) as worker:
            host = LoadingHost(worker)
            loader = loading.Loader(host)
            loader.start(ServerOptions())
            assert loader.task is not None
            await asyncio.wait_for(loader.task, 30)
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        assert host.statuses[-1] == ("error" if fails else "ready")
    finally:
        gc.enable()
        gc.unfreeze()


def test_a_reload_gives_back_the_models_it_drops_though_the_start_froze_them(monkeypatch):
    """The start's objects are frozen out of the collector's reach (collect_from_now_on): models a reload drops,
    held in reference cycles, are collected before the new ones load."""

    class Models:  # a dropped engine: its parts refer to one another
        def __init__(self):
            self.itself = self

    old = Models()
    dropped = weakref.ref(old)
    gc.freeze()
    try:
        del old
        gc.collect()
        assert dropped() is not None  # frozen: out of reach
        loaded = SimpleNamespace(decoder="decoder", tokenizer=None)
        monkeypatch.setattr(loading, "load_engine", lambda options, progress: loaded)
        monkeypatch.setattr(loading, "wants_compiled_step", lambda setting, decoder: False)
        assert loading._load(ServerOptions(), None) == (loaded, False)
        assert dropped() is None and gc.get_freeze_count() == 0
        again = Models()  # and unfrozen, at every reload
        dropped = weakref.ref(again)
        del again
        loading._load(ServerOptions(), None)
        assert dropped() is None
    finally:
        gc.unfreeze()
