"""Draft trees (decoder/tree.py): their shape, their verify's rows, the cache after it, greedy identity with AR
and lossless sampling."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers.decoding import assert_greedy_matches, generate, random_prompts
from scipy import stats

from speccomplete.decoder.drafts import Eagle3Drafter, HybridDrafter
from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, init_from_target
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import DraftPayoff, FixedGamma, HeuristicGamma
from speccomplete.decoder.loader import use_cpu_kernels
from speccomplete.decoder.target_steps import EagerTarget
from speccomplete.decoder.tree import DraftTree, accept_greedy, accept_sampled


def test_a_trie_of_paths_shares_their_starts():
    tree = DraftTree.of_paths([[5, 6, 7], [5, 6, 8], [9]])
    assert tree.tokens == (5, 6, 7, 8, 9) and tree.parents == (-1, 0, 1, 1, -1)
    assert tree.depths() == [0, 1, 2, 3, 3, 1]
    assert tree.path_rows(4) == [0, 1, 2, 4] and tree.path_rows(5) == [0, 5]
    assert tree.children() == [[1, 5], [2], [3, 4], [], [], []]
    assert not tree.is_chain and DraftTree.chain([1, 2, 3]).is_chain


def test_a_tree_refuses_a_later_parent_and_a_repeated_sibling():
    with pytest.raises(ValueError, match="earlier node"):
        DraftTree((1, 2), (1, -1))
    with pytest.raises(ValueError, match="repeats token"):
        DraftTree((1, 1), (-1, -1))


def test_greedy_acceptance_follows_the_targets_choices():
    tree = DraftTree.of_paths([[5, 6, 7], [5, 6, 8], [9]])
    # rows: 0 root, 1 '5', 2 '6', 3 '7', 4 '8', 5 '9'
    assert accept_greedy(tree, [5, 6, 8, 0, 42, 0]) == ([1, 2, 4], 42)
    assert accept_greedy(tree, [9, 0, 0, 0, 0, 3]) == ([5], 3)
    assert accept_greedy(tree, [4, 0, 0, 0, 0, 0]) == ([], 4)


def test_sampled_acceptance_gives_the_targets_distribution():
    """Candidates 2 and 4 at the root and 3 below 2: the first two tokens come out as the target's joint
    distribution p(a) p(b | a). A round that takes no candidate leaves the second to a plain next step."""
    vocab = 6
    generator = torch.Generator().manual_seed(5)
    first = torch.softmax(torch.randn(vocab, generator=generator) * 1.5, -1)
    then = torch.softmax(torch.randn(vocab, vocab, generator=generator) * 1.5, -1)  # then[a]: p(b | a)
    tree = DraftTree((2, 4, 3), (-1, -1, 0))
    p = torch.stack([first, then[2], then[4], torch.full((vocab,), 1 / vocab)])  # rows: root, '2', '4', '3'
    counts = np.zeros((vocab, vocab))
    for _ in range(30_000):
        accepted, token = accept_sampled(tree, p, generator)
        path = [tree.tokens[row - 1] for row in accepted] + [token]
        if len(path) < 2:
            path.append(int(torch.multinomial(then[path[0]], 1, generator=generator)))
        counts[path[0], path[1]] += 1
    exact = (first[:, None] * then).double().numpy()
    kept = exact * counts.sum() >= 5
    assert stats.chisquare(counts[kept], exact[kept] * counts[kept].sum() / exact[kept].sum()).pvalue > 1e-3


@pytest.fixture(params=["llama", "gemma3", "llama-int8", "gemma3-int8"])
def family_target(request):
    """A target and, for the int8 ones, a function that quantizes it with an EAGLE-3 draft built from its plain
    weights (as the loader does); the flag says whether its verify rows must be its steps' bit for bit."""
    family, _, weights = request.param.partition("-")
    model = copy.deepcopy(request.getfixturevalue(family))
    if weights and not hasattr(torch, "_int_mm"):
        pytest.skip("int8 linears run on the CPU")

    def with_eagle3():
        draft = _eagle3(model)
        if weights:
            use_cpu_kernels(SimpleNamespace(records_graphs=False), model, draft, int8=True)
        return draft

    if weights and "eagle3" not in request.node.name:
        use_cpu_kernels(SimpleNamespace(records_graphs=False), model, int8=True)
    return model, bool(weights), with_eagle3


def test_a_tree_verify_row_is_the_logits_of_its_path(family_target):
    """Each row equals what feeding its path as a chain gives (bit for bit for int8, attended row by row), past
    Gemma-3's sliding window (8 tokens in the tiny model) too; after keep_path the cache is the path's."""
    target, exact, _ = family_target
    prompt = torch.randint(3, 200, (14,)).tolist()
    tree = DraftTree.of_paths([[40, 41, 42], [40, 43], [44, 45]])
    with torch.inference_mode():
        steps = EagerTarget(target)
        steps.forward(prompt[:-1], keep=1)
        rows = steps.forward_tree(tree, prompt[-1])
        for row in range(len(tree) + 1):
            path = [tree.tokens[r - 1] for r in tree.path_rows(row)[1:]]
            chain = EagerTarget(target)
            chain.forward(prompt[:-1], keep=1)
            want = chain.forward([prompt[-1], *path], keep=1)[0]
            if exact:
                assert torch.equal(rows[row], want), row
            else:
                torch.testing.assert_close(rows[row], want, rtol=1e-4, atol=1e-4)
        steps.keep_path(len(prompt) - 1, [0, 1, 4])  # root, '40', '43'
        assert steps.tokens == prompt + [40, 43]
        after = steps.forward([7], keep=1)[0]
        chain = EagerTarget(target)
        chain.forward(prompt + [40, 43], keep=1)
        want = chain.forward([7], keep=1)[0]
        if exact:
            assert torch.equal(after, want)
        else:
            torch.testing.assert_close(after, want, rtol=1e-4, atol=1e-4)


