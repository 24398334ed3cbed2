"""Silence when unsure (server/gate.py): the evidence is the target's log-probabilities of the tokens behind
the shown text, and `minConfidence` hides completions below it."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import pytest
from helpers.lsp import save_random_model
from helpers.tokenizers import make_byte_tokenizer

from speccomplete.decoder.engine import Generation
from speccomplete.decoder.stats import GenerationStats
from speccomplete.server import gate
from speccomplete.server.completion import Request, complete, load_engine
from speccomplete.server.options import ServerOptions


def _generation(text: str, logprobs: list[float]) -> Generation:
    tokenizer = make_byte_tokenizer()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(logprobs)
    return Generation(text, ids, "length", GenerationStats(), logprobs)


def test_evidence_counts_only_the_tokens_behind_the_shown_text():
    # one byte a token: "ab" is the first two; the unsure tail that trimming cut does not count
    generation = _generation("ab\ncd", [math.log(0.9), math.log(0.8), math.log(0.1), math.log(0.1), math.log(0.1)])
    found = gate.evidence(generation, "ab", make_byte_tokenizer())
    assert found.tokens == 2
    assert found.confidence == pytest.approx(math.sqrt(0.9 * 0.8))
    assert found.min_probability == pytest.approx(0.8)
    assert not gate.silenced(found, 0.8) and gate.silenced(found, 0.9)
    # two lines shown: the first line's confidence leaves out the newline and the second line
    found = gate.evidence(generation, "ab\nc", make_byte_tokenizer())
    assert found.tokens == 4 and found.first_line_confidence == pytest.approx(math.sqrt(0.9 * 0.8))
    assert found.confidence == pytest.approx((0.9 * 0.8 * 0.1 * 0.1) ** 0.25)


def test_evidence_skips_the_healed_text_the_first_token_wrote_again():
    # token healing (decoder/healing.py): the tokens write " " of the prompt, then the shown "ab\ncd"
    tokenizer = make_byte_tokenizer()
    logprobs = [math.log(p) for p in (0.5, 0.9, 0.8, 0.1, 0.1, 0.1)]
    generation = Generation("ab\ncd", tokenizer(" ab\ncd")["input_ids"], "length", GenerationStats(), logprobs, " ")
    found = gate.evidence(generation, "ab\nc", tokenizer)
    assert found.tokens == 5 and found.first_line_confidence == pytest.approx((0.5 * 0.9 * 0.8) ** (1 / 3))
    assert gate.evidence(generation, "a", tokenizer).tokens == 2


def test_no_logprobs_no_evidence_and_never_silenced():
    generation = Generation("ab", [1, 2], "length", GenerationStats())  # a backend that reports none
    found = gate.evidence(generation, "ab")
    assert found.confidence is None and not gate.silenced(found, 1.0)
    assert gate.evidence(_generation("ab", [0.0, 0.0]), "").tokens == 0  # nothing shown, nothing to judge


@pytest.fixture(scope="module")
def engine_and_options(tmp_path_factory):
    model = save_random_model(tmp_path_factory.mktemp("model") / "model")
    options = ServerOptions(target=str(model), draft="ngram", telemetry=False, max_tokens_single_line=8)
    return load_engine(options), options


def test_the_pipeline_reports_evidence_and_min_confidence_silences(engine_and_options):
    engine, options = engine_and_options
    text = "def add(a, b):\n    return \n"

    def run(min_confidence: float):
        request = Request("r", text, "/w/m.py", "python", 1, 11, "invoked", time.perf_counter())
        return complete(engine, dataclasses.replace(options, min_confidence=min_confidence), request, threading.Event())

    shown = run(0.0)
    assert shown.text and shown.evidence is not None and 0 < shown.evidence.confidence <= 1
    assert shown.event.outcome == "shown"
    silenced = run(min(1.0, shown.evidence.first_line_confidence + 1e-6))
    assert silenced.text == "" and silenced.event.outcome == "empty"
    assert silenced.evidence.confidence == pytest.approx(shown.evidence.confidence)
