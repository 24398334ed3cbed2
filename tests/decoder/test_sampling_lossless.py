"""Speculative sampling must be lossless: its output has exactly the target's distribution.

A 16-token vocabulary keeps the joint distribution of the first two tokens small (256 cells), so
it can be computed exactly from the target's probabilities and compared with samples from the
speculative decoder by a chi-square goodness-of-fit test. The draft is an independent random
model with peaky, very different distributions, so most rounds end in a rejection and the
residual distribution does most of the work. A deliberately wrong residual rule must fail the
same test, which shows the test has power.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.decoding import draft_fitness
from helpers.tiny_models import tiny_llama
from helpers.tokenizers import make_byte_tokenizer
from scipy import stats
from torch.utils._python_dispatch import TorchDispatchMode

import speccomplete.decoder.sampling as sampling
import speccomplete.decoder.step_shapes as step_shapes
from speccomplete.decoder.drafts import ModelDrafter, NgramDrafter, SelfDrafter
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.sampling import SamplingParams, accept_greedy, accept_sampled, probabilities, residual, sample

V = 16
PROMPT = [1]  # one token: no prefill, so every sample costs only the speculative rounds


@pytest.fixture(scope="module")
def small_tokenizer():
    return make_byte_tokenizer(bos=False, eos=False)  # ids 0..15 are bytes; no EOS can end a sample


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=10, vocab=V, layers=1, hidden=16, init=0.5, eos=None, bos=None)


@pytest.fixture(scope="module")
def draft():
    return tiny_llama(seed=11, vocab=V, layers=1, hidden=16, init=0.5, eos=None, bos=None)


def exact_joint(model, prompt, params) -> np.ndarray:
    """P(t1, t2) = p(t1 | prompt) * p(t2 | prompt, t1), from direct cache-free forward passes."""
    with torch.inference_mode():
        x = torch.tensor([prompt + [t1] for t1 in range(V)], device=model.device)
        probs = probabilities(model(input_ids=x, use_cache=False).logits[:, -2:], params)  # [V, 2, V]
    joint = probs[0, 0][:, None] * probs[:, 1]
    return joint.double().cpu().numpy()


def sample_pairs(decoder, prompt, params, n, seed0=0) -> np.ndarray:
    counts = np.zeros((V, V))
    for s in range(n):
        g = decoder.generate(prompt, DecodeOptions(max_new_tokens=2, sampling=params, seed=seed0 + s))
        assert len(g.token_ids) == 2 and g.finish_reason == "length"
        counts[g.token_ids[0], g.token_ids[1]] += 1
    return counts


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Goodness of fit, pooling cells whose expected count is below `min_expected` into one."""
    n = counts.sum()
    obs, exp = counts.ravel(), probs.ravel() / probs.sum() * n
    big = exp >= min_expected
    obs_cells, exp_cells = list(obs[big]), list(exp[big])
    pooled_obs, pooled_exp = obs[~big].sum(), exp[~big].sum()
    if pooled_exp >= min_expected:
        obs_cells.append(pooled_obs)
        exp_cells.append(pooled_exp)
    else:  # too small to stand alone: fold into the smallest regular cell
        i = int(np.argmin(exp_cells))
        obs_cells[i] += pooled_obs
        exp_cells[i] += pooled_exp
    assert len(obs_cells) >= 10, "too few cells for a meaningful test"
    p = float(stats.chisquare(obs_cells, exp_cells).pvalue)
    print(f"chi-square: {int(n)} samples, {len(obs_cells)} cells, p = {p:.3g}")  # shown with -s
    return p


def test_draft_really_differs(target, draft):
    params = SamplingParams(temperature=1.0)
    p = exact_joint(target, PROMPT, params).sum(1)
    q = exact_joint(draft, PROMPT, params).sum(1)
    assert 0.5 * np.abs(p - q).sum() > 0.5  # total variation: most drafts get rejected
    assert p.max() > 0.2 and q.max() > 0.2  # peaky


