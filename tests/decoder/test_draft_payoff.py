"""Whether the model draft pays, by the clock (decoder/gamma.py's DraftPayoff): an adaptive policy's drafts run where
rounds that draft commit tokens faster than plain steps, and plain steps run where they do not; the text is the
target's either way."""

from __future__ import annotations

import time

import pytest
from helpers.decoding import generate

from speccomplete.decoder.drafts.base import Drafter, Proposal
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import DraftPayoff, FixedGamma, HeuristicGamma

pytestmark = pytest.mark.clocked

PROMPTS = ["def add(a, b):", "fn main() {", "SELECT * FROM", "for (int i = 0;"]
TOKENS = 24


def gated_rounds(payoff: DraftPayoff, drafted_ms: float, plain_ms: float, tokens_drafted: int, rounds: int):
    """The gate's choice over `rounds` rounds of γ 3, each recorded as taking the given time."""
    choices = []
    for _ in range(rounds):
        drafted = payoff.gate(3) > 0
        choices.append(drafted)
        payoff.record(drafted, drafted_ms if drafted else plain_ms, tokens_drafted if drafted else 1)
    return choices


def test_both_sides_are_measured_first_then_the_faster_runs_with_rechecks():
    payoff = DraftPayoff(min_rounds=4, recheck=16)
    # drafting: 40 ms for 3 tokens (13 ms each), against 12 ms plain steps
    choices = gated_rounds(payoff, drafted_ms=40, plain_ms=12, tokens_drafted=3, rounds=8 + 16 + 32 + 64)
    assert choices[:8].count(True) == 4 and choices[:8].count(False) == 4  # each side measured, in turns
    assert payoff.pays() is False
    rechecks = [i for i, drafted in enumerate(choices[8:]) if drafted]
    assert rechecks == [15, 47, 111]  # only the rechecks draft, twice as far apart each time they agree
    payoff = DraftPayoff(min_rounds=4, recheck=16)
    choices = gated_rounds(payoff, drafted_ms=30, plain_ms=12, tokens_drafted=3, rounds=8 + 16 + 32)  # 10 ms a token
    assert payoff.pays() is True
    assert [i for i, drafted in enumerate(choices[8:]) if not drafted] == [15, 47]  # only the rechecks run plain


def test_a_recheck_that_changes_the_answer_brings_the_rechecks_close_again():
    payoff = DraftPayoff(min_rounds=4, recheck=16)
    gated_rounds(payoff, drafted_ms=40, plain_ms=12, tokens_drafted=3, rounds=8 + 16 + 32)
    assert payoff.between == 64
    # the drafts start to pay (a language whose drafts match further): the next recheck finds it
    gated_rounds(payoff, drafted_ms=12, plain_ms=12, tokens_drafted=8, rounds=64)
    assert payoff.pays() is True and payoff.between == 16
    choices = gated_rounds(payoff, drafted_ms=12, plain_ms=12, tokens_drafted=8, rounds=16)
    assert choices.count(False) <= 1  # drafting now, the next recheck 16 rounds on


def test_another_language_starts_from_the_answer_measured():
    payoff = DraftPayoff(min_rounds=4, recheck=16)
    gated_rounds(payoff, drafted_ms=40, plain_ms=12, tokens_drafted=3, rounds=8 + 16 + 32)
    other = payoff.carried()
    assert other.pays() is False and other.between == 16
    choices = gated_rounds(other, drafted_ms=40, plain_ms=12, tokens_drafted=3, rounds=16)
    assert choices.count(True) == 1  # no rounds of its own to measure first: its first recheck only
    # a language whose drafts pay: its first recheck outweighs the answer it was given
    choices = gated_rounds(payoff.carried(), drafted_ms=12, plain_ms=12, tokens_drafted=8, rounds=32)
    assert choices[:15].count(True) == 0 and choices[16:].count(True) >= 15


