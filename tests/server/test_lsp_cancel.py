"""Cancellation, supersession, stale versions and reuse, with a model that writes "0" forever: a decode
runs until it is stopped or reaches its token limit, so a decode that really stops early shows it.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_lsp
from helpers.lsp import (
    SERVER_COMMAND,
    close_document,
    configure,
    eventually,
    initialize,
    inline,
    inline_params,
    insert_text,
    latest_event,
    make_client,
    open_document,
    outcomes,
    records,
    save_constant_model,
)
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

LONG = 6000  # tokens: tens of seconds of decoding for this model on a busy CPU


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lsp-cancel")
    return {"model": save_constant_model(root / "model"), "events": root / "events.jsonl"}


@pytest_lsp.fixture(
    scope="module", config=ClientServerConfig(server_command=SERVER_COMMAND, client_factory=make_client)
)
async def client(lsp_client: LanguageClient, workdir):
    await initialize(
        lsp_client,
        {
            "target": str(workdir["model"]),
            "draft": "none",
            "debounceMs": 0,
            "telemetryPath": str(workdir["events"]),
            "maxTokensMultiLine": LONG,
        },
    )
    yield
    await lsp_client.shutdown_session()


def events(workdir) -> list[dict]:
    return [r for r in records(workdir["events"]) if r.get("record") != "outcome"]


async def decoding(client: LanguageClient, uri: str, line: int, character: int, msg_id: str) -> asyncio.Future:
    """Send an inline completion request and return once the server is busy decoding it."""
    request = asyncio.ensure_future(
        client.protocol.send_request_async(
            types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, line, character), msg_id=msg_id
        )
    )
    await asyncio.sleep(1.5)  # the request is read at once; give the decode time to get going
    assert not request.done(), "the decode should still be running"
    return request


async def test_cancel_request_stops_the_decode(client: LanguageClient, workdir):
    uri = "file:///work/cancel.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    request = await decoding(client, uri, 1, 0, "cancel-1")
    await cancelled(client, request, "cancel-1")
    event = await eventually(lambda: [e for e in events(workdir) if e["finish_reason"] == "cancelled"])
    (event,) = event
    assert event["outcome"] == "cancelled" and event["multiline"]
    assert 0 < event["generated_tokens"] < LONG, "the decode stopped between rounds, long before its limit"
    close_document(client, uri)


async def test_newer_request_supersedes_the_running_decode(client: LanguageClient, workdir):
    uri = "file:///work/supersede.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    seen = len(events(workdir))
    first = await decoding(client, uri, 1, 0, "supersede-1")
    configure(client, maxTokensMultiLine=16)
    second = await inline(client, uri, 1, 0)
    first_result = await asyncio.wait_for(first, 60)
    assert not first_result.items, "the superseded request answers empty"
    assert second and second[0].insert_text == "0" * 16
    old, new = events(workdir)[seen:]
    assert old["outcome"] == "cancelled" and 0 < old["generated_tokens"] < LONG
    assert new["outcome"] == "shown" and new["generated_tokens"] == 16
    configure(client, maxTokensMultiLine=LONG)
    close_document(client, uri)


async def cancelled(client: LanguageClient, request: asyncio.Future, msg_id: str) -> None:
    """Cancel the request `msg_id`: its answer is the cancellation's error."""
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
    with pytest.raises(JsonRpcException) as error:
        await asyncio.wait_for(request, 60)
    assert error.value.code == types.LSPErrorCodes.RequestCancelled


def completion_params(uri: str, line: int, character: int) -> types.CompletionParams:
    return types.CompletionParams(
        text_document=types.TextDocumentIdentifier(uri), position=types.Position(line, character)
    )


async def test_completion_requests_do_not_cancel_the_inline_decode(client: LanguageClient, workdir):
    """A completion plugin asks on every key: its requests take their own lane."""
    uri = "file:///work/lanes.txt"
    open_document(client, uri, "notes: a\n", "plaintext")
    inline_request = await decoding(client, uri, 1, 0, "lanes-1")
    plugin = asyncio.ensure_future(client.text_document_completion_async(completion_params(uri, 0, 8)))
    await asyncio.sleep(1.0)
    assert not inline_request.done(), "the completion request left the inline decode running"
    await cancelled(client, inline_request, "lanes-1")
    answer = await asyncio.wait_for(plugin, 60)
    assert answer.items and answer.items[0].text_edit.new_text.startswith("0"), "then the plugin's request ran"
    close_document(client, uri)


async def test_one_decode_serves_both_lanes_at_the_same_position(client: LanguageClient, workdir):
    uri = "file:///work/shared.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    configure(client, maxTokensMultiLine=16)
    seen = len(events(workdir))
    ghost, plugin = await asyncio.gather(
        inline(client, uri, 1, 0), client.text_document_completion_async(completion_params(uri, 1, 0))
    )
    assert ghost[0].insert_text == plugin.items[0].text_edit.new_text == "0" * 16
    assert len(events(workdir)) == seen + 1, "one decode, one event"
    configure(client, maxTokensMultiLine=LONG)
    close_document(client, uri)