@pytest.fixture(scope="module")
def temperature_one_decoder(target, draft, small_tokenizer):
    return SpeculativeDecoder(target, small_tokenizer, ModelDrafter(draft), FixedGamma(2))


def test_speculative_sampling_matches_target_distribution(temperature_one_decoder, target):
    params = SamplingParams(temperature=1.0)
    counts = sample_pairs(temperature_one_decoder, PROMPT, params, 6000)
    exact = exact_joint(target, PROMPT, params)
    p = chi2_pvalue(counts, exact)
    assert p > 1e-3, f"speculative samples do not follow the target distribution (p={p:.3g})"


def test_chi_square_has_power_against_a_wrong_residual(temperature_one_decoder, target, monkeypatch):
    """Resampling from p (instead of norm(max(0, p - q))) after a rejection biases the output."""
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)
    params = SamplingParams(temperature=1.0)
    counts = sample_pairs(temperature_one_decoder, PROMPT, params, 1000, seed0=10_000)
    p = chi2_pvalue(counts, exact_joint(target, PROMPT, params))
    assert p < 1e-6, f"the goodness-of-fit test failed to notice a wrong residual (p={p:.3g})"


def test_lossless_with_temperature_top_k_top_p(target, draft, small_tokenizer):
    """Processing applied identically to p and q; γ = 1 so the bonus-token path is exercised too."""
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9)
    decoder = SpeculativeDecoder(target, small_tokenizer, ModelDrafter(draft), FixedGamma(1))
    counts = sample_pairs(decoder, PROMPT, params, 1200, seed0=20_000)
    exact = exact_joint(target, PROMPT, params)
    assert counts[exact == 0].sum() == 0, "sampled a token that top-k/top-p excludes"
    p = chi2_pvalue(counts, exact)
    assert p > 1e-3, f"p={p:.3g}"


def test_lossless_with_a_deterministic_drafter(target, small_tokenizer):
    """N-gram drafts have no q (one-hot); the residual is p without the rejected token."""
    prompt = [3, 4, 3]  # the lookup proposes "4, 3" after the trailing 3
    params = SamplingParams(temperature=1.0)
    decoder = SpeculativeDecoder(target, small_tokenizer, NgramDrafter(), FixedGamma(2))
    counts = sample_pairs(decoder, prompt, params, 1000, seed0=30_000)
    p = chi2_pvalue(counts, exact_joint(target, prompt, params))
    assert p > 1e-3, f"p={p:.3g}"


def test_lossless_with_a_narrower_draft_vocabulary(target, small_tokenizer):
    """A draft head with fewer rows than the target's: the engine pads q with zeros.

    (Like checkpoints whose head is padded to a different size than the tokenizer: the draft
    still embeds every id, its head just scores only the first 12.)
    """
    narrow = _narrow_draft(12)
    with torch.inference_mode():
        assert narrow(input_ids=torch.tensor([[1, 13]], device=narrow.device), use_cache=False).logits.shape[-1] == 12
    params = SamplingParams(temperature=1.0)
    decoder = SpeculativeDecoder(target, small_tokenizer, ModelDrafter(narrow), FixedGamma(2))
    counts = sample_pairs(decoder, PROMPT, params, 1000, seed0=40_000)
    p = chi2_pvalue(counts, exact_joint(target, PROMPT, params))
    assert p > 1e-3, f"p={p:.3g}"
    exact = exact_joint(target, PROMPT, params)
    assert exact[12:].sum() > 0.01 or exact[:, 12:].sum() > 0.01  # tokens only the target can produce matter


def exact_joint_of_second_and_third(model, params) -> np.ndarray:
    """P(t2, t3) after PROMPT, summed over t1: what a drafter whose first token comes from the prefill
    is tested on (one round drafts t2, the target adds t3)."""
    with torch.inference_mode():
        x = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)], device=model.device)
        probs = probabilities(model(input_ids=x, use_cache=False).logits, params).double()  # [V*V, 3, V]
    first, second, third = probs[0, 0], probs[::V, 1], probs[:, 2].view(V, V, V)
    return torch.einsum("a,ab,abc->bc", first, second, third).cpu().numpy()


