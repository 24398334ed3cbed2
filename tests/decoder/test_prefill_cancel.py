"""A prefill in chunks: a cancel stops it between chunks, leaves the caches as the last request did,
and chunking changes no token."""

from __future__ import annotations

import pytest
from helpers.decoding import generate, random_prompts

import speccomplete.decoder.engine as engine
from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, NgramDrafter
from speccomplete.decoder.engine import SpeculativeDecoder, round_rows
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.target_steps import FixedShapeTarget

CHUNK = 16  # small, so the tiny models' prompts of a few dozen bytes span several chunks
FILE = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n"  # 73 bytes
NEW = 12


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(engine, "PREFILL_CHUNK", CHUNK)


class SetAfter:
    """A cancel flag that reads clear at its first `checks` checks and set from then on."""

    def __init__(self, checks: int):
        self.checks_left = checks

    def is_set(self) -> bool:
        self.checks_left -= 1
        return self.checks_left < 0


def make_drafter(kind, llama_other):
    if kind == "model":
        return ModelDrafter(llama_other)
    if kind == "ngram":
        return NgramDrafter()
    return None


def spy_on_steps(decoder, monkeypatch) -> list[int]:
    """The length of every feed the target's steps get from now on."""
    feeds: list[int] = []
    forward, feed = decoder.steps.forward, decoder.steps.feed

    def counting_forward(ids, keep):
        feeds.append(len(ids))
        return forward(ids, keep)

    def counting_feed(ids):
        feeds.append(len(ids))
        return feed(ids)

    monkeypatch.setattr(decoder.steps, "forward", counting_forward)
    monkeypatch.setattr(decoder.steps, "feed", counting_feed)
    return feeds


def test_a_cancel_stops_the_prefill_after_the_chunk_under_way(llama, tokenizer, monkeypatch):
    decoder = SpeculativeDecoder(llama, tokenizer)
    generate(decoder, "def add(a, b):", max_new_tokens=4)  # the next prompt reuses its first tokens
    feeds = spy_on_steps(decoder, monkeypatch)
    ids = decoder.encode(FILE)

    gen = generate(decoder, FILE, max_new_tokens=NEW, cancel=SetAfter(1))

    reused = gen.stats.prompt_reused_tokens
    assert 0 < reused and len(ids) - reused > 3 * CHUNK  # the prefill had several chunks to go
    assert feeds == [CHUNK]  # the first, and no more
    assert (gen.text, gen.token_ids, gen.finish_reason) == ("", [], "cancelled")
    assert decoder.steps.tokens == ids[:reused]  # cut back to what the last request left
    assert gen.stats.prompt_tokens == len(ids)
    assert gen.stats.prefill_ms > 0 and gen.stats.rounds == 0


def test_a_cancel_before_the_prefill_feeds_nothing(llama, tokenizer, monkeypatch):
    decoder = SpeculativeDecoder(llama, tokenizer)
    feeds = spy_on_steps(decoder, monkeypatch)
    gen = generate(decoder, FILE, max_new_tokens=NEW, cancel=SetAfter(0))
    assert gen.finish_reason == "cancelled" and feeds == [] and decoder.steps.tokens == []


@pytest.mark.parametrize("kind", ["none", "ngram", "model"])
@pytest.mark.parametrize("cancel_after", [1, 2])  # of the 3 chunks the file takes past what it reuses
def test_the_request_after_a_cancelled_prefill_is_as_if_it_never_ran(llama, llama_other, tokenizer, kind, cancel_after):
    """Token for token what a fresh decoder writes, and round for round what a decoder that never
    saw the cancelled request does: its drafter's caches match the target's again."""

    def decoder():
        drafter = make_drafter(kind, llama_other)
        return SpeculativeDecoder(llama, tokenizer, drafter, FixedGamma(3) if drafter else None)

    first = FILE[:30] + "x = 1\n"  # shares 30 bytes with the file
    edited = FILE[:50] + "Q" + FILE[50:]  # shares 50 bytes with the file
    for after in (FILE, edited):
        cancelled, undisturbed = decoder(), decoder()
        generate(cancelled, first, max_new_tokens=NEW)
        generate(undisturbed, first, max_new_tokens=NEW)
        stopped = generate(cancelled, FILE, max_new_tokens=NEW, cancel=SetAfter(cancel_after))
        assert stopped.finish_reason == "cancelled"
        assert len(cancelled.steps.tokens) == stopped.stats.prompt_reused_tokens

        got = generate(cancelled, after, max_new_tokens=NEW)
        same = generate(undisturbed, after, max_new_tokens=NEW)
        fresh = generate(decoder(), after, max_new_tokens=NEW)
        assert got.token_ids == fresh.token_ids
        assert got.stats.prompt_reused_tokens == same.stats.prompt_reused_tokens > 0
        assert (got.stats.gammas, got.stats.accepted_histogram) == (same.stats.gammas, same.stats.accepted_histogram)


