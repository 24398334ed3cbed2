"""Every decode backend under the same pipeline: the server's `complete` on our decoder (a tiny random
model), on llama.cpp in-process and on an OpenAI-compatible server (llama.cpp's HTTP side on a loopback
port), both running the tiny GGUF. Trimming, cancellation, bad input and the event's backend fields
must not depend on which engine decoded. The last test runs the real language server on llama.cpp.
"""

from __future__ import annotations

import threading
import time

import pytest
import pytest_lsp
from helpers.lsp import SERVER_COMMAND, initialize, inline, latest_event, make_client, open_document, save_random_model
from pytest_lsp import ClientServerConfig, LanguageClient

from speccomplete.decoder.backends.llamacpp import LlamaCppDecoder
from speccomplete.harness.tiny_gguf import write_tiny_gguf
from speccomplete.server.completion import Request, complete, load_engine
from speccomplete.server.options import ServerOptions

DOCUMENT = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return \n"
SINGLE_LINE = (5, 11)  # after "return ": mid-statement
MULTI_LINE = (3, 0)  # an empty line between two functions


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def http_llama(gguf):
    return LlamaCppDecoder(gguf, threads=1, context=512)


@pytest.fixture(scope="module", params=["local", "llamacpp", "openai"])
def pipeline(request, tmp_path_factory, gguf, http_llama):
    settings = {"telemetry": False, "max_tokens_single_line": 16, "max_tokens_multi_line": 48}
    if request.param == "local":
        model = save_random_model(tmp_path_factory.mktemp("model") / "model")
        options = ServerOptions(target=str(model), draft="ngram", **settings)
    elif request.param == "llamacpp":
        options = ServerOptions(backend="llamacpp", gguf=str(gguf), **settings)
    else:
        options = ServerOptions(backend="openai", openai_url=http_llama.server.listening_address + "/v1", **settings)
    return request.param, load_engine(options), options


def _request(line: int, character: int, text: str = DOCUMENT) -> Request:
    return Request("r", text, "/w/m.py", "python", line, character, "invoked", time.perf_counter())


def test_single_line_is_trimmed_to_the_line(pipeline):
    backend, engine, options = pipeline
    result = complete(engine, options, _request(*SINGLE_LINE), threading.Event())
    assert not result.multiline and "\n" not in result.text
    assert all(c >= " " or c == "\t" for c in result.text)  # the random models' control bytes are cut
    assert result.event.backend == backend and result.event.outcome in ("shown", "empty")
    assert result.event.language == "python" and result.event.latency_ms > 0
    assert result.event.generated_tokens > 0


def test_multi_line_at_an_empty_line(pipeline):
    backend, engine, options = pipeline
    result = complete(engine, options, _request(*MULTI_LINE), threading.Event())
    assert result.multiline and result.event.backend == backend
    assert result.event.draft_counts == {"local": "rounds", "llamacpp": "totals"}.get(
        backend, result.event.draft_counts
    )
    assert all(c >= " " or c in "\t\n" for c in result.text)


def test_a_cancelled_request_shows_nothing(pipeline):
    _, engine, options = pipeline
    cancel = threading.Event()
    cancel.set()
    result = complete(engine, options, _request(*MULTI_LINE), cancel)
    assert result.text == "" and result.event.outcome == "cancelled"


def test_bad_input_is_an_error_and_the_next_request_is_served(pipeline):
    _, engine, options = pipeline
    past_the_end = complete(engine, options, _request(40, 0), threading.Event())
    assert past_the_end.event.outcome == "error" and past_the_end.error is not None
    binary = complete(engine, options, _request(0, 3, "def\0"), threading.Event())
    assert binary.event.outcome == "empty"
    again = complete(engine, options, _request(*SINGLE_LINE), threading.Event())
    assert again.event.outcome in ("shown", "empty") and again.error is None


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER_COMMAND, client_factory=make_client))
async def client(lsp_client: LanguageClient):
    yield
    await lsp_client.shutdown_session()


async def test_the_language_server_serves_from_llama_cpp(client: LanguageClient, gguf, tmp_path):
    events = tmp_path / "events.jsonl"
    await initialize(
        client,
        {"backend": "llamacpp", "gguf": str(gguf), "telemetryPath": str(events), "debounceMs": 0},
    )
    uri = "file:///w/llama.py"
    open_document(client, uri, DOCUMENT, "python")
    await inline(client, uri, *SINGLE_LINE)
    event = latest_event(events)
    assert event["backend"] == "llamacpp" and event["language"] == "python"
    assert event["target"] == str(gguf) and event["draft_counts"] == "totals"
