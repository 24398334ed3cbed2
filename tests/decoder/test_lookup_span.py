"""How far a prompt lookup copies, by the clock (decoder/gamma.py's RowCosts and LookupSpan): the span expected to
commit the most tokens a millisecond, from how far copies have matched and what a verify's rows cost here; the text
is the target's whatever the span."""

from __future__ import annotations

import pytest
from helpers.decoding import generate

from speccomplete.decoder.drafts.hybrid import HybridDrafter
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma, HeuristicGamma, LookupSpan, RowCosts
from speccomplete.decoder.sampling import SamplingParams

pytestmark = pytest.mark.clocked

# A pass's milliseconds by rows where each row past the second costs a third of a step (AVX2 alone), and where the
# rows are nearly free (bound by reading the weights); both as measured on the benchmark's target, rounded.
DEAR_ROWS = {1: 11.2, 2: 11.3, 3: 14.7, 4: 19.0, 5: 23.6, 9: 40.8, 17: 74.3}
CHEAP_ROWS = {1: 17.7, 3: 23.0, 5: 25.6, 9: 31.9, 13: 38.2, 17: 46.3}


def costs_of(table: dict[int, float]) -> RowCosts:
    costs = RowCosts()
    for rows, ms in table.items():
        costs.record(rows, ms)
    return costs


def matching(spans: LookupSpan, chances: list[float], rounds: int = 20) -> LookupSpan:
    """`spans` after copies matched at the given chance at each depth into a run: of every 10 tokens copied at a
    depth, that share matched."""
    for _ in range(rounds):
        for depth, chance in enumerate(chances):
            for i in range(10):
                spans.record(depth, 1, int(i < round(10 * chance)))
    return spans


def test_row_costs_are_read_off_the_row_counts_measured():
    costs = costs_of({1: 10.0, 3: 20.0, 5: 40.0})
    assert costs.table(7) == pytest.approx([10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    assert costs_of({1: 10.0}).table(3) == [10.0, 10.0, 10.0]  # one measured: the others as dear, to be tried
    assert costs_of({4: 20.0, 5: 30.0}).table(2) == [20.0, 20.0]
    assert RowCosts().table(4) is None


def test_row_costs_follow_the_recent_rounds_and_forget_the_old():
    costs = RowCosts(decay=0.5, forget=10)
    costs.record(9, 90.0)
    for _ in range(10):
        costs.record(1, 10.0)
        costs.record(2, 12.0)
    costs.record(2, 20.0)
    table = costs.table(9)
    assert table is not None
    assert table[1] == pytest.approx((12.0 * sum(0.5**i for i in range(1, 11)) + 20.0) / sum(0.5**i for i in range(11)))
    assert table[8] > 40.0 and table[8] != 90.0  # 9 rows, not measured lately: on the line through 1 and 2 rows


def test_where_rows_are_dear_a_copy_is_short_and_where_they_are_cheap_long():
    likely = [0.9] * LookupSpan.DEPTHS
    assert matching(LookupSpan(costs_of(CHEAP_ROWS)), likely).span(0, 16) >= 8
    assert matching(LookupSpan(costs_of(DEAR_ROWS)), likely).span(0, 16) <= 3
    # a copy sure to match is worth its rows even where they are dear: 17 tokens for 74 ms against 3 for 15
    assert matching(LookupSpan(costs_of(DEAR_ROWS)), [1.0] * LookupSpan.DEPTHS).span(0, 16) == 16
    fresh = [0.5, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9, 0.9]  # as fresh copies matched on the benchmark's cases
    assert matching(LookupSpan(costs_of(DEAR_ROWS)), fresh).span(0, 16) == 1


def test_a_copy_goes_further_once_its_run_has_matched():
    spans = LookupSpan(costs_of(CHEAP_ROWS))
    for _ in range(100):
        spans.record(0, 2, 0)  # a fresh copy's first token misses
        spans.record(1, 4, 4)  # once one has matched, the rest do
    assert spans.span(0, 16) < spans.span(1, 16)


def test_copies_are_recorded_by_depth_into_their_run_and_as_far_as_the_target_checked_them():
    records = []
    spans = LookupSpan(costs_of(CHEAP_ROWS))
    spans.record = lambda depth, copied, accepted: records.append((depth, copied, accepted))  # type: ignore[method-assign]
    hybrid = HybridDrafter(None, lookup_tokens=8, min_ngram=1)
    hybrid.clock_lookup(spans)
    source = list(range(1, 40))
    context = [*source, 1, 2]  # "1 2" occurred before: a copy is what followed it in `source`
    hybrid.reset(context)
    greedy = SamplingParams()

    first = hybrid.propose(context, 0, greedy, None).tokens
    assert first == source[2 : 2 + len(first)]
    hybrid.rollback(len(context) + len(first))  # all accepted
    context = [*context, *first, source[2 + len(first)]]  # and the target's own token went on as the source did
    second = hybrid.propose(context, 0, greedy, None).tokens
    assert len(second) >= 2
    hybrid.shortened(1)  # a stop string in its first token: only that one is checked
    hybrid.rollback(len(context) + 1)
    context = [*context, second[0], 0]  # the generation would end here; a miss is what starts the next run
    third = hybrid.propose([*source, 1], 0, greedy, None).tokens
    hybrid.rollback(len(source) + 1)  # its first token rejected
    assert records == [(0, len(first), len(first)), (len(first), 1, 1), (len(first) + 1, len(third), 0)]
    hybrid.propose([*source, 1], 0, greedy, None)
    hybrid.rollback(len(source) + 1)
    assert records[-1][0] == 0  # the run ended with the miss


def test_no_span_before_a_round_was_timed():
    assert LookupSpan(RowCosts()).span(0, 8) is None


def test_the_text_is_the_targets_whatever_the_span(llama, tokenizer):
    """The clock decides how far copies go (rounds of a repetitive prompt are timed and copied by it); the tokens
    are the AR run's."""
    prompt = "abcabcabcabcabcabc abcabcabcabc" * 3
    ar = generate(SpeculativeDecoder(llama, tokenizer, gamma=FixedGamma(0)), prompt, max_new_tokens=40)
    spec = SpeculativeDecoder(llama, tokenizer, HybridDrafter(None, min_ngram=1), HeuristicGamma())
    for _ in range(3):
        assert generate(spec, prompt, max_new_tokens=40).token_ids == ar.token_ids
    assert spec.row_costs.rounds > 0 and spec.spans  # timed, and the lookup's copies judged by the clock


def test_a_fixed_gamma_copies_by_the_lookups_own_rule(llama, tokenizer):
    spec = SpeculativeDecoder(llama, tokenizer, HybridDrafter(None, min_ngram=1), FixedGamma(2))
    generate(spec, "abcabcabcabcabc", max_new_tokens=16)
    assert spec.drafter is not None and spec.drafter.spans is None and not spec.spans
