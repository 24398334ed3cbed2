"""The packaged Gemma-3-270M on int8 weights (the default on CPUs with VNNI or AMX): the product's
decoder (prompt lookup, then the target drafting for itself) equals the same int8 target's AR,
token for token, on real code."""

from __future__ import annotations

import pytest

from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.kernels import Int8Linear
from speccomplete.decoder.loader import load_decoder

pytestmark = pytest.mark.integration

PROMPTS = [
    "def fibonacci(n):\n    ",
    "import os\n\n\ndef list_python_files(path):\n    ",
    "fn main() {\n    let v: Vec<i32> = (0..10).collect();\n    for x in ",
]


def test_speculative_on_int8_equals_its_ar():
    loaded = load_decoder("gemma3-270m", "ngram+self", device="cpu", dtype="float32", quantization="int8")
    assert loaded.quantization == "int8" and isinstance(loaded.target.lm_head, Int8Linear)
    ar = SpeculativeDecoder(loaded.target, loaded.tokenizer, steps=loaded.decoder.steps)
    drafted = 0
    for prompt in PROMPTS:
        want = ar.generate(prompt, DecodeOptions(max_new_tokens=32))
        got = loaded.decoder.generate(prompt, DecodeOptions(max_new_tokens=32))
        assert got.token_ids == want.token_ids, prompt
        assert want.text.strip()
        drafted += got.stats.drafted
    assert drafted > 0
