"""llama.cpp (the xllamacpp wheel) on the packaged Gemma-3-270M GGUF, the file the default target
comes from: its speculation is text for text its own AR, and the server's pipeline runs on it."""

from __future__ import annotations

import threading
import time

import pytest

from speccomplete.decoder.backends.llamacpp import LlamaCppDecoder
from speccomplete.decoder.engine import DecodeOptions
from speccomplete.decoder.models import packaged_gguf
from speccomplete.server.completion import Request, complete, load_engine
from speccomplete.server.options import ServerOptions

pytestmark = pytest.mark.integration

PROMPT = "".join(f"def get_{name}(self):\n    return self.{name}\n\n" for name in ("x", "y", "width")) + "def get_"


@pytest.fixture(scope="module")
def gguf():
    return packaged_gguf("gemma3-270m")


def test_speculation_equals_its_own_ar_on_the_packaged_gguf(gguf):
    options = DecodeOptions(max_new_tokens=32)
    ar = LlamaCppDecoder(gguf, threads=1, context=1024, cache_prompt=False).generate(PROMPT, options)
    spec = LlamaCppDecoder(gguf, speculative="ngram-mod", threads=1, context=1024, cache_prompt=False)
    g = spec.generate(PROMPT, options)
    assert g.text == ar.text and ar.stats.new_tokens == 32
    assert "return self." in ar.text  # the real model continues the pattern


def test_the_pipeline_completes_on_the_packaged_gguf():
    options = ServerOptions(backend="llamacpp", telemetry=False)
    engine = load_engine(options)
    request = Request(
        "r", PROMPT + "height", "/w/shapes.py", "python", PROMPT.count("\n"), 14, "invoked", time.perf_counter()
    )
    result = complete(engine, options, request, threading.Event())
    assert result.event.backend == "llamacpp" and result.event.outcome == "shown"
    assert result.text.startswith("(self):")
