"""The bench harness end to end on a tiny model: every method runs on the same prompts."""

import json

from conftest import tiny_llama

from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.harness.bench import bench_events, format_table, report, run_bench, weight_bytes_per_token
from speccomplete.harness.bench_contenders import Contenders
from speccomplete.harness.cases import Case


def _cases():
    text = "def f(x):\n    return x + 1\n\nfn main() {\n    let y = 2;\n}\n"
    return [Case("py-0", "a.py", text, 1, 4), Case("rs-0", "b.rs", text, 4, 4)]


def test_bench_runs_all_methods_and_reports(tokenizer):
    target = tiny_llama(seed=3)
    draft = derive_draft(target, [0])
    ours = {
        "ar": SpeculativeDecoder(target, tokenizer),
        "spec": SpeculativeDecoder(target, tokenizer, ModelDrafter(draft), FixedGamma(2)),
        "spec_hybrid": SpeculativeDecoder(target, tokenizer, HybridDrafter(ModelDrafter(draft)), FixedGamma(2)),
    }
    results = run_bench(
        _cases(),
        Contenders(ours, target, draft),
        max_new_tokens=8,
        max_prompt_tokens=64,
        hf_gammas=[1],
        prompt_lookup=2,
    )
    data = report(
        results,
        tokenizer,
        device="cpu",
        dtype="float32",
        target="tiny",
        draft="layers:0",
        gamma="2",
        max_new_tokens=8,
        bandwidth_gbs=10.0,
        weight_bytes=weight_bytes_per_token(target),
    )
    assert set(results[0].runs) == {
        "ar",
        "spec",
        "spec_hybrid",
        "hf_assisted_default",
        "hf_assisted_const1",
        "hf_greedy",
        "hf_assisted_lookup",
    }
    overall = data["overall"]
    # greedy speculative decoding reproduces AR, and AR reproduces HF greedy
    assert overall["identical_to_ar"] is True
    assert all(m["identical_to_ar"] for m in data["methods"].values())
    assert set(data["languages"]) == {"python", "rust"}
    assert overall["speedup_vs_ar"] == overall["spec_tokens_per_s"] / overall["ar_tokens_per_s"]
    assert data["assisted_method"] in ("hf_assisted_default", "hf_assisted_const1", "hf_assisted_lookup")
    assert data["methods"]["hf_greedy"]["decode_tokens_per_s"] is None  # HF reports no prefill time
    assert data["methods"]["spec"]["decode_tokens_per_s"] > data["methods"]["spec"]["tokens_per_s"]
    # the follow-up request of each case reuses the prefix the product decoder holds
    for r in results:
        assert r.followup["warm_prefilled_tokens"] < r.followup["cold_prefilled_tokens"]
    bound = data["bandwidth_bound"]
    assert bound["bound_tokens_per_s"] == 10.0e9 / bound["weight_bytes_per_token"]
    # each of our methods says how many requests ran with how few CPU threads; HF's keep no stats
    assert set(data["threads"]) == {"ar", "spec", "spec_hybrid"}
    assert all(sum(counts.values()) == len(results) and min(counts) >= 1 for counts in data["threads"].values())
    json.dumps(data)  # the report is plain JSON
    table = format_table(data)
    assert "OVERALL" in table and "python" in table and "bandwidth bound" in table and "spec_hybrid" in table
    assert "requests by the fewest CPU threads" in table


def test_bench_writes_one_event_per_case_per_method(tokenizer):
    """`specdec bench --events`: our AR and spec runs of each case, as events sharing one run id."""
    target = tiny_llama(seed=3)
    spec = SpeculativeDecoder(target, tokenizer, ModelDrafter(derive_draft(target, [0])), FixedGamma(2))
    results = run_bench(
        _cases(),
        Contenders({"ar": SpeculativeDecoder(target, tokenizer), "spec": spec}),
        max_new_tokens=5,
        max_prompt_tokens=64,
    )
    events = bench_events(results, target="tiny", draft="layers:0", device="cpu", gamma="2", max_new_tokens=5)
    assert [(e.case_id, e.draft, e.settings["gamma"]) for e in events] == [
        ("py-0", "none", "0"),
        ("py-0", "layers:0", "2"),
        ("rs-0", "none", "0"),
        ("rs-0", "layers:0", "2"),
    ]
    assert all(e.source == "bench" and e.text is None for e in events)
    assert len({e.settings["run"] for e in events}) == 1
    for event, run in zip(events, [r.runs[m] for r in results for m in ("ar", "spec")]):
        assert event.generated_tokens == len(run.tokens) and event.accepted == run.stats.accepted
        json.dumps(event.to_dict())


def test_weight_bytes_count_a_tied_head_once(tokenizer):
    tied = tiny_llama(seed=3)
    params = sum(p.numel() for p in tied.parameters()) * 4
    embedding = tied.get_input_embeddings().weight.numel() * 4
    tied_head = tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    assert weight_bytes_per_token(tied) == (params if tied_head else params - embedding)


def test_full_vocab_head_proposes_what_the_sub_vocab_head_does(tokenizer):
    import torch

    from speccomplete.decoder.drafts.trained import draft_with_own_layers, with_full_vocab_head

    target = tiny_llama(seed=3)
    sub = draft_with_own_layers(target, [0], vocab_ids=torch.arange(0, 200, 3))
    wide = with_full_vocab_head(sub)
    assert sub.lm_head is not wide.lm_head and sub.vocab_ids is not None and wide.vocab_ids is None
    ids = torch.randint(3, 200, (1, 30))
    with torch.inference_mode():
        narrow, full = sub(ids).logits[0], wide(ids).logits[0]
    assert torch.equal(sub.vocab_ids[narrow.argmax(-1)], full.argmax(-1))
    torch.testing.assert_close(full[:, sub.vocab_ids], narrow)