def test_a_decoders_new_language_starts_from_the_language_measured_most(llama, tokenizer, ar_runs):
    spec = SpeculativeDecoder(llama, tokenizer, Oracle(ar_runs, 0.04), gamma=HeuristicGamma(start=1, max_gamma=2))
    for ids in ar_runs:
        generate(spec, list(ids), max_new_tokens=TOKENS, gamma_group="python")
    assert spec.payoffs["python"].pays() is False
    drafted = 0
    for ids in ar_runs:
        gammas = generate(spec, list(ids), max_new_tokens=TOKENS, gamma_group="rust").stats.gammas
        drafted += sum(1 for gamma in gammas if gamma)
    assert spec.payoffs["rust"].pays() is False
    assert drafted <= 2  # its rechecks only (16 and 48 rounds on): no 4 rounds of drafting to measure it first


def test_a_policy_at_zero_is_not_gated():
    payoff = DraftPayoff()
    assert [payoff.gate(0) for _ in range(20)] == [0] * 20
    assert payoff.rounds == {True: 0, False: 0}


class Oracle(Drafter):
    """Proposes the target's own next tokens (known from its AR run), after `delay_s`: every draft is accepted,
    and how much a round costs is up to the test."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], delay_s: float):
        self.continuations, self.delay_s = continuations, delay_s
        self.prompt: tuple[int, ...] = ()

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        self.prompt = tuple(prompt)

    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0, lookup=None) -> Proposal:
        if gamma == 0:
            return Proposal([], None)
        time.sleep(self.delay_s)
        done = len(committed) - len(self.prompt)
        return Proposal(self.continuations[self.prompt][done : done + gamma], None)

    def rollback(self, valid: int) -> None:
        pass


@pytest.fixture(scope="module")
def ar_runs(llama, tokenizer):
    ar = SpeculativeDecoder(llama, tokenizer, gamma=FixedGamma(0))
    runs = {}
    for prompt in PROMPTS:
        ids = ar.encode(prompt)
        runs[tuple(ids)] = generate(ar, ids, max_new_tokens=TOKENS).token_ids
    return runs


def drafted_rounds(llama, tokenizer, ar_runs, delay_s: float, gamma) -> tuple[int, int]:
    """(rounds that drafted, all rounds) over every prompt twice, each one's text checked against its AR's."""
    spec = SpeculativeDecoder(llama, tokenizer, Oracle(ar_runs, delay_s), gamma=gamma)
    drafted = rounds = 0
    for ids, want in [*ar_runs.items()] * 2:
        got = generate(spec, list(ids), max_new_tokens=TOKENS)
        assert got.token_ids == want
        drafted += sum(1 for count in got.stats.gammas if count)
        rounds += got.stats.rounds
    return drafted, rounds


def test_a_draft_slower_than_the_target_mostly_stops_drafting(llama, tokenizer, ar_runs):
    """Drafts that are always right but cost 40 ms a round, on a target whose step takes a few: after each side's
    first measurements only the rechecks draft."""
    drafted, rounds = drafted_rounds(llama, tokenizer, ar_runs, 0.04, HeuristicGamma(start=1, max_gamma=2))
    assert drafted <= 4 + rounds // 16 + 1


def test_a_draft_that_pays_keeps_drafting(llama, tokenizer, ar_runs):
    drafted, rounds = drafted_rounds(llama, tokenizer, ar_runs, 0.0, HeuristicGamma(start=1, max_gamma=2))
    plain = rounds - drafted
    assert plain <= 4 + rounds // 16 + len(ar_runs) * 2  # besides the first measurements and the rechecks, a
    # request's last round where one token is left to write (γ 0) and its first after the prefill


def test_a_fixed_gamma_drafts_whatever_the_clock_says(llama, tokenizer, ar_runs):
    drafted, rounds = drafted_rounds(llama, tokenizer, ar_runs, 0.01, FixedGamma(2))
    assert drafted >= rounds - len(ar_runs) * 2


def test_the_first_round_after_a_prefill_is_not_timed(llama, tokenizer, ar_runs, monkeypatch):
    """That round takes the prefill's logits and runs no target step: as a plain round it would look free."""
    timed = []
    monkeypatch.setattr(DraftPayoff, "record", lambda self, drafted, ms, tokens: timed.append(drafted))
    spec = SpeculativeDecoder(llama, tokenizer, Oracle(ar_runs, 0.0), gamma=HeuristicGamma(start=1, max_gamma=2))
    rounds = sum(generate(spec, list(ids), max_new_tokens=TOKENS).stats.rounds for ids in ar_runs)
    assert 0 < len(timed) <= rounds - len(ar_runs)
