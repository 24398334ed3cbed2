"""The openai backend against a real OpenAI-compatible server on a loopback port: llama.cpp's HTTP
server (the xllamacpp wheel serves it beside its in-process API) on the tiny GGUF. A stdlib server
that never answers stands in for a server still prefilling, and one that answers an error."""

from __future__ import annotations

import http.server
import json
import threading
import time

import pytest

from speccomplete.decoder.backends.llamacpp import LlamaCppDecoder
from speccomplete.decoder.backends.openai_compatible import OpenAICompletionsDecoder, OpenAIError
from speccomplete.decoder.engine import DecodeOptions
from speccomplete.harness.tiny_gguf import write_tiny_gguf

PROMPT = "def add(a, b):\n    return a + b\n\n"


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return LlamaCppDecoder(write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf"), threads=1, context=512)


@pytest.fixture(scope="module")
def remote(llama):
    address = llama.server.listening_address
    assert address.startswith("http://127.0.0.1:")  # loopback only
    return OpenAICompletionsDecoder(address + "/v1")


def test_same_completion_as_in_process(llama, remote):
    local = llama.generate(PROMPT, DecodeOptions(max_new_tokens=32))
    g = remote.generate(PROMPT, DecodeOptions(max_new_tokens=32))
    assert g.text == local.text and g.finish_reason == "length"
    assert g.stats.new_tokens == 32 and g.stats.prompt_tokens == local.stats.prompt_tokens
    assert g.stats.draft_counts == "totals" or g.stats.draft_counts == "unreported"


def test_stop_predicate_and_cancel(llama, remote):
    full = remote.generate(PROMPT, DecodeOptions(max_new_tokens=40)).text
    stop = full[10:13]
    g = remote.generate(PROMPT, DecodeOptions(max_new_tokens=40, stop_strings=(stop,)))
    assert g.finish_reason == "stop" and g.text == full[: full.find(stop)]
    g = remote.generate(PROMPT, DecodeOptions(max_new_tokens=40, stop_when=lambda text: len(text) >= 5))
    assert g.finish_reason == "predicate" and full.startswith(g.text) and len(g.text) < len(full)
    cancel = threading.Event()
    g = remote.generate(PROMPT, DecodeOptions(max_new_tokens=40, cancel=cancel, on_text=lambda _: cancel.set()))
    assert g.finish_reason == "cancelled"
    assert remote.generate(PROMPT, DecodeOptions(max_new_tokens=40)).text == full  # the server kept serving


class _Stalling(http.server.BaseHTTPRequestHandler):
    """Reads the request, records its headers, and answers nothing for seconds: a server still prefilling."""

    seen: list[dict] = []

    def do_POST(self):  # noqa: N802 (the stdlib's name)
        self.seen.append(
            {"headers": dict(self.headers), "body": json.loads(self.rfile.read(int(self.headers["Content-Length"])))}
        )
        time.sleep(3)

    def log_message(self, *args):
        pass


class _Refusing(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(404)
        self.end_headers()
        self.wfile.write(b'{"error": "model not found"}')

    def log_message(self, *args):
        pass


def _serve(handler):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_cancel_while_the_server_is_still_prefilling(monkeypatch):
    monkeypatch.setenv("TEST_COMPLETIONS_KEY", "secret")
    server = _serve(_Stalling)
    try:
        remote = OpenAICompletionsDecoder(
            f"http://127.0.0.1:{server.server_port}/v1", model="m", api_key_env="TEST_COMPLETIONS_KEY"
        )
        cancel = threading.Event()
        threading.Timer(0.2, cancel.set).start()
        start = time.perf_counter()
        g = remote.generate("x", DecodeOptions(max_new_tokens=8, stop_strings=("\n",), cancel=cancel))
        assert g.finish_reason == "cancelled" and g.text == ""
        assert time.perf_counter() - start < 2  # not the 3 s the server stalls
        request = _Stalling.seen[-1]
        assert request["headers"]["Authorization"] == "Bearer secret"
        assert request["body"]["model"] == "m" and request["body"]["stop"] == ["\n"] and request["body"]["stream"]
    finally:
        server.shutdown()


def test_an_error_answer_is_a_clear_error():
    server = _serve(_Refusing)
    try:
        remote = OpenAICompletionsDecoder(f"http://127.0.0.1:{server.server_port}/v1")
        with pytest.raises(OpenAIError, match="HTTP 404.*model not found"):
            remote.generate("x", DecodeOptions(max_new_tokens=4))
    finally:
        server.shutdown()


def test_a_bad_url_is_refused():
    with pytest.raises(ValueError, match="http"):
        OpenAICompletionsDecoder("localhost:8080")
