"""The server's compiled CPU step (server/loading.py, decoder/compiled_step.py), with `compileStep` on: the status
says `optimizing` while a thread builds it, completions are answered meanwhile, and once it is in use the
answers are the eager step's; a second server loads it from the model cache instead of building it."""

from __future__ import annotations

import asyncio
import os

import pytest
import pytest_lsp
from helpers.lsp import (
    SERVER_COMMAND,
    close_document,
    inline,
    make_client,
    open_document,
    save_random_model,
    wait_for_state,
)
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

pytestmark = pytest.mark.asyncio(loop_scope="module")

TEXT = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n\ndef sub(a, b):\n    retu"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("compiled")
    return {"model": save_random_model(root / "model"), "cache": root / "cache"}


def options(workdir, compile_step: bool) -> dict:
    return {
        "target": str(workdir["model"]),
        "draft": "ngram+self",
        "compileStep": compile_step,
        "minConfidence": 0,  # random weights are unsure of every token: the gate would hide all
        "debounceMs": 0,
        "maxTokensSingleLine": 16,
    }


async def start(client: LanguageClient, workdir, compile_step: bool) -> None:
    await client.initialize_session(
        types.InitializeParams(
            capabilities=client_capabilities("visual-studio-code"),
            initialization_options=options(workdir, compile_step),
        )
    )


async def completion(client: LanguageClient, uri: str) -> str:
    open_document(client, uri, TEXT, "python")
    items = await inline(client, uri, 7, 8)
    close_document(client, uri)
    return items[0].insert_text if items else ""


async def optimized(client: LanguageClient, timeout: float = 600) -> list[dict]:
    """The ready statuses, once one said optimizing and a later one no longer does."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        seen = [s for s in client.statuses if s["state"] == "ready"]
        if any(s["optimizing"] for s in seen) and not seen[-1]["optimizing"]:
            return seen
        assert not any(s["state"] == "error" for s in client.statuses), client.statuses
        await asyncio.sleep(0.1)
    raise TimeoutError(f"never done optimizing: {client.statuses}")


@pytest_lsp.fixture(
    scope="module", config=ClientServerConfig(server_command=SERVER_COMMAND, client_factory=make_client)
)
async def eager(lsp_client: LanguageClient, workdir):
    await start(lsp_client, workdir, compile_step=False)
    await wait_for_state(lsp_client, "ready")
    yield lsp_client
    await lsp_client.shutdown_session()


async def test_the_step_builds_in_the_background_then_loads(eager: LanguageClient, workdir):
    want = await completion(eager, "file:///work/eager.py")
    assert not any(s["optimizing"] for s in eager.statuses)  # off: nothing built

    config = ClientServerConfig(
        server_command=SERVER_COMMAND,
        client_factory=make_client,
        server_env={**os.environ, "SPECDEC_CACHE": str(workdir["cache"])},
    )
    built_at = None
    for start_number in (1, 2):  # the first builds the cache entry, the second loads it
        client = await config.start()
        try:
            await start(client, workdir, compile_step=True)
            await wait_for_state(client, "ready")
            during = await completion(client, f"file:///work/during-{start_number}.py")  # answered meanwhile
            await optimized(client)
            after = await completion(client, f"file:///work/after-{start_number}.py")
            assert during == want and after == want, start_number
            (entry,) = (workdir["cache"] / "compiled").glob("*.bin")
            if built_at is None:
                built_at = entry.stat().st_mtime_ns
            else:
                assert entry.stat().st_mtime_ns == built_at  # loaded, not built again
        finally:
            await client.shutdown_session()
            await client.stop()
