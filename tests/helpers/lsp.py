"""Helpers for the language-server tests: tiny models saved to disk, a client that records the server's
status notifications, and readers for the server's telemetry file.

The server runs as a real subprocess (`python -m speccomplete serve`), so its models must be on disk:
a tiny random Llama with the byte tokenizer (helpers.tiny_models, helpers.tokenizers), saved as safetensors.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import torch
from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities
from pytest_lsp.client import make_test_lsp_client

from helpers.tiny_models import tiny_llama
from helpers.tokenizers import make_byte_tokenizer
from speccomplete.harness.stress.wire import SERVER_COMMAND as SERVER_COMMAND  # one command, the stress checks' too

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "docs" / "examples" / "cases.jsonl"


def save_random_model(path: Path) -> Path:
    """Random weights: the completions are garbage, which is what exercises the trimming."""
    model = tiny_llama(seed=0, layers=2, max_pos=2048)
    model.save_pretrained(path, safe_serialization=True)
    make_byte_tokenizer().save_pretrained(path)
    return path


def always_writing(token: int, layers: int = 2, max_pos: int = 8192, **tiny):
    """A tiny Llama that writes `token` at every position, whatever it reads: every token embeds to the
    same vector and the attention and MLP outputs are zeroed, so the hidden state is that vector at every
    position, and the head maps it to `token`. `tiny`: tiny_llama's vocabulary and special ids."""
    model = tiny_llama(seed=0, layers=layers, max_pos=max_pos, **tiny)
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        embed.copy_(embed[0].expand_as(embed))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = model.get_output_embeddings().weight
        head.zero_()
        head[token] = model.model.norm(embed[0]) * 10
    return model


def save_constant_model(path: Path) -> Path:
    """A model that writes "0" forever and never ends: a decode runs as long as it is allowed to.
    (A digit: a run of letters is a loop, which server/filters/phrase_repeat.py stops at once.)"""
    always_writing(ord("0")).save_pretrained(path, safe_serialization=True)
    make_byte_tokenizer().save_pretrained(path)
    return path


def save_cycle_model(path: Path, cycle: str = "123456789\n") -> Path:
    """A model that writes `cycle` round and round, whatever came before: the token after each character of
    it is the next one (after any other, unknown). Its lines come one token a round, so a block's text grows
    line by line. Attention and MLP outputs are zeroed as in `always_writing`: a position's state is its own
    token's embedding, and the head maps each cycle character's to its successor's row."""
    model = tiny_llama(seed=0, layers=2, max_pos=8192, hidden=64)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
        head.zero_()
        for current, successor in zip(cycle, cycle[1:] + cycle[0]):
            head[ord(successor)] = model.model.norm(embed[ord(current)]) * 10
    model.save_pretrained(path, safe_serialization=True)
    make_byte_tokenizer().save_pretrained(path)
    return path


def make_client() -> LanguageClient:
    """pytest-lsp's test client, also recording the server's `specdec/status` and `specdec/completed`
    notifications in `client.statuses` and `client.completed`."""
    client = make_test_lsp_client()
    client.statuses = []
    client.completed = []

    @client.feature("specdec/status")
    def on_status(ls, params):
        client.statuses.append(params._asdict())  # pygls hands custom params over as a namedtuple

    @client.feature("specdec/completed")
    def on_completed(ls, params):
        client.completed.append(params._asdict())

    return client


async def initialize(client: LanguageClient, options: dict, ready: str = "ready", timeout: float = 120) -> None:
    """Initialize like VS Code does (inline completion, progress) and wait for the models' state."""
    capabilities = client_capabilities("visual-studio-code")
    await client.initialize_session(types.InitializeParams(capabilities=capabilities, initialization_options=options))
    await wait_for_state(client, ready, timeout)


async def wait_for_state(client: LanguageClient, state: str, timeout: float = 120, after: int = 0) -> dict:
    """The first `specdec/status` at index >= after whose state is `state` (or "error" when waiting for ready)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        for status in client.statuses[after:]:
            if status["state"] == state or state == "ready" and status["state"] == "error":
                assert status["state"] == state, f"server reported {status}"
                return status
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"no {state!r} status in {timeout} s; saw {client.statuses}")
        await asyncio.sleep(0.05)


def open_document(client: LanguageClient, uri: str, text: str, language_id: str, version: int = 1) -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id=language_id, version=version, text=text)
        )
    )


def insert_text(client: LanguageClient, uri: str, version: int, line: int, character: int, text: str) -> None:
    """An incremental change: `text` typed at (line, character), making the document `version`."""
    at = types.Position(line, character)
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangePartial(range=types.Range(at, at), text=text)],
        )
    )


def configure(client: LanguageClient, **settings) -> None:
    """workspace/didChangeConfiguration with camelCase specdec settings."""
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings={"specdec": settings}))


def close_document(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))


def inline_params(uri: str, line: int, character: int, invoked: bool = True) -> types.InlineCompletionParams:
    kind = types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
    return types.InlineCompletionParams(
        text_document=types.TextDocumentIdentifier(uri),
        position=types.Position(line, character),
        context=types.InlineCompletionContext(trigger_kind=kind),
    )


async def inline(
    client: LanguageClient, uri: str, line: int, character: int, invoked: bool = True
) -> list[types.InlineCompletionItem]:
    result = await client.text_document_inline_completion_async(inline_params(uri, line, character, invoked))
    return list(result.items if isinstance(result, types.InlineCompletionList) else (result or []))


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def latest_event(path: Path) -> dict:
    """The last completion event written (outcome records aside)."""
    events = [r for r in records(path) if r.get("record") != "outcome"]
    assert events, "no completion event was written"
    return events[-1]


def outcomes(path: Path, request_id: str) -> list[dict]:
    return [r for r in records(path) if r.get("record") == "outcome" and r["request_id"] == request_id]


async def eventually(check, timeout: float = 30):
    """Poll `check()` until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not (value := check()):
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not met in time")
        await asyncio.sleep(0.05)
    return value
