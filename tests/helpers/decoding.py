"""Decoding under test: prompts to decode, a generation's invariants, the checks that one decoder writes what
another does, and how well a draft fits its target."""

from __future__ import annotations

import random

import torch

from speccomplete.decoder.engine import DecodeOptions, Generation, SpeculativeDecoder
from speccomplete.decoder.target_steps import EagerTarget
from speccomplete.decoder.training.fitness import fitness_from_logits

CODE_SNIPPETS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "x = x + 1; y = y + 1; z = z + ",
    "if (a < b) { return a; } else { return b; }",
    "import os\nimport sys\nimport ",
]


def random_prompts(n: int, seed: int = 1234) -> list[str]:
    """A mix of random printable text, code snippets and repetitive text (which the n-gram drafter likes)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append("".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(1, 24))))
        elif kind == 1:
            snippet = rng.choice(CODE_SNIPPETS)
            out.append(snippet[: rng.randrange(1, len(snippet) + 1)])
        else:
            word = "".join(rng.choice("abcdefg ") for _ in range(rng.randrange(2, 6)))
            out.append(word * rng.randrange(2, 5))
    return out


def check_stats(gen: Generation) -> None:
    """Invariants every generation's statistics must satisfy."""
    s = gen.stats
    assert 0 <= s.accepted <= s.drafted
    assert s.drafted == sum(s.gammas)
    assert len(s.gammas) == s.rounds
    assert sum(s.accepted_histogram) == sum(1 for g in s.gammas if g > 0)
    assert sum(n * c for n, c in enumerate(s.accepted_histogram)) == s.accepted
    assert s.rejected_rounds <= sum(1 for g in s.gammas if g > 0)
    assert s.new_tokens == len(gen.token_ids)
    assert s.finish_reason == gen.finish_reason
    # every round commits at least one token (unless generation ended inside it)
    assert s.rounds <= len(gen.token_ids) + 1


def generate(decoder: SpeculativeDecoder, prompt, **options) -> Generation:
    gen = decoder.generate(prompt, DecodeOptions(**options))
    check_stats(gen)
    return gen


def assert_greedy_matches(ar: SpeculativeDecoder, spec: SpeculativeDecoder, prompts, max_new_tokens: int) -> None:
    """`spec` writes what `ar` writes on every prompt, token for token, and its drafts were both
    accepted and rejected along the way (so both paths of the acceptance ran)."""
    gens = []
    for prompt in prompts:
        want = generate(ar, prompt, max_new_tokens=max_new_tokens)
        got = generate(spec, prompt, max_new_tokens=max_new_tokens)
        assert got.token_ids == want.token_ids, prompt
        gens.append(got)
    assert sum(g.stats.accepted for g in gens) > 0 and sum(g.stats.rejected_rounds for g in gens) > 0


def assert_steps_match_reference(
    reference: SpeculativeDecoder,
    spec: SpeculativeDecoder,
    ar: SpeculativeDecoder,
    prompts,
    max_new_tokens: int,
    logprobs: bool = False,
) -> int:
    """`spec` and `ar`, taking turns on the steps under test, both write what `reference` writes on every
    prompt, token for token (and with its log-probabilities if `logprobs`); returns the tokens `spec` drafted."""
    drafted = 0
    for prompt in prompts:
        want = generate(reference, prompt, max_new_tokens=max_new_tokens)
        got = generate(spec, prompt, max_new_tokens=max_new_tokens)
        assert got.token_ids == want.token_ids, prompt
        if logprobs:
            torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=1e-4, atol=1e-4)
        assert generate(ar, prompt, max_new_tokens=max_new_tokens).token_ids == want.token_ids, prompt
        drafted += got.stats.drafted
    return drafted


@torch.inference_mode()
def draft_fitness(target, draft, ids: list[int]) -> dict[str, float]:
    """fitness_from_logits of `draft` against `target` on `ids`, teacher-forced in one pass each."""
    input_ids = torch.tensor([ids], device=target.device)
    p_logits = target(input_ids=input_ids, use_cache=False).logits[0]
    # no cache: a draft made of non-adjacent layers would index a config-sized cache out of range
    q_logits = draft(input_ids=input_ids, use_cache=False).logits[0]
    return fitness_from_logits(p_logits, q_logits, getattr(draft, "vocab_ids", None))


def assert_compiled_ar_is_eager_ar(target, tokenizer, compiled, prompts: list[str], max_new_tokens: int = 16) -> None:
    """AR on the eager steps and AR on steps running `compiled` (a CompiledStep) write the same tokens, and the
    compiled one never fell back to eager."""
    steps = EagerTarget(target)
    steps.use_compiled(compiled)
    eager_ar = SpeculativeDecoder(target, tokenizer, None, None)
    compiled_ar = SpeculativeDecoder(target, tokenizer, None, None, steps=steps)
    for prompt in prompts:
        want = generate(eager_ar, prompt, max_new_tokens=max_new_tokens).token_ids
        assert generate(compiled_ar, prompt, max_new_tokens=max_new_tokens).token_ids == want
    assert steps.compiled is compiled