def test_lossless_with_the_target_drafting_for_itself(target, small_tokenizer):
    """SelfDrafter: the target's own layers and a head over 10 of the 16 ids; q is zero elsewhere.

    Its first token comes from the prefill, so the joint tested is that of the second and third:
    one round drafts the second (γ = 1, all that is left to draft) and the target adds the third.
    """
    ids = torch.tensor([0, 2, 3, 5, 7, 8, 10, 11, 13, 15])
    params = SamplingParams(temperature=1.0)
    exact = exact_joint_of_second_and_third(target, params)
    outside = np.setdiff1d(np.arange(V), ids.numpy())
    assert exact[outside].sum() > 0.05  # tokens only the full head can produce matter
    decoder = SpeculativeDecoder(target, small_tokenizer, SelfDrafter(target, ids), FixedGamma(2))
    counts = np.zeros((V, V))
    drafted = 0
    for seed in range(1500):
        g = decoder.generate(PROMPT, DecodeOptions(max_new_tokens=3, sampling=params, seed=60_000 + seed))
        counts[g.token_ids[1], g.token_ids[2]] += 1
        drafted += g.stats.drafted
    assert drafted == 1500
    p = chi2_pvalue(counts, exact)
    assert p > 1e-3, f"p={p:.3g}"


@pytest.mark.parametrize("weights", ["float32", "int8"])
def test_lossless_with_an_eagle3_draft(weights, target, small_tokenizer):
    """Eagle3Drafter: a random EAGLE-3 draft over 10 of the 16 ids, fed the target's kept states;
    its linears in float32, or in int8 as the loader quantizes them on the CPU (decoder/kernels.py).

    As for the self draft, the first token comes from the prefill (no state-and-next-token row
    exists yet), so the joint tested is that of the second and third tokens.
    """
    from speccomplete.decoder.drafts import Eagle3Drafter
    from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, init_from_target
    from speccomplete.decoder.kernels import Int8Linear, pack_linear_weights

    ids = torch.tensor([0, 2, 3, 5, 7, 8, 10, 11, 13, 15])
    draft = init_from_target(Eagle3Shape.for_target(target, draft_vocab=len(ids)), target, ids, seed=3)
    with torch.no_grad():
        draft.lm_head.weight.mul_(4)  # a peakier q than the target's rows give: p and q differ
    if weights == "int8":
        if target.device.type != "cpu" or not hasattr(torch, "_int_mm"):
            pytest.skip("int8 linears run on the CPU")
        pack_linear_weights(draft, int8=True)
        assert isinstance(draft.lm_head, Int8Linear)
    params = SamplingParams(temperature=1.0)
    exact = exact_joint_of_second_and_third(target, params)
    decoder = SpeculativeDecoder(target, small_tokenizer, Eagle3Drafter(draft.eval(), target), FixedGamma(2))
    counts = np.zeros((V, V))
    drafted = accepted = 0
    for seed in range(1500):
        g = decoder.generate(PROMPT, DecodeOptions(max_new_tokens=3, sampling=params, seed=70_000 + seed))
        counts[g.token_ids[1], g.token_ids[2]] += 1
        drafted += g.stats.drafted
        accepted += g.stats.accepted
    assert drafted == 1500 and 0 < accepted < drafted
    p = chi2_pvalue(counts, exact)
    assert p > 1e-3, f"p={p:.3g}"


