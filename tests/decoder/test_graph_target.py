"""Graph steps (decoder/graph_target.py, the CUDA default) against eager ones: same logits, same tokens.

On the CPU `cuda_graphs.Captured` runs each graph's function eagerly, on the same static buffers and at
the same padded shapes a GPU records: the ring buffers, spans, masks and padding are all exercised here.
With SPECDEC_TEST_DEVICE=cuda the graphs are recorded and replayed.
"""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.decoding import assert_steps_match_reference, generate, random_prompts
from helpers.tiny_models import (
    tiny_gemma2,
    tiny_gemma3,
    tiny_llama,
    tiny_mistral,
    tiny_qwen2,
    tiny_qwen3,
    tiny_starcoder2,
)

from speccomplete.decoder import cuda_graphs
from speccomplete.decoder.drafts import Eagle3Drafter, HybridDrafter, SelfDrafter
from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, init_from_target
from speccomplete.decoder.engine import SpeculativeDecoder, round_rows
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.graph_target import GraphTarget, span_buckets, supports
from speccomplete.decoder.kernels import pack_linear_weights
from speccomplete.decoder.target_steps import EagerTarget

PROMPTS = random_prompts(6, seed=41)

# small enough that a 90-token run wraps the rings (window 8 + 8 slots) and crosses spans (16, 32, 64, ...)
SMALL = dict(chunk=8, first_span=16)

FAMILIES = {
    "llama": lambda: tiny_llama(seed=3),
    "gemma3": lambda: tiny_gemma3(seed=3, sliding_window=8),
    "qwen2": lambda: tiny_qwen2(seed=3),
    "qwen3": lambda: tiny_qwen3(seed=3),
    "mistral": lambda: tiny_mistral(seed=3, sliding_window=8),
    "gemma2": lambda: tiny_gemma2(seed=3, sliding_window=8),
    "starcoder2": lambda: tiny_starcoder2(seed=3, sliding_window=8),
}


