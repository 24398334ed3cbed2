"""The language server over stdio with a tiny random model: capabilities, loading, an inline completion in
each of the 14 languages, the completion fallback, acceptance, settings, and bad input.

One server serves the whole module (starting one costs seconds); each test opens its own documents.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from concurrent.futures import Future

import pytest
import pytest_lsp
from helpers.lsp import (
    EXAMPLES,
    SERVER_COMMAND,
    close_document,
    configure,
    eventually,
    inline,
    insert_text,
    latest_event,
    make_client,
    open_document,
    outcomes,
    records,
    save_random_model,
    wait_for_state,
)
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

from speccomplete.harness.lib.cases import read_cases
from speccomplete.telemetry.events import CompletionEvent

pytestmark = pytest.mark.asyncio(loop_scope="module")

CASES = read_cases(EXAMPLES)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("lsp")
    return {"model": save_random_model(root / "model"), "events": root / "events.jsonl"}


@pytest_lsp.fixture(
    scope="module", config=ClientServerConfig(server_command=SERVER_COMMAND, client_factory=make_client)
)
async def client(lsp_client: LanguageClient, workdir):
    # Neovim 0.11 offers UTF-8 positions first; the server must still settle on UTF-16.
    capabilities = client_capabilities("neovim@v0.11.0")
    lsp_client.init_result = await lsp_client.initialize_session(
        types.InitializeParams(
            capabilities=capabilities,
            initialization_options={
                "target": str(workdir["model"]),
                "draft": "layers:0",
                "telemetryPath": str(workdir["events"]),
                "maxTokensMultiLine": 48,
                "maxTokensSingleLine": 24,
                "minConfidence": 0,  # random weights are unsure of every token: the gate would hide all
                "debounceMs": 0,
                "someFutureSetting": 1,
            },
        )
    )
    await wait_for_state(lsp_client, "ready")
    yield
    await lsp_client.shutdown_session()


async def test_initialize_advertises_features(client: LanguageClient):
    capabilities = client.init_result.capabilities
    assert capabilities.inline_completion_provider is not None
    assert capabilities.completion_provider is not None
    assert list(capabilities.execute_command_provider.commands) == ["specdec.accept"]
    assert capabilities.text_document_sync.change == types.TextDocumentSyncKind.Incremental
    assert capabilities.position_encoding == types.PositionEncodingKind.Utf16


async def test_models_load_with_progress(client: LanguageClient, workdir):
    states = [s["state"] for s in client.statuses]
    loaded = states.index("ready")
    assert loaded >= 1 and set(states[:loaded]) == {"loading"}
    assert workdir["model"].name in client.statuses[loaded]["message"]
    reports = [r for values in client.progress_reports.values() for r in values]
    assert isinstance(reports[0], types.WorkDoneProgressBegin) and isinstance(reports[-1], types.WorkDoneProgressEnd)
    # with no conversion to report, the load still says where it is at, in order, up to 100%
    middle = reports[1:-1]
    assert [r.message.split(" ")[0] for r in middle] == ["reading", "loading", "packing", "loaded"]
    assert [r.percentage for r in middle] == [80, 90, 95, 100]
    assert not client.messages, "the unknown setting is ignored, not an error"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_inline_completion_in_each_language(client: LanguageClient, workdir, case):
    uri = f"file:///work/{case.path}"
    open_document(client, uri, case.text, case.language)
    items = await inline(client, uri, case.line, case.character)
    close_document(client, uri)

    event = latest_event(workdir["events"])
    assert event["language"] == case.language
    assert event["multiline"] == case.id.endswith("-block")  # an empty line in a block vs mid-line
    assert event["trigger"] == "invoked" and event["source"] == "editor" and event["text"] is None
    assert event["generated_tokens"] <= (48 if event["multiline"] else 24)
    assert event["latency_ms"] >= event["total_ms"] > 0
    if not items:
        assert event["outcome"] == "empty"
        return
    (item,) = items
    assert event["outcome"] == "shown" and list(item.command.arguments) == [event["request_id"]]
    position = types.Position(case.line, case.character)
    assert item.range == types.Range(position, position)
    text = item.insert_text
    assert text.strip(), "a completion of only whitespace is trimmed to nothing"
    if not event["multiline"]:
        assert "\n" not in text
    else:
        assert "\n\n\n" not in text
        # nothing is left dedented below the cursor's block: the trimming ends the scope there
        indent = len(case.text.splitlines()[case.line])
        for line in text.split("\n")[1:]:
            if line.strip():
                assert len(line) - len(line.lstrip()) >= indent or line.strip()[0] in ")]}", repr(text)


async def test_completion_fallback(client: LanguageClient, workdir):
    case = next(c for c in CASES if c.id == "python-line")
    uri = "file:///work/fallback.py"
    open_document(client, uri, case.text, "python")
    result = await client.text_document_completion_async(
        types.CompletionParams(
            text_document=types.TextDocumentIdentifier(uri),
            position=types.Position(case.line, case.character),
            context=types.CompletionContext(trigger_kind=types.CompletionTriggerKind.Invoked),
        )
    )
    close_document(client, uri)
    event = latest_event(workdir["events"])
    assert result.is_incomplete
    if event["outcome"] == "empty":
        assert result.items == []
        return
    (item,) = result.items
    position = types.Position(case.line, case.character)
    assert item.text_edit.range == types.Range(position, position)
    assert item.text_edit.new_text and "\n" not in item.text_edit.new_text
    assert list(item.command.arguments) == [event["request_id"]]


async def test_accept_records_the_outcome(client: LanguageClient, workdir):
    uri = "file:///work/accept.txt"
    open_document(client, uri, "alpha beta\ngamma ", "plaintext")
    items = await eventually_items(client, uri)
    request_id = items[0].command.arguments[0]
    assert (
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="specdec.accept", arguments=[request_id])
        )
        is True
    )
    (outcome,) = outcomes(workdir["events"], request_id)
    assert outcome["outcome"] == "accepted" and outcome["accepted_chars"] == len(items[0].insert_text)
    # a second accept, or an unknown id, changes nothing
    assert (
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="specdec.accept", arguments=[request_id])
        )
        is False
    )
    assert len(outcomes(workdir["events"], request_id)) == 1
    with pytest.raises(JsonRpcException):
        await client.workspace_execute_command_async(
            types.ExecuteCommandParams(command="specdec.accept", arguments=[1, 2])
        )
    close_document(client, uri)


async def eventually_items(client: LanguageClient, uri: str) -> list[types.InlineCompletionItem]:
    """A random model can trim to nothing at a given position; some position at the end of the text will not."""
    for character in range(6):
        insert_text(client, uri, 10 + character, 1, 6 + character, "q")
        items = await inline(client, uri, 1, 7 + character)
        if items:
            return items
    pytest.fail("no completion at any of six positions")


async def test_a_shown_completion_is_rejected_when_superseded(client: LanguageClient, workdir):
    uri = "file:///work/rejected.txt"
    open_document(client, uri, "alpha beta\ngamma ", "plaintext")
    first = (await eventually_items(client, uri))[0].command.arguments[0]
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=99),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text="something else entirely\n")],
        )
    )
    await inline(client, uri, 1, 0)
    (outcome,) = outcomes(workdir["events"], first)
    assert outcome["outcome"] == "rejected"
    # the accept was on its way when the other request replaced it: the user's verdict wins
    assert await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command="specdec.accept", arguments=[first])
    )
    assert [o["outcome"] for o in outcomes(workdir["events"], first)] == ["rejected", "accepted"]
    close_document(client, uri)


async def test_configuration_changes_apply(client: LanguageClient, workdir):
    uri = "file:///work/config.py"
    text = "def f(x):\n    return x + "
    open_document(client, uri, text, "python")
    configure(client, maxTokensSingleLine=3, gamma="2", telemetryText=True)
    items = await inline(client, uri, 1, 15)
    event = latest_event(workdir["events"])
    assert event["generated_tokens"] <= 3
    assert event["text"] == (items[0].insert_text if items else None), "the user opted in to storing text"
    assert event["settings"]["gamma"] == "2" and event["settings"]["max_tokens_single_line"] == 3
    # the first round drafts the new fixed γ without reloading (later ones no more than is still wanted)
    assert event["gammas"][0] == 2 and set(event["gammas"]) <= {0, 1, 2}

    # a wrong type is reported and that one key keeps its value; the server keeps serving
    configure(client, maxTokensSingleLine="many", temperature=0.0)
    await eventually(lambda: client.messages)
    assert client.messages[-1].type == types.MessageType.Error and "maxTokensSingleLine" in client.messages[-1].message
    await inline(client, uri, 1, 15)
    assert latest_event(workdir["events"])["settings"]["max_tokens_single_line"] == 3

    # a model setting reloads the models
    seen = len(client.statuses)
    configure(client, draft="ngram", maxTokensSingleLine=24, gamma="heuristic", telemetryText=False)
    await wait_for_state(client, "loading", after=seen)
    await wait_for_state(client, "ready", after=seen)
    await inline(client, uri, 1, 15)
    assert latest_event(workdir["events"])["draft"] == "ngram"
    close_document(client, uri)


async def test_enabled_languages(client: LanguageClient, workdir):
    uri = "file:///work/disabled.rb"
    open_document(client, uri, "def f\n  1 + \nend\n", "ruby")
    configure(client, enabledLanguages=["python"])
    assert await inline(client, uri, 1, 6) == []
    assert latest_event(workdir["events"])["outcome"] == "empty"
    configure(client, enabledLanguages=None)
    close_document(client, uri)


# ---------------------------------------------------------------------------------------------- bad input


async def still_serving(client: LanguageClient) -> None:
    uri = "file:///work/alive.py"
    open_document(client, uri, "x = 1\ny = ", "python")
    seen = len(records_of(client))
    await inline(client, uri, 1, 4)
    close_document(client, uri)
    assert len(records_of(client)) > seen, "the server answered and wrote an event"


def records_of(client: LanguageClient) -> list[dict]:
    return records(client.events_path)


@pytest.fixture(autouse=True)
def _events_path(client, workdir):
    client.events_path = workdir["events"]


@pytest.mark.parametrize("line, character", [(5, 0), (0, 99), (1, 7)])
async def test_position_past_the_end_is_an_error(client: LanguageClient, workdir, line, character):
    uri = "file:///work/past_end.py"
    open_document(client, uri, "x = 1\ny = ", "python")
    with pytest.raises(JsonRpcException) as error:
        await inline(client, uri, line, character)
    assert error.value.code == types.ErrorCodes.InvalidParams
    assert latest_event(workdir["events"])["outcome"] == "error"
    close_document(client, uri)
    await still_serving(client)


async def test_utf16_offsets(client: LanguageClient, workdir):
    # "😀" is two UTF-16 code units, 5 and 6: column 6 falls inside it; the line is 11 units long
    uri = "file:///work/emoji.py"
    text = 's = "😀" + '
    open_document(client, uri, text, "python")
    for character in (5, 6, 7, 11):
        items = await inline(client, uri, 0, character)
        assert all(item.range.start == types.Position(0, character) for item in items)
        assert latest_event(workdir["events"])["outcome"] in ("shown", "empty")
    with pytest.raises(JsonRpcException):
        await inline(client, uri, 0, 12)  # one past the end of the line, in UTF-16 units
    close_document(client, uri)
    await still_serving(client)


async def test_huge_document_answers_empty(client: LanguageClient, workdir):
    uri = "file:///work/huge.py"
    open_document(client, uri, "x = 1\n" * 900_000, "python")  # 5.4 MB
    assert await inline(client, uri, 900_000, 0) == []
    event = latest_event(workdir["events"])
    assert event["outcome"] == "empty" and event["prompt_tokens"] == 0 and event["empty_reason"] == "too-large"
    assert client.completed[-1]["reason"] == "too-large"  # the client hears why
    close_document(client, uri)
    await still_serving(client)


async def test_binary_content_answers_empty(client: LanguageClient, workdir):
    uri = "file:///work/blob.py"
    open_document(client, uri, "\x7fELF\x00\x01\x02 = ", "python")
    assert await inline(client, uri, 0, 10) == []
    assert latest_event(workdir["events"])["empty_reason"] == "binary"
    close_document(client, uri)
    await still_serving(client)


async def test_unknown_language_still_completes(client: LanguageClient, workdir):
    uri = "file:///work/notes.weird"
    open_document(client, uri, "items:\n  first\n  ", "weirdlang")
    items = await inline(client, uri, 2, 2)
    event = latest_event(workdir["events"])
    assert event["language"] == "text" and event["multiline"], event
    assert event["generated_tokens"] > 0, "a language without a grammar is still decoded"
    assert all(item.range.start == types.Position(2, 2) for item in items)
    close_document(client, uri)


@pytest.mark.parametrize("uri", ["file:///work/a%20b.py", "file:///work/caf%C3%A9.py", "file:///c%3A/work/win.py"])
async def test_percent_encoded_uris_get_completions(client: LanguageClient, workdir, uri):
    """Spaces, non-ASCII names and Windows drive letters arrive percent-encoded."""
    before = len(records(workdir["events"]))
    open_document(client, uri, "def add(a, b):\n    ", "python")
    await inline(client, uri, 1, 4)
    close_document(client, uri)
    assert len(records(workdir["events"])) > before, "no completion was decoded"
    event = latest_event(workdir["events"])
    assert event["language"] == "python" and event["generated_tokens"] > 0


@pytest.mark.parametrize("newline", ["\r", "\r\n"])
async def test_cr_and_crlf_documents_complete(client: LanguageClient, workdir, newline):
    uri = f"file:///work/lines{len(newline)}.py"
    before = len(records(workdir["events"]))
    open_document(client, uri, newline.join(["def f(x):", "    y = x * 2", "    "]), "python")
    await inline(client, uri, 2, 4)  # line 2 exists whatever the terminator
    close_document(client, uri)
    assert len(records(workdir["events"])) > before, "no completion was decoded"
    assert latest_event(workdir["events"])["language"] == "python"


async def test_unopened_document_answers_empty(client: LanguageClient):
    assert await inline(client, "file:///work/never_opened.py", 0, 0) == []
    await still_serving(client)


async def test_malformed_params_get_an_error(client: LanguageClient):
    method = types.TEXT_DOCUMENT_INLINE_COMPLETION
    for params in ({"textDocument": 5}, {"textDocument": {"uri": "file:///x.py"}, "position": {"line": -1}}, "junk"):
        with pytest.raises(JsonRpcException) as error:
            await send_raw(client, method, params)
        assert error.value.code == types.ErrorCodes.InvalidParams
    await still_serving(client)


async def test_a_second_initialize_is_refused_and_forgets_nothing(client: LanguageClient, workdir):
    uri = "file:///work/kept.py"
    open_document(client, uri, "def total(items):\n    ", "python")
    ready = len(client.statuses)
    with pytest.raises(JsonRpcException) as error:
        await send_raw(client, types.INITIALIZE, {"capabilities": {}, "initializationOptions": {"target": "/none"}})
    assert error.value.code == types.ErrorCodes.InvalidRequest
    before = len(records(workdir["events"]))
    await inline(client, uri, 1, 4)
    assert len(records(workdir["events"])) > before, "the document is still open and the models still loaded"
    assert all(s["state"] != "loading" for s in client.statuses[ready:]), "nothing was reloaded"
    close_document(client, uri)


async def send_raw(client: LanguageClient, method: str, params):
    """Send a request as raw JSON, bypassing the client's own typing, as a broken client would."""
    msg_id = uuid.uuid4().hex
    future: Future = Future()
    client.protocol._request_futures[msg_id] = future
    body = json.dumps({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}).encode()
    client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return await asyncio.wait_for(asyncio.wrap_future(future), 30)