def test_lossless_with_an_eagle3_draft_tree(target, small_tokenizer):
    """The same, drafting trees (decoder/tree.py): every round verifies a tree, and the second and third
    tokens' joint is still the target's."""
    from speccomplete.decoder.drafts import Eagle3Drafter
    from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, init_from_target

    ids = torch.tensor([0, 2, 3, 5, 7, 8, 10, 11, 13, 15])
    draft = init_from_target(Eagle3Shape.for_target(target, draft_vocab=len(ids)), target, ids, seed=3)
    params = SamplingParams(temperature=1.0)
    exact = exact_joint_of_second_and_third(target, params)
    drafter = Eagle3Drafter(draft.eval(), target)
    decoder = SpeculativeDecoder(target, small_tokenizer, drafter, FixedGamma(2), tree_nodes=4)
    trees = 0
    verify_tree = decoder._verify_tree

    def counted(*args):
        nonlocal trees
        trees += 1
        return verify_tree(*args)

    decoder._verify_tree = counted
    counts = np.zeros((V, V))
    for seed in range(1500):
        g = decoder.generate(PROMPT, DecodeOptions(max_new_tokens=3, sampling=params, seed=90_000 + seed))
        counts[g.token_ids[1], g.token_ids[2]] += 1
    assert trees == 1500
    p = chi2_pvalue(counts, exact)
    assert p > 1e-3, f"p={p:.3g}"


def _narrow_draft(width=12):
    narrow = tiny_llama(seed=12, vocab=V, layers=1, hidden=16, init=0.5, eos=None, bos=None)
    head = torch.nn.Linear(16, width, bias=False, device=narrow.device)
    head.weight.data.copy_(narrow.lm_head.weight.data[:width])
    narrow.lm_head = head
    return narrow


def _alpha_by_definition(target, draft, ids):
    """Σ_x min(p(x), q(x)) per position, q padded with zeros like the engine pads it."""
    with torch.inference_mode():
        x = torch.tensor([ids], device=target.device)
        p = torch.softmax(target(input_ids=x, use_cache=False).logits[0].float(), -1)
        q = torch.softmax(draft(input_ids=x, use_cache=False).logits[0].float(), -1)
    q = torch.nn.functional.pad(q, (0, p.shape[-1] - q.shape[-1]))
    return float(torch.minimum(p, q).sum(-1).mean()), p, q


FITNESS_IDS = [1, 5, 3, 9, 2, 14, 7, 7, 0, 11, 4, 15]


def test_draft_fitness_same_width(target, draft):
    same = draft_fitness(target, target, FITNESS_IDS)
    assert same["expected_acceptance"] == pytest.approx(1.0, abs=1e-5) and same["top1_agreement"] == 1.0
    alpha, p, q = _alpha_by_definition(target, draft, FITNESS_IDS)
    got = draft_fitness(target, draft, FITNESS_IDS)
    assert got["expected_acceptance"] == pytest.approx(alpha, abs=1e-5)
    assert got["cross_entropy"] == pytest.approx(float(-(p * q.log()).sum(-1).mean()), rel=1e-4)
    assert got["positions"] == len(FITNESS_IDS)


def test_draft_fitness_narrower_draft_head(target):
    narrow = _narrow_draft()
    alpha, p, _ = _alpha_by_definition(target, narrow, FITNESS_IDS)
    assert float(p[:, 12:].sum(-1).mean()) > 0.05  # the target puts real mass outside the draft's head
    assert draft_fitness(target, narrow, FITNESS_IDS)["expected_acceptance"] == pytest.approx(alpha, abs=1e-4)


def test_same_seed_same_sample(temperature_one_decoder):
    opts = DecodeOptions(max_new_tokens=8, sampling=SamplingParams(temperature=1.0), seed=123)
    a = temperature_one_decoder.generate(PROMPT, opts)
    b = temperature_one_decoder.generate(PROMPT, opts)
    assert a.token_ids == b.token_ids
    many = {
        tuple(
            temperature_one_decoder.generate(
                PROMPT, DecodeOptions(max_new_tokens=8, sampling=SamplingParams(temperature=1.0), seed=s)
            ).token_ids
        )
        for s in range(10)
    }
    assert len(many) > 5  # and different seeds give different samples


# ----------------------------------------------------------------------------- probabilities


