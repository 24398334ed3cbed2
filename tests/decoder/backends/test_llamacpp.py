"""The llamacpp backend on a real llama.cpp (xllamacpp) running the tiny GGUF: the decoder contract
(stop strings, the predicate, cancellation, token budget), the prompt cache, its speculation's
identity with its own AR, and clear errors."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from speccomplete.decoder.backends.llamacpp import GGUFVocabulary, LlamaCppDecoder, LlamaCppError
from speccomplete.decoder.engine import DecodeOptions
from speccomplete.harness.tiny_gguf import write_tiny_gguf

PROMPT = "def add(a, b):\n    return a + b\n\n"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def llama(gguf):
    return LlamaCppDecoder(gguf, threads=1, context=512)


@pytest.fixture(scope="module")
def full(llama):
    """The greedy 40-token completion every early stop must be a prefix of."""
    return llama.generate(PROMPT, DecodeOptions(max_new_tokens=40))


def test_greedy_runs_to_its_budget_and_repeats(llama, full):
    assert full.finish_reason == "length" and full.stats.new_tokens == 40 and full.text
    again = llama.generate(PROMPT, DecodeOptions(max_new_tokens=40))
    assert again.text == full.text
    assert 0 < full.stats.prompt_tokens <= len(PROMPT.encode())  # bytes, and one merge (two spaces)
    assert full.stats.draft_counts == "totals" and full.stats.drafted == 0


def test_stop_string_cuts_before_it(llama, full):
    stop = full.text[10:13]
    g = llama.generate(PROMPT, DecodeOptions(max_new_tokens=40, stop_strings=(stop,)))
    assert g.finish_reason == "stop"
    assert g.text == full.text[: full.text.find(stop)]


def test_predicate_closes_the_stream(llama, full):
    seen: list[str] = []
    g = llama.generate(
        PROMPT, DecodeOptions(max_new_tokens=40, stop_when=lambda text: len(text) >= 5, on_text=seen.append)
    )
    assert g.finish_reason == "predicate"
    assert 5 <= len(g.text) < len(full.text) and full.text.startswith(g.text)
    assert "".join(seen) == g.text


def test_cancel_stops_and_the_next_request_is_served(llama, full):
    cancel = threading.Event()

    def on_text(_):
        cancel.set()

    g = llama.generate(PROMPT, DecodeOptions(max_new_tokens=40, cancel=cancel, on_text=on_text))
    assert g.finish_reason == "cancelled" and len(g.text) < len(full.text)
    assert llama.generate(PROMPT, DecodeOptions(max_new_tokens=40)).text == full.text


def test_prompt_cache_is_reused_when_the_prompt_grows(llama):
    llama.generate(PROMPT, DecodeOptions(max_new_tokens=4))
    g = llama.generate(PROMPT + "def sub(a, b):\n", DecodeOptions(max_new_tokens=4))
    first = llama.generate(PROMPT, DecodeOptions(max_new_tokens=4)).stats.prompt_tokens
    assert g.stats.prompt_reused_tokens >= first - 1  # llama.cpp evaluates at least the last prompt token
    assert g.stats.prompt_tokens > first


def test_speculation_equals_its_own_ar(gguf):
    prompt = "".join(f"x{i} = f(a{i}, b{i})\n" for i in range(20))
    options = DecodeOptions(max_new_tokens=48)
    ar = LlamaCppDecoder(gguf, threads=1, context=512, cache_prompt=False).generate(prompt, options)
    spec = LlamaCppDecoder(gguf, speculative="ngram-mod", threads=1, context=512, cache_prompt=False)
    g = spec.generate(prompt, options)
    assert g.text == ar.text
    assert g.stats.draft_counts == "totals" and g.stats.accepted <= g.stats.drafted


def test_sampling_with_a_seed_repeats(llama):
    from speccomplete.decoder.sampling import SamplingParams

    options = DecodeOptions(max_new_tokens=24, sampling=SamplingParams(temperature=1.0), seed=3)
    assert llama.generate(PROMPT, options).text == llama.generate(PROMPT, options).text


def test_a_prompt_past_the_context_is_a_clear_error_and_loses_nothing(llama, full):
    with pytest.raises(LlamaCppError):
        llama.generate("x" * 2000, DecodeOptions(max_new_tokens=4))
    assert llama.generate(PROMPT, DecodeOptions(max_new_tokens=40)).text == full.text


def test_bad_construction_is_a_clear_error(gguf, tmp_path):
    with pytest.raises(ValueError, match="speculative"):
        LlamaCppDecoder(gguf, speculative="eagle")
    with pytest.raises(FileNotFoundError):
        LlamaCppDecoder(tmp_path / "missing.gguf")
    with pytest.raises(ValueError, match="max_new_tokens"):
        LlamaCppDecoder(gguf, threads=1, context=512).generate("x", DecodeOptions(max_new_tokens=0))


def test_gguf_vocabulary_finds_tokens_without_decoding_them(gguf):
    vocabulary = GGUFVocabulary(gguf)
    assert "<|endoftext|>" in vocabulary and "<s>" in vocabulary
    assert "<fim_prefix>" not in vocabulary and 3 not in vocabulary


def test_dropping_decoders_never_hangs(gguf):
    """A settings reload drops the old decoder; xllamacpp's Server destructor could hang joining its thread."""
    code = (
        "import sys\n"
        "from speccomplete.decoder.backends.llamacpp import LlamaCppDecoder\n"
        "for _ in range(3):\n"
        "    LlamaCppDecoder(sys.argv[1], threads=1, context=512)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(gguf)], timeout=120, check=True, capture_output=True)
