"""Fixed-shape target steps (the CUDA path) against eager ones: same logits, same greedy tokens.

On the CPU these run the very code a GPU runs, padding, the fixed-address cache and, in the
compiled test, torch.compile with one graph per row count; only the CUDA graph capture itself
is left to CUDA.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo.utils
from helpers.decoding import assert_steps_match_reference, generate, random_prompts
from helpers.tiny_models import tiny_llama

from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, NgramDrafter, SelfDrafter
from speccomplete.decoder.engine import SpeculativeDecoder, round_rows
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.graph_target import GraphTarget
from speccomplete.decoder.step_shapes import row_buckets
from speccomplete.decoder.target_steps import FIXED_CAPACITY, EagerTarget, FixedShapeTarget, target_steps

PROMPTS = random_prompts(8, seed=99)


def test_row_buckets():
    assert row_buckets(1) == (1,)
    assert row_buckets(2) == (1, 2)
    assert row_buckets(5) == (1, 5)
    assert row_buckets(17) == (1, 17)


@pytest.mark.parametrize("name", ["llama", "gpt2", "gemma3"])
@torch.inference_mode()
def test_fixed_shapes_give_eager_logits_through_feeds_and_rollbacks(name, request):
    model = request.getfixturevalue(name)  # gemma3's sliding window is 8 tokens: its mask is exercised
    eager, fixed = EagerTarget(model), FixedShapeTarget(model, capacity=96, max_rows=5)
    ids = torch.randint(3, 250, (90,), generator=torch.Generator().manual_seed(1)).tolist()
    assert torch.allclose(eager.forward(ids[:20], 1), fixed.forward(ids[:20], 1), atol=1e-5)
    held = 20
    # feeds of every row count and one past them (eager at its own shape), each rolled back a little
    for feed, keep_back in [(3, 1), (1, 0), (5, 2), (2, 0), (4, 4), (9, 3), (5, 0), (1, 1)]:
        chunk = ids[held : held + feed]
        assert torch.allclose(eager.forward(chunk, feed), fixed.forward(chunk, feed), atol=1e-5), (feed, held)
        held += feed - keep_back
        eager.truncate(held)
        fixed.truncate(held)
        assert eager.tokens == fixed.tokens == ids[:held]
    # a new request sharing a prefix: cut back and feed another continuation
    fixed.truncate(10)
    eager.truncate(10)
    assert torch.allclose(eager.forward(ids[50:53], 3), fixed.forward(ids[50:53], 3), atol=1e-5)


def test_fixed_cache_refuses_what_does_not_fit(llama, tokenizer):
    fixed = FixedShapeTarget(llama, capacity=16, max_rows=4)
    with torch.inference_mode():
        fixed.forward(list(range(3, 17)), keep=1)
        with pytest.raises(ValueError, match="do not fit"):
            fixed.forward([5, 6, 7], keep=3)
        assert len(fixed.tokens) == 14  # nothing was fed
    # a decoder on it left-truncates prompts to the capacity, as to a context window
    drafter, policy = NgramDrafter(), FixedGamma(2)
    steps = FixedShapeTarget(llama, capacity=64, max_rows=round_rows(policy, drafter))
    decoder = SpeculativeDecoder(llama, tokenizer, drafter, policy, steps=steps)
    gen = generate(decoder, "x" * 200, max_new_tokens=8)
    assert gen.stats.prompt_truncated_tokens > 0 and len(gen.token_ids) == 8


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_speculation_on_fixed_shapes_is_eager_ar_token_for_token(name, request, tokenizer):
    model = request.getfixturevalue(name)
    reference = SpeculativeDecoder(model, tokenizer)  # eager AR
    drafters = {
        "lookup (the product's)": HybridDrafter(None),
        "model": ModelDrafter(request.getfixturevalue("llama_other"))
        if name == "llama"
        else HybridDrafter(None, lookup_tokens=4),
    }
    for label, drafter in drafters.items():
        policy = FixedGamma(4)
        steps = FixedShapeTarget(model, capacity=256, max_rows=round_rows(policy, drafter))
        spec = SpeculativeDecoder(model, tokenizer, drafter, policy, steps=steps)
        ar = SpeculativeDecoder(model, tokenizer, steps=steps)  # takes turns on the same cache
        drafted = assert_steps_match_reference(reference, spec, ar, PROMPTS, max_new_tokens=16)
        assert drafted > 0, label


def test_a_follow_up_request_reuses_the_fixed_cache(llama, tokenizer):
    steps = FixedShapeTarget(llama, capacity=256, max_rows=5)
    decoder = SpeculativeDecoder(llama, tokenizer, HybridDrafter(None, lookup_tokens=4), FixedGamma(4), steps=steps)
    first = generate(decoder, PROMPTS[0], max_new_tokens=12)
    follow = decoder.encode(PROMPTS[0]) + first.token_ids[:5]
    warm = generate(decoder, follow, max_new_tokens=10)
    assert warm.stats.prompt_reused_tokens == len(follow) - 1
    assert warm.token_ids == generate(SpeculativeDecoder(llama, tokenizer), follow, max_new_tokens=10).token_ids


def test_auto_steps_are_eager_on_the_cpu_graphs_on_cuda(llama, gpt2):
    auto = target_steps(llama, "auto", 5)
    if llama.device.type == "cuda":  # SPECDEC_TEST_DEVICE=cuda (tests/helpers/tiny_models.py)
        assert isinstance(auto, GraphTarget)
        assert isinstance(target_steps(gpt2, "auto", 5), FixedShapeTarget)  # a family graphs do not run
    else:
        assert isinstance(auto, EagerTarget)
    fixed = target_steps(llama, "fixed", 5)
    assert isinstance(fixed, FixedShapeTarget) and not fixed.records_graphs
    assert fixed.capacity == llama.config.max_position_embeddings  # under FIXED_CAPACITY
    assert isinstance(target_steps(llama, "graphs", 5), GraphTarget)
    with pytest.raises(ValueError, match="unknown target steps"):
        target_steps(llama, "static", 5)


def fixed_compiled(model, max_rows: int, hidden: bool = False) -> FixedShapeTarget:
    """What `compiled` is on CUDA for a family graph_target.py does not run (on the CPU, `compiled` is the
    lean forward's compiled step: tests/decoder/test_compiled_step.py), compiled here on the CPU."""
    steps = FixedShapeTarget(model, FIXED_CAPACITY, max_rows, compile=True)
    steps.warm_up(hidden)
    return steps


def test_compiled_steps_compile_once_per_row_count(tokenizer):
    """torch.compile(mode="reduce-overhead", fullgraph=True): each row count is traced once, and
    rounds at every position, rollbacks included, replay those graphs without recompiling."""
    model = tiny_llama(seed=5, layers=2)
    policy, drafter = FixedGamma(3), HybridDrafter(None, lookup_tokens=3)
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    steps = fixed_compiled(model, round_rows(policy, drafter))  # compiles every row count now
    assert steps.records_graphs and steps.buckets == (1, 4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 2
    spec = SpeculativeDecoder(model, tokenizer, drafter, policy, steps=steps)
    reference = SpeculativeDecoder(model, tokenizer)
    drafted = 0
    for prompt in PROMPTS[:4]:
        got = generate(spec, prompt, max_new_tokens=20)
        assert got.token_ids == generate(reference, prompt, max_new_tokens=20).token_ids, prompt
        drafted += got.stats.drafted
    assert drafted > 0
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 2  # no recompiles


def test_compiled_self_draft_steps_compile_once_per_row_count(tokenizer):
    """A SelfDrafter's hidden-state steps get a graph per row count too, compiled at load, and its
    rounds (drafts, copies after them, rejections) replay them: no eager step on the compiled path."""
    model = tiny_llama(seed=6, layers=2)
    rows = model.get_output_embeddings().out_features
    half = torch.randperm(rows, generator=torch.Generator().manual_seed(0))[: rows // 2]  # drafts also rejected
    policy, drafter = FixedGamma(3), HybridDrafter(SelfDrafter(model, half), lookup_tokens=3)
    torch._dynamo.reset()
    before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    steps = fixed_compiled(model, round_rows(policy, drafter), hidden=True)
    assert steps.buckets == (1, 4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 4
    spec = SpeculativeDecoder(model, tokenizer, drafter, policy, steps=steps)
    reference = SpeculativeDecoder(model, tokenizer)
    drafted = accepted = 0  # by the target itself
    for prompt in PROMPTS[:4]:
        got = generate(spec, prompt, max_new_tokens=20)
        assert got.token_ids == generate(reference, prompt, max_new_tokens=20).token_ids, prompt
        drafted += got.stats.drafted - got.stats.lookup_drafted
        accepted += got.stats.accepted - got.stats.lookup_accepted
    assert 0 < accepted < drafted
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - before == 4  # no recompiles


@pytest.mark.parametrize("kind", ["eager", "fixed"])
def test_a_forward_that_raises_midway_loses_nothing(kind, llama, tokenizer):
    """An error inside the model (say, out of memory in its last layer) must not leave the cache
    out of step with its tokens: the next request decodes as a fresh decoder would."""
    steps = target_steps(llama, kind, 5)
    decoder = SpeculativeDecoder(llama, tokenizer, HybridDrafter(None, lookup_tokens=4), FixedGamma(4), steps=steps)
    first = generate(decoder, PROMPTS[1], max_new_tokens=8)
    follow = decoder.encode(PROMPTS[1]) + first.token_ids
    last_layer = llama.model.layers[-1]
    original = last_layer.forward
    calls = 0

    def fails_on_the_third_call(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 3:
            raise torch.OutOfMemoryError("simulated")
        return original(*args, **kwargs)

    last_layer.forward = fails_on_the_third_call
    try:
        with pytest.raises(torch.OutOfMemoryError):
            generate(decoder, follow, max_new_tokens=8)
    finally:
        del last_layer.forward
    again = generate(decoder, follow, max_new_tokens=8)
    assert again.token_ids == generate(SpeculativeDecoder(llama, tokenizer), follow, max_new_tokens=8).token_ids