def test_probabilities_temperature_is_a_scaled_softmax():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0], [0.0, 0.0, 3.0, 1.0]])
    for t in (0.5, 1.0, 2.0):
        got = probabilities(logits, SamplingParams(temperature=t))
        assert torch.allclose(got, torch.softmax(logits / t, -1))
        assert got.dtype == torch.float32


def test_probabilities_top_k_keeps_k():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 32, generator=gen)
    for k in (1, 3, 10):
        probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=k))
        assert ((probs > 0).sum(-1) == k).all()
        top = logits.topk(k, -1).indices
        assert torch.equal((probs > 0), torch.zeros_like(probs, dtype=torch.bool).scatter(-1, top, True))
        kept = torch.softmax(logits.gather(-1, top), -1)  # renormalized over the kept tokens
        assert torch.allclose(probs.gather(-1, top), kept, atol=1e-6)
    # k >= V means off
    assert torch.allclose(probabilities(logits, SamplingParams(1.0, top_k=32)), torch.softmax(logits, -1))
    assert torch.allclose(probabilities(logits, SamplingParams(1.0, top_k=100)), torch.softmax(logits, -1))


def test_probabilities_top_p_keeps_the_smallest_prefix_reaching_p():
    base = torch.tensor([0.05, 0.5, 0.15, 0.3])  # sorted: 0.5, 0.3, 0.15, 0.05
    logits = base.log()[None]
    for top_p, kept in [(0.4, {1}), (0.75, {1, 3}), (0.85, {1, 3, 2}), (0.97, {0, 1, 2, 3}), (1.0, {0, 1, 2, 3})]:
        probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=top_p))[0]
        assert set(torch.nonzero(probs).flatten().tolist()) == kept, top_p
        idx = sorted(kept)
        assert torch.allclose(probs[idx], base[idx] / base[idx].sum(), atol=1e-6)
        assert abs(float(probs.sum()) - 1) < 1e-6
    # the top token always survives, however small top_p is
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=1e-6))[0]
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_probabilities_top_k_then_top_p():
    base = torch.tensor([0.4, 0.3, 0.2, 0.1])
    probs = probabilities(base.log()[None], SamplingParams(temperature=1.0, top_k=3, top_p=0.5))[0]
    # top-k leaves 0.4/0.9, 0.3/0.9, 0.2/0.9 = .444, .333, .222; top-p 0.5 then keeps the first two
    assert torch.allclose(probs, torch.tensor([4 / 7, 3 / 7, 0.0, 0.0]), atol=1e-6)


# ----------------------------------------------------------------------------- acceptance rules