def send_raw_notification(client: LanguageClient, method: str, params) -> None:
    """Send a notification as raw JSON (lone surrogates escaped, any value anywhere), as a broken client would."""
    body = json.dumps({"jsonrpc": "2.0", "method": method, "params": params}).encode()
    client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)


async def test_a_non_string_language_id_does_not_poison_the_document(client: LanguageClient, workdir):
    """Issue 38: `languageId: 5` was kept, and every later completion failed with -32603 (`int.lower`)."""
    uri = "file:///work/numbered.py"
    item = {"uri": uri, "languageId": 5, "version": 1, "text": "def add(a, b):\n    "}
    send_raw_notification(client, types.TEXT_DOCUMENT_DID_OPEN, {"textDocument": item})
    for _ in range(2):
        before = len(records(workdir["events"]))
        await inline(client, uri, 1, 4)  # raised JsonRpcException (-32603) before the fix
        assert len(records(workdir["events"])) > before, "the document is open and completes"
        event = latest_event(workdir["events"])
        assert event["outcome"] in ("shown", "empty") and event["language"] == "python", "the path decides"
    close_document(client, uri)


async def test_lone_surrogates_in_a_document_reach_no_tokenizer_and_no_popup(client: LanguageClient, workdir):
    """Issue 38: JSON's "\\ud800" escapes left lone surrogates in the text, the tokenizer refused it, and
    the user saw `specdec: completion failed: TextEncodeInput must be Union[...]`."""
    uri = "file:///work/dir\ud800/lone.py"  # a lone surrogate in the path too: snippets name it in prompts
    item = {"uri": uri, "languageId": "python", "version": 1, "text": "s = '\ud800'\nt = "}
    send_raw_notification(client, types.TEXT_DOCUMENT_DID_OPEN, {"textDocument": item})
    edit = {"range": {"start": {"line": 1, "character": 4}, "end": {"line": 1, "character": 4}}, "text": "'\udc00' + "}
    send_raw_notification(
        client,
        types.TEXT_DOCUMENT_DID_CHANGE,
        {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [edit]},
    )
    popups = len(client.messages)
    await inline(client, uri, 1, 10)  # U+FFFD is one UTF-16 unit, as the surrogate was: the editor's column
    event = latest_event(workdir["events"])
    assert event["outcome"] in ("shown", "empty") and event["generated_tokens"] > 0, event
    assert not [m.message for m in client.messages[popups:] if "completion failed" in m.message]
    close_document(client, uri)


