"""The prompt lookup's incremental index proposes exactly what a scan of the whole sequence does.

`scan_proposal` is the lookup as it was before the index: every n-gram of the sequence compared
with the suffix, each round. Small vocabularies make n-grams repeat, so rollbacks often pop a later
occurrence of an n-gram whose earlier one must then be found again.
"""

from __future__ import annotations

import random

import pytest
import torch
from helpers.decoding import generate, random_prompts

from speccomplete.decoder.drafts import HybridDrafter, NgramDrafter, SelfDrafter
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma, HeuristicGamma
from speccomplete.decoder.sampling import SamplingParams

GREEDY = SamplingParams()
NGRAMS = [(3, 1), (4, 2), (1, 1), (2, 2), (5, 3)]  # (max_ngram, min_ngram)


def scan_proposal(committed: list[int], gamma: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The latest earlier occurrence of the longest suffix n-gram, found by comparing every window."""
    if gamma == 0:
        return []
    seq = torch.tensor(committed)
    for n in range(min(max_ngram, len(committed) - 1), min_ngram - 1, -1):
        windows = seq.unfold(0, n, 1)[:-1]  # every earlier n-gram, excluding the suffix itself
        hits = (windows == seq[-n:]).all(-1).nonzero()
        if hits.numel():
            start = int(hits[-1]) + n
            return committed[start : start + gamma]
    return []


def check(drafter: NgramDrafter, committed: list[int], gamma: int) -> list[int]:
    proposal = drafter.propose(committed, gamma, GREEDY, None)
    assert proposal.q is None and not proposal.lookup
    want = scan_proposal(list(committed), gamma, drafter.max_ngram, drafter.min_ngram)
    assert proposal.tokens == want, (committed, gamma)
    return proposal.tokens


@pytest.mark.parametrize("max_ngram, min_ngram", NGRAMS)
def test_rounds_of_appends_rollbacks_and_resets_match_the_scan(max_ngram, min_ngram):
    rng = random.Random(max_ngram * 10 + min_ngram)
    found = 0
    for _trial in range(40):
        vocab = rng.choice([2, 3, 4, 6])
        drafter = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        committed = [rng.randrange(vocab) for _ in range(rng.randrange(0, 12))]
        drafter.reset(committed, 0)
        for _ in range(30):
            action = rng.random()
            if action < 0.55:  # an engine round: drafts, a prefix of them kept, plus the target's token
                copied = check(drafter, committed, rng.randrange(0, 7))
                found += bool(copied)
                drafts = copied or [rng.randrange(vocab) for _ in range(rng.randrange(0, 4))]
                kept = rng.randrange(len(drafts) + 1)
                drafter.rollback(len(committed) + kept)
                committed = committed + drafts[:kept] + [rng.randrange(vocab)]
            elif action < 0.7:  # a rollback into tokens already indexed
                valid = rng.randrange(len(committed) + 1)
                drafter.rollback(valid)
                committed = committed[:valid] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 4))]
            elif action < 0.85:  # the next request shares a prefix with this one
                reused = rng.randrange(len(committed) + 1)
                committed = committed[:reused] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 10))]
                drafter.reset(committed, reused)
            else:  # a request with another prompt
                committed = [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
                drafter.reset(committed, 0)
            check(drafter, committed, rng.randrange(0, 7))
    assert found > 100  # the rounds did copy, not only miss


def test_the_same_list_growing_and_changed_in_place():
    """The engine may pass one list it appends to; a caller that rewrites it without a rollback
    or asks about another sequence without a reset still gets the scan's answer."""
    rng = random.Random(3)
    for _trial in range(30):
        drafter = NgramDrafter(max_ngram=4, min_ngram=1)
        committed = [rng.randrange(3) for _ in range(5)]
        drafter.reset(committed)
        for _ in range(40):
            action = rng.random()
            if action < 0.6:
                committed.extend(rng.randrange(3) for _ in range(rng.randrange(1, 4)))
            elif action < 0.8 and committed:  # rewritten where the drafter already indexed it
                committed[rng.randrange(len(committed)) :] = [rng.randrange(3) for _ in range(rng.randrange(0, 4))]
            else:  # another sequence altogether, no reset
                committed = [rng.randrange(3) for _ in range(rng.randrange(0, 30))]
            check(drafter, committed, rng.randrange(1, 8))


def test_fresh_lists_and_tuples():
    rng = random.Random(4)
    drafter = NgramDrafter(max_ngram=3, min_ngram=1)
    history = [rng.randrange(4) for _ in range(6)]
    drafter.reset(history)
    for _ in range(200):
        history.append(rng.randrange(4))
        check(drafter, list(history), 5)  # a fresh list each round, as `ids + generated` is
    # a tuple slices to a tuple, as it did for the scan; the tokens are the same
    assert list(drafter.propose(tuple(history), 5, GREEDY, None).tokens) == scan_proposal(history, 5, 3, 1)


def test_edges():
    drafter = NgramDrafter(max_ngram=3, min_ngram=1)
    for committed in ([], [7], [7, 7], [7, 8], [7, 8, 7], [1, 2, 3, 1, 2, 3]):
        for gamma in (0, 1, 4):
            check(drafter, committed, gamma)
    assert drafter.propose([5, 6, 5], 0, GREEDY, None).tokens == []
    drafter.rollback(-1)  # forgets everything, as rollback(0) does
    check(drafter, [1, 1, 1, 1], 3)
    drafter.rollback(100)  # past what it holds: nothing to forget
    check(drafter, [1, 1, 1, 1, 2], 3)
    with pytest.raises(ValueError):
        NgramDrafter(min_ngram=0)


def test_rollback_finds_the_earlier_occurrence_again():
    """A dict of latest occurrences alone would keep pointing at the forgotten one."""
    drafter = NgramDrafter(max_ngram=2, min_ngram=2)
    drafter.reset([1, 2, 3, 1, 2, 4])
    assert check(drafter, [1, 2, 3, 1, 2, 4, 1, 2], 3) == [4, 1, 2]  # after the later "1 2"
    drafter.rollback(4)  # forget "2 4 1 2": the later "1 2" ended at position 4
    assert check(drafter, [1, 2, 3, 1, 2], 3) == [3, 1, 2]


def test_the_hybrid_copies_what_the_scan_finds():
    """`ngram+none`: each copy is the scan's over the span the hybrid asks for."""
    rng = random.Random(5)
    hybrid = HybridDrafter(None, lookup_tokens=6)
    committed = [rng.randrange(4) for _ in range(20)]
    hybrid.reset(committed)
    copies = 0
    for _ in range(200):
        span = hybrid.span
        proposal = hybrid.propose(committed, 3, GREEDY, None)
        assert proposal.tokens == scan_proposal(committed, span, 4, 2)
        copies += proposal.lookup
        kept = rng.randrange(len(proposal.tokens) + 1)
        hybrid.rollback(len(committed) + kept)
        committed = committed + proposal.tokens[:kept] + [rng.randrange(4)]
        if rng.random() < 0.05:
            reused = rng.randrange(len(committed))
            committed = committed[:reused] + [rng.randrange(4) for _ in range(5)]
            hybrid.reset(committed, reused)
    assert copies > 50


class ScanChecked(NgramDrafter):
    """The product's lookup, each copy the hybrid asks for checked against the scan."""

    def __init__(self, max_ngram: int, min_ngram: int):
        super().__init__(max_ngram=max_ngram, min_ngram=min_ngram)
        self.checked = self.copied = 0

    def copies(self, committed, gamma, count):
        found = super().copies(committed, gamma, count)
        if count == 1:  # a chain's copy: the latest occurrence's, as the scan finds it
            assert (found[0] if found else []) == scan_proposal(committed, gamma, self.max_ngram, self.min_ngram)
            self.checked += 1
            self.copied += bool(found)
        return found


@pytest.mark.parametrize("self_draft", [False, True], ids=["ngram+none", "ngram+self"])
def test_through_the_engine(self_draft, llama, tokenizer):
    """The engine's own resets (prompts sharing a prefix with the last) and rollbacks, and behind a
    self draft the lookups after each of its drafts that the engine's rollback then cuts."""
    model = SelfDrafter(llama, torch.arange(0, llama.get_output_embeddings().out_features, 2)) if self_draft else None
    hybrid = HybridDrafter(model, lookup_tokens=6)
    hybrid.lookup = lookup = ScanChecked(hybrid.lookup.max_ngram, hybrid.lookup.min_ngram)
    spec = SpeculativeDecoder(llama, tokenizer, hybrid, HeuristicGamma(max_gamma=4) if self_draft else FixedGamma(4))
    reference = SpeculativeDecoder(llama, tokenizer)
    prompts = random_prompts(3, seed=5)
    for prompt in [prompts[0], prompts[0] + prompts[1], prompts[2]]:  # the second reuses the first's prefix
        got = generate(spec, prompt, max_new_tokens=20)
        assert got.token_ids == generate(reference, prompt, max_new_tokens=20).token_ids
    assert lookup.checked > 20 and lookup.copied > 0