def _rows(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def _normalized(x):
    return x / x.sum()


def test_residual_restores_p():
    """min(p, q) + (1 - Σ min(p, q)) * residual = p, which is what makes the scheme exact."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(20):
        p = torch.softmax(3 * torch.randn(8, generator=gen), -1)
        q = torch.softmax(3 * torch.randn(8, generator=gen), -1)
        beta = torch.minimum(p, q).sum()
        out = torch.minimum(p, q) + (1 - beta) * _normalized(residual(p, q))
        assert torch.allclose(out, p, atol=1e-6)
        # deterministic drafter: q is one-hot at the drafted token
        d = int(torch.randint(8, (1,), generator=gen))
        one_hot = torch.zeros(8)
        one_hot[d] = 1
        out = torch.minimum(p, one_hot) + (1 - p[d]) * _normalized(residual(p, one_hot))
        assert torch.allclose(out, p, atol=1e-6)
        assert residual(p, one_hot)[d] == 0
        # after every draft was accepted q is zero: the bonus token comes from p itself
        assert torch.equal(residual(p, torch.zeros(8)), p)


def test_residual_with_no_mass_falls_back_to_p():
    p = torch.tensor([0.25, 0.75])
    assert torch.equal(residual(p, p.clone()), p)


def test_accept_sampled_deterministic_draft_always_accepted_when_p_is_one_hot():
    drafts = torch.tensor([2, 0])
    p = _rows([0, 0, 1.0], [1.0, 0, 0], [0, 1.0, 0])  # the target is certain of both drafts; bonus is token 1
    for seed in range(20):
        assert accept_sampled(p, None, drafts, torch.Generator().manual_seed(seed)).tolist() == [2, 1]


def test_accept_sampled_deterministic_draft_rejected_when_p_is_zero():
    drafts = torch.tensor([1, 1])
    p = _rows([0.5, 0.0, 0.5], [0, 1.0, 0], [1.0, 0, 0])
    seen = set()
    for seed in range(50):
        n, token = accept_sampled(p, None, drafts, torch.Generator().manual_seed(seed)).tolist()
        assert n == 0 and token in (0, 2)  # never the rejected token
        seen.add(token)
    assert seen == {0, 2}


def test_accept_sampled_deterministic_draft_acceptance_rate():
    """A one-hot q accepts with probability p(draft)."""
    drafts = torch.tensor([0])
    p = _rows([0.3, 0.7], [0.5, 0.5])
    gen = torch.Generator().manual_seed(0)
    results = [accept_sampled(p, None, drafts, gen).tolist() for _ in range(4000)]
    accepted = sum(n for n, _ in results)
    assert abs(accepted / 4000 - 0.3) < 0.03
    assert all(t == 1 for n, t in results if n == 0)  # after rejecting 0 only token 1 is left


def test_accept_sampled_identical_p_and_q_accepts_everything():
    gen = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(4, 6, generator=gen), -1)
    drafts = torch.tensor([0, 5, 3])
    for seed in range(30):
        n, token = accept_sampled(p, p[:3].clone(), drafts, torch.Generator().manual_seed(seed)).tolist()
        assert n == 3 and 0 <= token < 6


def test_accept_sampled_zero_target_probability_always_rejects():
    p = _rows([0.0, 0.6, 0.4], [0.2, 0.3, 0.5])
    q = _rows([0.9, 0.05, 0.05])
    for seed in range(30):
        n, token = accept_sampled(p, q, torch.tensor([0]), torch.Generator().manual_seed(seed)).tolist()
        assert n == 0 and token in (1, 2)


def test_accept_greedy():
    logits = _rows([0, 5, 1], [3, 0, 1], [0, 0, 9], [1, 0, 0])  # argmax 1, 0, 2, 0
    assert accept_greedy(logits, torch.tensor([1, 0, 2])).tolist() == [3, 0]  # all accepted, bonus
    assert accept_greedy(logits, torch.tensor([1, 2, 2])).tolist() == [1, 0]  # second one wrong: correction 0
    assert accept_greedy(logits, torch.tensor([0, 0, 2])).tolist() == [0, 1]
    assert accept_greedy(logits, torch.tensor([1, 0, 0])).tolist() == [2, 2]  # third wrong: correction 2
    assert accept_greedy(logits[:1], torch.tensor([], dtype=torch.long)).tolist() == [0, 1]  # γ = 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_hosts_greedy_verdict_is_the_devices(dtype):
    """A greedy round decided on the host (no log-normalizer past the first miss) gives the same n, token and
    log-probabilities of the rows committed as the one-read-back verdict, ties to the first top token included."""
    torch.manual_seed(0)
    logits = torch.randn(5, 4096).to(dtype)
    logits[2, [7, 9]] = logits[2].max() + 1  # a tie: the first index is the top token
    top = logits.argmax(-1)
    assert top[2] == 7
    for drafts in (top[:4], top[:2], torch.tensor([top[0], 1, top[2], top[3]]), top[1:4] + 1):
        rows = logits[: drafts.numel() + 1]
        want = device_verdict(rows, drafts).tolist()
        want = want[: 2 + int(want[0]) + 1]  # the log-probabilities of the rows committed
        assert sampling.greedy_verdict_on_host(rows, drafts) == pytest.approx(want, abs=1e-5)
        assert sampling.greedy_verdict_on_host(rows, drafts)[:2] == want[:2]
    assert sampling.greedy_verdict_on_host(logits[:1], top[:0])[:2] == [0, top[0].item()]  # γ = 0


def test_accept_sampled_with_no_drafts_samples_p():
    """γ = 0 (a plain step) goes through the same rule: nothing to accept, the token drawn from p."""
    p = _rows([0.2, 0.0, 0.8])
    gen = torch.Generator().manual_seed(0)
    results = [accept_sampled(p, None, torch.tensor([], dtype=torch.long), gen).tolist() for _ in range(2000)]
    assert all(n == 0 and t in (0, 2) for n, t in results)
    assert abs(sum(t == 2 for _, t in results) / 2000 - 0.8) < 0.03


# ----------------------------------------------------------------------------- the Exponential race


def test_race_sampling_matches_the_distribution():
    """argmax(p / E), E ~ Exp(1), draws i with probability p_i / Σp; zero-probability ids never win."""
    probs = torch.tensor([0.0, 0.05, 0.3, 0.0, 0.15, 0.02, 0.4, 0.08])
    draws = sample(probs.expand(40_000, -1), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=len(probs)).double().numpy()
    assert counts[probs.numpy() == 0].sum() == 0
    expected = probs.double().numpy()
    kept = expected > 0
    p = float(stats.chisquare(counts[kept], expected[kept] / expected.sum() * counts.sum()).pvalue)
    assert p > 1e-3, f"p={p:.3g}"
    # unnormalized rows are fine: the residual is handed over without dividing by its mass
    scaled = sample((3 * probs).expand(40_000, -1), torch.Generator().manual_seed(0))
    assert torch.equal(scaled, draws)


def test_race_sampling_has_power():
    """The same chi-square rejects draws from a slightly different distribution."""
    probs = torch.tensor([0.05, 0.3, 0.15, 0.02, 0.4, 0.08])
    other = torch.tensor([0.05, 0.33, 0.15, 0.02, 0.37, 0.08])
    draws = sample(other.expand(40_000, -1), torch.Generator().manual_seed(0))
    counts = torch.bincount(draws, minlength=len(probs)).double().numpy()
    expected = probs.double().numpy()
    assert float(stats.chisquare(counts, expected / expected.sum() * counts.sum()).pvalue) < 1e-6


# ----------------------------------------------------------------------------- no host reads inside a round


# Ops that read a tensor's value back to the host: on CUDA each one stalls the host until the GPU
# catches up. `.tolist()` does its read outside the dispatcher, so the one per round is not counted.
_HOST_READS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "unique", "_unique2", "equal"}


def device_verdict(logits: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    return sampling.verdict(logits, drafts, accept_greedy(logits, drafts))


class _CountHostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in _HOST_READS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("with_draft", [False, True])
def test_a_round_reads_nothing_back_but_its_result(
    target, draft, small_tokenizer, temperature, with_draft, monkeypatch
):
    """Drafting, verifying and accepting stay on the device; the host reads each round's outcome once
    (and a model draft's tokens once), with `.tolist()`. No other op in a generation reads a value. (On the CPU,
    where a read costs nothing, a greedy round's verdict reads as it goes: here it takes the device's way.)"""
    monkeypatch.setattr(
        step_shapes, "greedy_verdict_on_host", lambda logits, drafts: device_verdict(logits, drafts).tolist()
    )
    decoder = SpeculativeDecoder(
        target, small_tokenizer, ModelDrafter(draft) if with_draft else None, FixedGamma(3) if with_draft else None
    )
    opts = DecodeOptions(max_new_tokens=12, sampling=SamplingParams(temperature=temperature), seed=0)
    with _CountHostReads() as reads:
        g = decoder.generate([1, 2, 3], opts)
    assert len(g.token_ids) == 12 and g.stats.rounds >= 4
    assert reads.seen == []