# prompts of more than two chunks, each ending in a remainder of another size
PROMPTS = [FILE, FILE * 2, FILE[: CHUNK * 2 + 1], FILE[: CHUNK * 3 - 1]] + [
    (p * 40)[: 40 + 3 * i] for i, p in enumerate(random_prompts(4, seed=5))
]


@pytest.mark.parametrize("chunk", [3, 7, CHUNK])
def test_chunked_prefill_changes_no_token(llama, llama_other, tokenizer, monkeypatch, chunk):
    """Greedy speculation still writes what AR writes, and AR what it wrote from one prefill pass."""
    monkeypatch.setattr(engine, "PREFILL_CHUNK", 10_000)
    one_pass = {p: generate(SpeculativeDecoder(llama, tokenizer), p, max_new_tokens=NEW).token_ids for p in PROMPTS}
    monkeypatch.setattr(engine, "PREFILL_CHUNK", chunk)
    for prompt in PROMPTS:  # fresh decoders: one kept would prefill only what a prompt adds to the last
        ar = SpeculativeDecoder(llama, tokenizer)
        spec = SpeculativeDecoder(llama, tokenizer, ModelDrafter(llama_other), FixedGamma(3))
        assert len(ar.encode(prompt)) > 2 * CHUNK
        assert generate(ar, prompt, max_new_tokens=NEW).token_ids == one_pass[prompt], prompt
        assert generate(spec, prompt, max_new_tokens=NEW).token_ids == one_pass[prompt], prompt


@pytest.mark.parametrize("chunk", [4, 5, 16])
def test_chunks_on_fixed_shapes_pad_their_remainder_or_run_unpadded(llama, tokenizer, monkeypatch, chunk):
    """Feeds of a chunk and the remainder after the last full one, at or under the largest row bucket
    (padded) or past it (eager at its own shape), give eager AR's tokens."""
    monkeypatch.setattr(engine, "PREFILL_CHUNK", chunk)
    reference = SpeculativeDecoder(llama, tokenizer)
    drafter, policy = HybridDrafter(None, lookup_tokens=4), FixedGamma(4)
    steps = FixedShapeTarget(llama, capacity=256, max_rows=round_rows(policy, drafter))
    assert steps.buckets[-1] == 5
    spec = SpeculativeDecoder(llama, tokenizer, drafter, policy, steps=steps)
    # prompts of 1 (the BOS) + these bytes: remainders of every size from 1 to `chunk`
    for length in range(40, 40 + chunk):
        prompt = FILE[:length]
        steps.truncate(0)  # else each prompt would reuse all but the last token of the one before
        want = generate(reference, prompt, max_new_tokens=NEW).token_ids
        assert generate(spec, prompt, max_new_tokens=NEW).token_ids == want, length


# --------------------------------------------------------------------------- warming: a prefill that decodes nothing


@pytest.mark.parametrize("kind", ["none", "ngram", "model"])
@pytest.mark.parametrize("cancel_after", [None, 1])  # warmed whole, or stopped after its first chunk
def test_a_request_after_a_warm_prefill_writes_what_a_cold_one_does(llama, llama_other, tokenizer, kind, cancel_after):
    """The server warms the cache for the document being edited before its request comes (`warm`). The
    request then prefills only the rest and writes, token for token and round for round, what a decoder
    that never warmed writes; a cancelled warm keeps its chunks, and its drafter matches the target."""

    def decoder():
        drafter = make_drafter(kind, llama_other)
        return SpeculativeDecoder(llama, tokenizer, drafter, FixedGamma(3) if drafter else None)

    first = FILE[:30] + "x = 1\n"  # the last request: shares 30 bytes with the file
    typed = FILE + "for j in"  # the request at the pause: the file and what was typed since the warm
    warmed, cold = decoder(), decoder()
    generate(warmed, first, max_new_tokens=NEW)
    generate(cold, first, max_new_tokens=NEW)
    held = warmed.warm(FILE, engine.DecodeOptions(max_new_tokens=NEW, cancel=SetAfter(cancel_after or 99)))
    ids = warmed.encode(FILE)
    assert warmed.steps.tokens == ids[:held]
    shared = next(i for i, (a, b) in enumerate(zip(warmed.encode(first), ids)) if a != b)
    assert held == (shared + CHUNK if cancel_after else len(ids) - 1)  # its chunks, kept

    got = generate(warmed, typed, max_new_tokens=NEW)
    want = generate(cold, typed, max_new_tokens=NEW)
    assert got.token_ids == want.token_ids
    assert got.stats.prompt_reused_tokens == held > want.stats.prompt_reused_tokens
    assert (got.stats.gammas, got.stats.accepted_histogram) == (want.stats.gammas, want.stats.accepted_histogram)


def test_warming_a_prompt_the_cache_holds_feeds_nothing(llama, tokenizer, monkeypatch):
    decoder = SpeculativeDecoder(llama, tokenizer)
    generate(decoder, FILE, max_new_tokens=NEW)
    feeds = spy_on_steps(decoder, monkeypatch)
    assert decoder.warm(FILE, engine.DecodeOptions(max_new_tokens=NEW)) == len(decoder.encode(FILE)) - 1
    assert feeds == []