def test_span_buckets():
    assert span_buckets(4224) == (512, 1024, 2048, 4096, 4224)
    assert span_buckets(512) == (512,)
    assert span_buckets(100, first=16) == (16, 32, 64, 100)


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_graph_steps_give_eager_logits_through_feeds_and_rollbacks(family):
    model = FAMILIES[family]()
    eager, graphs = EagerTarget(model), GraphTarget(copy.deepcopy(model), capacity=96, max_rows=5, **SMALL)
    graphs.warm_up()
    ids = torch.randint(3, 250, (96,), generator=torch.Generator().manual_seed(1)).tolist()
    # a prefill longer than a chunk: eager pieces of 8 rows
    torch.testing.assert_close(graphs.forward(ids[:20], 20), eager.forward(ids[:20], 20), rtol=1e-4, atol=1e-4)
    held = 20
    # feeds of every row count and past them, each rolled back a little; the rings wrap many times
    for feed, keep_back in [(3, 1), (1, 0), (5, 2), (2, 0), (4, 4), (9, 3), (5, 0), (1, 1), (13, 2), (5, 5)] * 3:
        if held + feed > 96:
            break
        chunk = ids[held : held + feed]
        got, want = graphs.forward(chunk, feed), eager.forward(chunk, feed)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m: f"{family} at {held}: {m}")
        held += feed - keep_back
        eager.truncate(held)
        graphs.truncate(held)
        assert eager.tokens == graphs.tokens == ids[:held]
    assert held > 60
    # a new request sharing a prefix: cut back and feed another continuation. Rings (the sliding layers)
    # hold only `extra` positions back from the furthest written: cut back further, the steps start over
    graphs.truncate(10)
    eager.truncate(10)
    assert graphs.tokens == ([] if graphs.rings else ids[:10])
    if not graphs.tokens:
        graphs.feed(ids[:10])
    torch.testing.assert_close(graphs.forward(ids[50:53], 3), eager.forward(ids[50:53], 3), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_speculation_on_graph_steps_is_eager_ar_token_for_token(family, tokenizer):
    model = FAMILIES[family]()
    reference = SpeculativeDecoder(model, tokenizer)  # eager AR
    rows = model.get_output_embeddings().out_features
    half = torch.randperm(rows, generator=torch.Generator().manual_seed(0))[: rows // 2]  # drafts also rejected
    graph_model = copy.deepcopy(model)
    drafters = {
        "lookup": HybridDrafter(None, lookup_tokens=4),
        "self draft behind the lookup": HybridDrafter(SelfDrafter(graph_model, half), lookup_tokens=4),
    }
    for label, drafter in drafters.items():
        policy = FixedGamma(4)
        steps = GraphTarget(graph_model, capacity=256, max_rows=round_rows(policy, drafter), **SMALL)
        steps.warm_up(hidden=drafter.drafts_on_the_target)
        spec = SpeculativeDecoder(graph_model, tokenizer, drafter, policy, steps=steps)
        ar = SpeculativeDecoder(graph_model, tokenizer, steps=steps)  # takes turns on the same cache
        # the greedy verdict, decided inside the step's graph, gives the eager round's log-probabilities
        drafted = assert_steps_match_reference(reference, spec, ar, PROMPTS, max_new_tokens=24, logprobs=True)
        assert drafted > 0, label


def test_an_eagle3_chain_on_graph_steps_is_eager_ar_token_for_token(gemma3, tokenizer):
    """The product's CUDA path end to end: the target on graph steps keeping the draft's tapped states,
    the draft's chain as a graph of its own (graph_chain), both recorded at the decoder's start."""
    rows = gemma3.get_output_embeddings().out_features
    ids = torch.randperm(rows, generator=torch.Generator().manual_seed(0))[: rows // 2].sort().values
    model = copy.deepcopy(gemma3)
    draft = init_from_target(Eagle3Shape.for_target(model, draft_vocab=len(ids)), model, ids, seed=0).eval()
    drafter = Eagle3Drafter(draft.requires_grad_(False), model, graph_chain=True)
    policy = FixedGamma(4)
    steps = GraphTarget(model, capacity=256, max_rows=round_rows(policy, drafter), taps=drafter.target_taps, **SMALL)
    steps.warm_up()
    spec = SpeculativeDecoder(model, tokenizer, drafter, policy, steps=steps)
    assert drafter.chains is not None  # recorded when the decoder attached its steps
    reference = SpeculativeDecoder(gemma3, tokenizer)
    drafted = 0
    for prompt in PROMPTS[:4]:
        got = generate(spec, prompt, max_new_tokens=24)
        assert got.token_ids == generate(reference, prompt, max_new_tokens=24).token_ids, prompt
        drafted += got.stats.drafted
    assert drafted > 0 and drafter.graph_rounds > 0 and drafter.loop_rounds == 0


def test_bf16_graph_steps_speculate_as_their_own_ar(tokenizer):
    """In bf16 (the CUDA dtype) the graph steps follow the model's bf16 forward up to rounding, and greedy
    speculation on them writes what AR on them writes."""
    model = tiny_gemma3(seed=4, sliding_window=8).to(torch.bfloat16)
    ids = torch.randint(3, 250, (40,), generator=torch.Generator().manual_seed(2)).tolist()
    steps = GraphTarget(copy.deepcopy(model), capacity=256, max_rows=5, **SMALL)
    with torch.inference_mode():
        got = steps.forward(ids, keep=40).float()
        want = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float()
    assert got.dtype == torch.float32 and steps.cache.keys[0].dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0.05, atol=0.05)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9
    steps.truncate(0)
    policy, drafter = FixedGamma(4), HybridDrafter(None, lookup_tokens=4)
    spec = SpeculativeDecoder(steps.model, tokenizer, drafter, policy, steps=steps)
    ar = SpeculativeDecoder(steps.model, tokenizer, steps=steps)
    for prompt in PROMPTS[:3]:
        want_ids = generate(ar, prompt, max_new_tokens=16).token_ids
        assert generate(spec, prompt, max_new_tokens=16).token_ids == want_ids, prompt


def test_merged_products_hold_the_weights_once(llama):
    model = copy.deepcopy(llama)
    attention = model.model.layers[0].self_attn
    before = torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]).clone()
    steps = GraphTarget(model, capacity=64, max_rows=5)
    merged = steps.layers[0].qkv
    assert torch.equal(merged, before)
    assert attention.q_proj.weight.untyped_storage().data_ptr() == merged.untyped_storage().data_ptr()
    with torch.inference_mode():  # HF's forward on the model still computes what it did
        ids = torch.tensor([[5, 6, 7, 8]], device=model.device)
        torch.testing.assert_close(model(input_ids=ids).logits, llama(input_ids=ids).logits)