async def test_a_request_waiting_on_a_cancelled_decode_decodes_on_its_own(client: LanguageClient, workdir):
    """VS Code cancels its inline request as it opens the suggest widget, which asks for the same spot:
    the widget's request must not inherit the cancellation's empty answer."""
    uri = "file:///work/handover.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    inline_request = await decoding(client, uri, 1, 0, "handover-1")
    configure(client, maxTokensMultiLine=16)  # the widget's own decode is short
    plugin = asyncio.ensure_future(client.text_document_completion_async(completion_params(uri, 1, 0)))
    await asyncio.sleep(0.5)  # it joined the inline decode
    await cancelled(client, inline_request, "handover-1")
    answer = await asyncio.wait_for(plugin, 60)
    assert answer.items and answer.items[0].text_edit.new_text == "0" * 16
    configure(client, maxTokensMultiLine=LONG)
    close_document(client, uri)


async def test_a_change_stops_the_decode_and_its_result_is_dropped(client: LanguageClient, workdir):
    uri = "file:///work/stale.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    configure(client, maxTokensMultiLine=1500)
    seen = len(events(workdir))
    request = asyncio.ensure_future(client.text_document_inline_completion_async(inline_params(uri, 1, 0)))
    await asyncio.sleep(0.3)
    insert_text(client, uri, 2, 0, 0, "my ")
    result = await asyncio.wait_for(request, 120)
    assert not result.items
    (event,) = events(workdir)[seen:]
    assert event["outcome"] == "cancelled", "the document changed meanwhile"
    assert event["generated_tokens"] < 1500, "the change stopped the decode (did_change), the worker is free"
    close_document(client, uri)


async def test_debounced_request_for_a_changed_document_never_decodes(client: LanguageClient, workdir):
    uri = "file:///work/debounce.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    configure(client, debounceMs=500, maxTokensSingleLine=8)
    seen = len(events(workdir))
    typing = asyncio.ensure_future(inline(client, uri, 1, 0, invoked=False))
    await asyncio.sleep(0.1)
    insert_text(client, uri, 2, 1, 0, "a")
    latest = await inline(client, uri, 1, 1, invoked=False)
    assert await typing == []
    assert latest and latest[0].insert_text == "0" * 8
    skipped, decoded = events(workdir)[seen:]
    assert skipped["outcome"] == "cancelled", "a request cancelled in its debounce is recorded"
    assert skipped["prompt_tokens"] == 0 and skipped["generated_tokens"] == 0, "and never reached the decoder"
    assert decoded["outcome"] == "shown" and decoded["generated_tokens"] == 8
    assert decoded["debounce_ms"] >= 500, "the wait before decoding is recorded, apart from the latency after it"
    configure(client, debounceMs=0)
    close_document(client, uri)


async def test_typing_along_serves_the_rest_without_decoding(client: LanguageClient, workdir):
    uri = "file:///work/reuse.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    configure(client, maxTokensMultiLine=10)
    (item,) = await inline(client, uri, 1, 0)
    assert item.insert_text == "0" * 10
    first_id = item.command.arguments[0]
    insert_text(client, uri, 2, 1, 0, "000")
    (rest,) = await inline(client, uri, 1, 3)
    assert rest.insert_text == "0" * 7
    assert rest.range.start == types.Position(1, 3)
    event = latest_event(workdir["events"])
    assert event["finish_reason"] == "reused" and event["generated_tokens"] == 0
    assert event["request_id"] == rest.command.arguments[0] != first_id
    (typed,) = outcomes(workdir["events"], first_id)
    assert typed["outcome"] == "partial" and typed["accepted_chars"] == 3
    close_document(client, uri)


async def test_shown_completion_is_rejected_after_the_timeout(client: LanguageClient, workdir):
    uri = "file:///work/timeout.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    configure(client, maxTokensMultiLine=4, rejectAfterS=0.5)
    (item,) = await inline(client, uri, 1, 0)
    request_id = item.command.arguments[0]
    (outcome,) = await eventually(lambda: outcomes(workdir["events"], request_id), timeout=10)
    assert outcome["outcome"] == "rejected"
    # accepting it later still counts: the analysis takes the latest outcome
    assert (
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="specdec.accept", arguments=[request_id])
        )
        is True
    )
    assert [o["outcome"] for o in outcomes(workdir["events"], request_id)] == ["rejected", "accepted"]
    close_document(client, uri)


@pytest.mark.parametrize("prefill_on_edit", [True, False])
async def test_the_first_edit_in_a_document_reads_its_prompt_ahead(client: LanguageClient, workdir, prefill_on_edit):
    """At the first edit in a document whose prompt the model has not read, the server reads it while the
    user types on, so the request at the pause prefills only what was typed since; off, it reads it all then."""
    uri = f"file:///work/ahead-{prefill_on_edit}.txt"
    text = "".join(f"{prefill_on_edit} note {i}: nothing to see\n" for i in range(60))  # ~1,800 tokens
    configure(client, prefillOnEdit=prefill_on_edit)
    open_document(client, uri, text, "plaintext")
    insert_text(client, uri, 2, 60, 0, "n")
    await asyncio.sleep(2)  # typing on: the server reads meanwhile
    insert_text(client, uri, 3, 60, 1, "o")
    await inline(client, uri, 60, 2)
    event = latest_event(workdir["events"])
    unread = event["prompt_tokens"] - event["prompt_reused_tokens"]
    assert unread <= 4 if prefill_on_edit else unread > event["prompt_tokens"] / 2, event
    configure(client, prefillOnEdit=True)
    close_document(client, uri)
