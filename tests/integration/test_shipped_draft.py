"""The shipped trained draft on the real packaged Gemma-3-270M: `auto` picks it, it drafts tokens the
target accepts, and greedy speculative output equals plain greedy output token for token; the default
draft cuts the target's head to the most frequent of its vocabulary's ids, and is lossless too.

The first use converts the packaged GGUF once into ~/.cache/specdec (seconds, with its shipped meta).
"""

from __future__ import annotations

import pytest
import torch
from helpers.decoding import check_stats

from speccomplete.decoder.drafts import SHIPPED_DRAFTS, SelfDrafter, build_drafter, default_draft_for, draft_label
from speccomplete.decoder.drafts.spec import TrainedDraft
from speccomplete.decoder.drafts.trained import draft_vocabulary
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.models import load_model

pytestmark = pytest.mark.integration

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return ",
    "#include <stdio.h>\n\nint main(void) {\n    for (int i = 0; i < 10; i++) {\n        ",
    "fn main() {\n    let v: Vec<i32> = (0..10).collect();\n    for x in ",
]


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m", device="cpu", dtype="float32")


def test_auto_resolves_to_the_shipped_draft(gemma):
    target, _ = gemma
    assert default_draft_for(target) == TrainedDraft(SHIPPED_DRAFTS / "gemma3-270m-code")
    assert draft_label("auto", target) == "gemma3-270m-code"


def test_shipped_draft_is_lossless_and_accepted(gemma):
    target, tokenizer = gemma
    drafter, draft = build_drafter("auto", target, tokenizer)
    assert len(draft.vocab_ids) == 32768
    spec = SpeculativeDecoder(target, tokenizer, drafter, FixedGamma(3))
    ar = SpeculativeDecoder(target, tokenizer)
    accepted = 0
    for prompt in PROMPTS:
        want = ar.generate(prompt, DecodeOptions(max_new_tokens=16))
        got = spec.generate(prompt, DecodeOptions(max_new_tokens=16))
        check_stats(got)
        assert got.token_ids == want.token_ids, prompt
        accepted += got.stats.accepted
    assert accepted > 0  # a trained draft: the target accepts some of its tokens


def test_the_default_draft_reads_the_most_frequent_of_the_vocabulary(gemma):
    target, tokenizer = gemma
    drafter, _ = build_drafter("ngram+self", target, tokenizer)
    head = drafter.model.vocab_ids.cpu()
    assert len(head) == SelfDrafter.head_size < 32768
    assert bool(torch.isin(head, draft_vocabulary(SHIPPED_DRAFTS / "gemma3-270m-code", target)).all())
    spec = SpeculativeDecoder(target, tokenizer, drafter, FixedGamma(3))
    ar = SpeculativeDecoder(target, tokenizer)
    for prompt in PROMPTS:
        assert (
            spec.generate(prompt, DecodeOptions(max_new_tokens=16)).token_ids
            == ar.generate(prompt, DecodeOptions(max_new_tokens=16)).token_ids
        ), prompt