def test_graph_steps_refuse_what_they_cannot_run(llama, gpt2):
    assert supports(llama) and not supports(gpt2)
    with pytest.raises(ValueError, match="families"):
        GraphTarget(gpt2, capacity=64, max_rows=5)
    packed = copy.deepcopy(llama)
    pack_linear_weights(packed)  # CPU kernels replace the linears
    assert not supports(packed)
    steps = GraphTarget(copy.deepcopy(llama), capacity=16, max_rows=4)
    with torch.inference_mode():
        steps.forward(list(range(3, 17)), keep=1)
        with pytest.raises(ValueError, match="do not fit"):
            steps.forward([5, 6, 7], keep=3)
    assert len(steps.tokens) == 14  # nothing was fed


def test_graphs_are_recorded_at_warm_up_only(tokenizer):
    """Every (rows, span) graph is made at warm-up; decoding at every position, rollbacks included, uses
    those. Recording happens on CUDA only: the CPU runs the same functions eagerly and records none."""
    model = tiny_llama(seed=5, layers=2)
    policy, drafter = FixedGamma(3), HybridDrafter(None, lookup_tokens=3)
    steps = GraphTarget(model, capacity=128, max_rows=round_rows(policy, drafter), **SMALL)
    before = cuda_graphs.recordings()
    steps.warm_up()
    kinds = ("logits", "verdict")
    assert set(steps.graphs) == {(kind, rows, span) for kind in kinds for rows in (1, 4) for span in steps.spans}
    assert steps.spans == (16, 32, 64, 128, 136)
    recorded = cuda_graphs.recordings() - before
    assert recorded == (len(steps.graphs) if model.device.type == "cuda" else 0)
    spec = SpeculativeDecoder(model, tokenizer, drafter, policy, steps=steps)
    for prompt in PROMPTS[:3]:
        generate(spec, prompt, max_new_tokens=20)
    assert len(steps.graphs) == 2 * 2 * len(steps.spans)  # nothing new
    assert cuda_graphs.recordings() - before == recorded


def test_taps_keep_the_eager_steps_states(gemma3):
    taps = (0, 2)
    eager = EagerTarget(gemma3, taps)
    graphs = GraphTarget(copy.deepcopy(gemma3), capacity=96, max_rows=5, taps=taps, **SMALL)
    ids = torch.randint(3, 250, (40,), generator=torch.Generator().manual_seed(4)).tolist()
    with torch.inference_mode():
        for steps in (eager, graphs):
            steps.forward(ids[:20], keep=1)
            steps.forward(ids[20:24], keep=4)
            steps.truncate(22)
            steps.forward(ids[22:25], keep=3)
    assert eager.features is not None and graphs.features is not None
    assert graphs.features.length == eager.features.length == 25
    torch.testing.assert_close(graphs.features.rows(0, 25), eager.features.rows(0, 25), rtol=1e-4, atol=1e-4)


def test_graph_steps_auto_chose_give_way_to_compiled_ones_when_they_fail(llama, monkeypatch, caplog):
    """On CUDA `auto` picks graph steps; one that fails to record (a kernel the capture refuses) must not
    keep the decoder from loading: it falls back to torch.compile's steps, with a warning. Asked for by
    name, the failure is the caller's."""
    from speccomplete.decoder import target_steps as steps_module

    monkeypatch.setattr(steps_module, "steps_mode", lambda mode, model: "eager" if mode == "eager" else "graphs")

    def fails(self, hidden=False):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(GraphTarget, "warm_up", fails)
    warmed = []
    monkeypatch.setattr(steps_module.FixedShapeTarget, "warm_up", lambda self, hidden=False: warmed.append(hidden))
    steps = steps_module.target_steps(copy.deepcopy(llama), "auto", 5, hidden=True)
    assert isinstance(steps, steps_module.FixedShapeTarget) and steps.records_graphs and warmed == [True]
    assert "graph steps failed to record" in caplog.text
    with pytest.raises(RuntimeError, match="capturing"):
        steps_module.target_steps(copy.deepcopy(llama), "graphs", 5)
