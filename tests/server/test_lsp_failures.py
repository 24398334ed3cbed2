"""A server whose models cannot load stays up and answers empty; bad settings are reported; TCP is local only."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_lsp
from helpers.lsp import (
    SERVER_COMMAND,
    close_document,
    initialize,
    inline,
    make_client,
    open_document,
    save_random_model,
    wait_for_state,
)
from lsprotocol import types
from pygls.lsp.client import LanguageClient as PlainClient
from pytest_lsp import ClientServerConfig, LanguageClient

from speccomplete.harness.stress.wire import StdioServer


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_COMMAND, client_factory=make_client))
async def client(lsp_client: LanguageClient, tmp_path):
    lsp_client.events_path = tmp_path / "events.jsonl"
    yield
    await lsp_client.shutdown_session()


async def test_failed_model_load_is_shown_and_the_server_keeps_serving(client: LanguageClient, tmp_path):
    missing = tmp_path / "no-such-model"
    await initialize(
        client,
        {"target": str(missing), "telemetryPath": str(client.events_path), "maxTokensSingleLine": "lots"},
        ready="error",
    )
    errors = [m for m in client.messages if m.type == types.MessageType.Error]
    assert any("maxTokensSingleLine" in m.message for m in errors), "the bad setting is reported"
    assert any(str(missing) in m.message and "could not load" in m.message for m in errors)
    assert client.statuses[-1]["state"] == "error"

    uri = "file:///work/a.py"
    open_document(client, uri, "def f():\n    ", "python")
    for _ in range(2):  # answers at once, and again: still alive
        assert await inline(client, uri, 1, 4) == []
    result = await client.text_document_completion_async(
        types.CompletionParams(text_document=types.TextDocumentIdentifier(uri), position=types.Position(1, 4))
    )
    assert list(result.items) == []
    close_document(client, uri)
    assert not client.events_path.exists(), "no models, no completions, no events"


async def test_requests_before_the_models_are_ready_answer_empty_at_once(client: LanguageClient, tmp_path):
    model = save_random_model(tmp_path / "model")
    await client.initialize_session(
        types.InitializeParams(
            capabilities=types.ClientCapabilities(),
            initialization_options={"target": str(model), "telemetryPath": str(client.events_path)},
        )
    )
    uri = "file:///work/early.py"
    open_document(client, uri, "def f():\n    ", "python")
    assert await inline(client, uri, 1, 4) == []
    assert "ready" not in [s["state"] for s in client.statuses], "answered while the models were still loading"
    await wait_for_state(client, "ready")
    close_document(client, uri)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_tcp_listens_on_localhost_only():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "SPECDEC_TOKEN": "launch-token"}  # as a client that starts the server passes it
    server = subprocess.Popen([*SERVER_COMMAND, "--tcp", "--port", str(port)], stderr=subprocess.PIPE, env=env)
    try:
        listening = asyncio.run(_listening_while_connected(port))
        assert f"0100007F:{port:04X}" in listening
        assert f"00000000:{port:04X}" not in listening
    finally:
        server.kill()
        server.wait()


async def _listening_while_connected(port: int) -> list[str]:
    """The local addresses in state LISTEN, read while a client is initialized (the server exits after `exit`)."""
    client = PlainClient("tcp-test", "0")
    for _ in range(100):  # the server needs a few seconds to import torch
        try:
            await client.start_tcp("127.0.0.1", port)
            break
        except ConnectionRefusedError:
            await asyncio.sleep(0.2)
    result = await asyncio.wait_for(
        client.initialize_async(
            types.InitializeParams(
                capabilities=types.ClientCapabilities(),
                initialization_options={"target": "/nonexistent", "token": "launch-token"},
            )
        ),
        60,
    )
    assert result.capabilities.inline_completion_provider is not None
    table = await asyncio.to_thread(Path("/proc/net/tcp").read_text)
    listening = [line.split()[1] for line in table.splitlines()[1:] if line.split()[3] == "0A"]  # state LISTEN
    await client.shutdown_async(None)
    client.exit(None)
    await client.stop()
    return listening


def test_requests_before_initialize_get_server_not_initialized():
    server = StdioServer()
    try:
        answer = server.request(1, "textDocument/completion", {"textDocument": {"uri": "file:///a.py"}})
        assert answer is not None and answer["error"]["code"] == types.ErrorCodes.ServerNotInitialized
        answer = server.request(2, "shutdown", None)
        assert answer is not None and "error" in answer, "shutdown too: it comes after initialize"
    finally:
        server.process.kill()
        server.process.wait()


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "x"}',
        b'{"jsonrpc": "2.0", "id": 1.5, "method": "x"}',
    ],
)
def test_an_unreadable_request_is_answered_with_id_null(body):
    """Issue 38: these errors went out without an `id` member; JSON-RPC 2.0 requires it, null here."""
    server = StdioServer()
    try:
        server.send(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        assert server.request(1, "foo/bar", {}) is not None, "answers come in order: the error is in by now"
        assert len(server.inbox.null_id) == 1
        answer = server.inbox.null_id[0]
        assert "id" in answer and answer["id"] is None and answer["error"]["code"] in (-32700, -32600), answer
    finally:
        server.process.kill()
        server.process.wait()