def _eagle3(target, seed=0):
    ids = torch.arange(3, 200)
    draft = init_from_target(Eagle3Shape.for_target(target, draft_vocab=len(ids)), target, ids, seed=seed)
    return draft.eval().requires_grad_(False)


class _Counting:
    """Counts the tree rounds a decoder verified."""

    def __init__(self, decoder):
        self.trees = 0
        verify = decoder._verify_tree

        def counted(*args, **kwargs):
            self.trees += 1
            return verify(*args, **kwargs)

        decoder._verify_tree = counted


@pytest.mark.parametrize("drafting", ["eagle3", "lookup", "lookup+eagle3"])
def test_greedy_with_trees_matches_ar(family_target, drafting, tokenizer):
    target, _, with_eagle3 = family_target
    eagle = Eagle3Drafter(with_eagle3(), target) if "eagle3" in drafting else None
    # a lookup from one token on: in a long random text every byte has several continuations, so it branches
    drafter = eagle if drafting == "eagle3" else HybridDrafter(eagle, min_ngram=1)
    ar = SpeculativeDecoder(target, tokenizer)
    spec = SpeculativeDecoder(target, tokenizer, drafter, FixedGamma(4), tree_nodes=8)
    counting = _Counting(spec)
    prompts = random_prompts(12, seed=31)
    if "lookup" in drafting:
        prompts = [p + "".join(random_prompts(20, seed=index)) for index, p in enumerate(prompts)]
    assert_greedy_matches(ar, spec, prompts, max_new_tokens=20)
    assert counting.trees > 0


def test_the_eagle3_tree_holds_at_most_its_nodes_and_the_draft_cache_only_real_rows(llama):
    drafter = Eagle3Drafter(_eagle3(llama), llama)
    steps = EagerTarget(llama)
    drafter.attach(steps)
    prompt = torch.randint(3, 200, (10,)).tolist()
    with torch.inference_mode():
        steps.forward(prompt[:-1], keep=1)
        drafter.reset(prompt)
        proposal = drafter.propose_tree(prompt, 4, 7, SimpleNamespace(greedy=True), None)
        assert drafter.cache.length == drafter.rows
        feeds = []
        feed = drafter._feed_tree_rows
        drafter._feed_tree_rows = lambda *args: feeds.append(args[0]) or feed(*args)
        narrow = drafter.propose_tree(prompt, 8, 3, SimpleNamespace(greedy=True), None)
    assert proposal.tree is not None
    tree = proposal.tree
    assert len(tree) == 7 and max(tree.depths()) <= 4 and max(tree.depths()) >= 2
    # no deeper than the node budget, however far γ would let a chain go
    assert narrow is not None and len(narrow.tokens) <= 3 and len(feeds) <= 2


@pytest.mark.clocked
def test_an_adaptive_policy_drafts_trees_where_they_pay_by_language(llama, tokenizer, monkeypatch):
    """Under an adaptive γ, each language's rounds draft trees or chains by the clock (gamma.DraftPayoff, the
    engine's tree_payoffs): here a round on the tree side is timed 30 ms longer in one language and one on the
    chain side in the other, so after each side's first measurements the first drafts chains but for the rechecks,
    and the second, after its first recheck overturns the answer it started from, trees; the text is the AR's."""
    spec = SpeculativeDecoder(llama, tokenizer, HybridDrafter(None, min_ngram=1), HeuristicGamma(), tree_nodes=6)
    ar = SpeculativeDecoder(llama, tokenizer)
    slow_side = {"rust": True, "lua": False}  # True: the tree side
    record = DraftPayoff.record

    def timed(payoff, drafted, ms, tokens):
        group = next((name for name, tree_payoff in spec.tree_payoffs.items() if tree_payoff is payoff), None)
        record(payoff, drafted, ms + (30 if group and slow_side[group] == drafted else 0), tokens)

    monkeypatch.setattr(DraftPayoff, "record", timed)
    trees = _Counting(spec)
    prompts = [p + "".join(random_prompts(20, seed=index)) for index, p in enumerate(random_prompts(6, seed=5))]
    counts = {}
    for name in ("rust", "lua"):
        before = trees.trees
        for prompt in prompts:
            want = generate(ar, prompt, max_new_tokens=24).token_ids
            assert generate(spec, prompt, max_new_tokens=24, gamma_group=name).token_ids == want
        counts[name] = trees.trees - before
    rust, lua = spec.tree_payoffs["rust"], spec.tree_payoffs["lua"]
    assert rust.pays() is False and lua.pays() is True
    # past the first measurements (4 a side), the slow side runs only on rechecks (1 round in 16 at most)
    for payoff, slow, carried in ((rust, True, 0), (lua, False, rust.recheck)):
        rounds = sum(payoff.rounds.values())
        assert payoff.rounds[slow] <= payoff.min_rounds + carried + rounds // payoff.recheck + 1, payoff.rounds
    assert counts["lua"] > 2 * counts["rust"], counts  # and the trees verified follow
