"""The references a lookup copies from beyond the prompt (decoder/drafts/references.py): each copy is what a
scan of every window finds, hash collisions change nothing, the bound keeps the documents given last, and
a decoder that copies from them stays token-identical to AR."""

from __future__ import annotations

import random

import pytest
from helpers.decoding import generate, random_prompts

from speccomplete.decoder.drafts import HybridDrafter
from speccomplete.decoder.drafts import references as references_module
from speccomplete.decoder.drafts.references import References
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma


def scan_copy(documents: list[list[int]], committed: list[int], gamma: int, min_ngram: int, max_ngram: int):
    """The latest occurrence, over the documents in order, of the longest suffix that occurs with a token after
    it in its document, by comparing every window; what follows it there."""
    for n in range(min(max_ngram, len(committed)), min_ngram - 1, -1):
        suffix = committed[len(committed) - n :]
        found = []
        for document in documents:
            for end in range(n - 1, len(document) - 1):
                if document[end - n + 1 : end + 1] == suffix:
                    found = document[end + 1 : end + 1 + gamma]
        if found:
            return found
    return []


def random_documents(rng: random.Random, count: int, vocabulary: int = 5) -> list[list[int]]:
    return [[rng.randrange(vocabulary) for _ in range(rng.randrange(0, 40))] for _ in range(count)]


@pytest.mark.parametrize("ngrams", [(1, 1), (2, 4), (3, 6)])
def test_each_copy_is_the_scans(ngrams):
    min_ngram, max_ngram = ngrams
    rng = random.Random(min_ngram * 10 + max_ngram)
    documents = random_documents(rng, 12)
    references = References(documents, max_tokens=10_000, min_ngram=min_ngram, max_ngram=max_ngram)
    assert references.size == sum(map(len, documents))
    copied = 0
    for _ in range(300):
        committed = [rng.randrange(5) for _ in range(rng.randrange(1, 12))]
        gamma = rng.randrange(1, 8)
        got = references.copy(committed, gamma)
        assert got == scan_copy(documents, committed, gamma, min_ngram, max_ngram), committed
        copied += bool(got)
    assert copied > 100  # the check saw copies, not only misses


def test_hash_collisions_change_no_copy(monkeypatch):
    """With a modulus of 7 nearly every search meets n-grams of other tokens under its hash."""
    monkeypatch.setattr(references_module, "_MODULUS", 7)
    rng = random.Random(3)
    documents = random_documents(rng, 8, vocabulary=9)
    references = References(documents, max_tokens=10_000, min_ngram=2, max_ngram=4)
    for _ in range(300):
        committed = [rng.randrange(9) for _ in range(rng.randrange(2, 9))]
        assert references.copy(committed, 5) == scan_copy(documents, committed, 5, 2, 4)


def test_the_bound_keeps_the_documents_given_last():
    documents = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    references = References(documents, max_tokens=6, min_ngram=1, max_ngram=2)
    assert (references.documents, references.size) == (2, 6)
    assert references.copy([9], 3) == [10, 11, 12]  # the last document whole
    assert references.copy([5], 3) == [6]  # the one before it cut to its start
    assert references.copy([1], 3) == []  # the first left out
    assert references.copy([6], 3) == []  # no copy runs past a document's end


def test_a_bad_ngram_range_is_refused():
    with pytest.raises(ValueError, match="min_ngram"):
        References([[1, 2]], 10, min_ngram=3, max_ngram=2)


def test_a_decoder_copying_from_references_stays_identical_to_ar(llama, tokenizer):
    """Copies from other documents are drafts like any: the target decides, so the output is AR's; and where
    the prompt does not repeat itself but a reference does, the lookup drafts from the reference."""
    prompts = random_prompts(6, seed=11)
    ar = SpeculativeDecoder(llama, tokenizer)
    expected = [generate(ar, p, max_new_tokens=16) for p in prompts]
    hybrid = HybridDrafter(None, lookup_tokens=6)
    spec = SpeculativeDecoder(llama, tokenizer, hybrid, FixedGamma(4))
    # each prompt's own AR continuation sits in the references: copies the target accepts; and the other
    # prompts' continuations: copies it mostly rejects
    documents = [spec.encode(p) + g.token_ids for p, g in zip(prompts, expected)]
    references = References(documents, max_tokens=100_000, min_ngram=2, max_ngram=4)
    copied_from_references = 0
    for prompt, want in zip(prompts, expected):
        got = spec.generate(prompt, DecodeOptions(max_new_tokens=16, references=references))
        assert got.token_ids == want.token_ids, prompt
        alone = spec.generate(prompt, DecodeOptions(max_new_tokens=16))
        copied_from_references += got.stats.lookup_accepted - alone.stats.lookup_accepted
    assert copied_from_references > 0
    assert hybrid.references is None  # the last request named none: none is kept for the next
