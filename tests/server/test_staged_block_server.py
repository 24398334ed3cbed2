"""A block in stages through the real server (`blockBudgetMs`): the first lines come at the budget, and the
next ones are decoded while the user looks at them, so taking them brings the next at once. The model
writes "123456789\\n" round and round, one token a round (no draft), so each line is whole a round apart."""

from __future__ import annotations

import asyncio

import pytest
import pytest_lsp
from helpers.lsp import (
    SERVER_COMMAND,
    close_document,
    initialize,
    inline,
    insert_text,
    make_client,
    open_document,
    records,
    save_cycle_model,
)
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

LINE = "123456789"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("staged")
    return {"model": save_cycle_model(root / "model"), "events": root / "events.jsonl"}


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
            "blockBudgetMs": 1,  # past the budget at once: each stage is the first whole line
            "minConfidence": 0,
            "telemetryPath": str(workdir["events"]),
        },
    )
    yield
    await lsp_client.shutdown_session()


def event(workdir, request_id: str) -> dict:
    (found,) = [r for r in records(workdir["events"]) if r.get("request_id") == request_id and "record" not in r]
    return found


async def test_taking_a_blocks_first_lines_brings_the_next_decoded_meanwhile(client: LanguageClient, workdir):
    uri = "file:///work/staged.txt"
    open_document(client, uri, "notes:\n", "plaintext")
    (first,) = await inline(client, uri, 1, 0)
    assert first.insert_text == LINE
    first_event = event(workdir, first.command.arguments[0])
    assert (first_event["stage"], first_event["finish_reason"]) == ("first", "budget")

    await asyncio.sleep(1)  # the user reads the ghost text; the server decodes the next lines meanwhile
    insert_text(client, uri, 2, 1, 0, LINE)  # Tab: the editor inserts it, then runs the item's command
    await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=first.command.command, arguments=first.command.arguments)
    )
    (second,) = await inline(client, uri, 1, len(LINE))
    assert second.insert_text == "\n" + LINE
    second_event = event(workdir, second.command.arguments[0])
    assert second_event["stage"] == "continued" and second_event["finish_reason"] == "budget"
    # served from the decode ahead: this request waited less than that decode took
    assert second_event["latency_ms"] < second_event["total_ms"], second_event
    close_document(client, uri)