async def test_events_follow_the_schema(client: LanguageClient, workdir):
    for record in records(workdir["events"]):
        if record.get("record") != "outcome":
            CompletionEvent.from_dict(record)
    assert any(r.get("record") != "outcome" for r in records(workdir["events"]))


async def test_another_open_document_reaches_the_prompt_when_context_is_on(client: LanguageClient, workdir):
    """contextBudgetChars (server/snippets.py): the most similar window of another open document in the
    language goes before the prompt, which grows by its tokens; at 0, the default, nothing does."""
    other, uri = "file:///work/pkg/headers.py", "file:///work/pkg/main.py"
    fields = "    size = header.get('size')\n    name = header.get('name')\n    kind = header.get('kind')\n"
    open_document(client, other, "def dump(header):\n" + fields + "    return size, name, kind\n", "python")
    text = "import sys\n\n\ndef main(header):\n" + fields + "    print(size, name, kind)\n    "
    open_document(client, uri, text, "python")
    await inline(client, uri, 8, 4)
    without = latest_event(workdir["events"])
    configure(client, contextBudgetChars=500)
    await inline(client, uri, 8, 4)
    with_context = latest_event(workdir["events"])
    configure(client, contextBudgetChars=0)
    assert without["settings"]["context_budget_chars"] == 0
    assert with_context["settings"]["context_budget_chars"] == 500
    # the window: a comment line naming headers.py and the 5 lines of dump, commented out
    assert with_context["prompt_tokens"] >= without["prompt_tokens"] + 30
    close_document(client, other)
    close_document(client, uri)
