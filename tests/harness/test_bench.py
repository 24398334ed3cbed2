"""The bench harness end to end on a tiny model: every method runs on the same prompts."""

import json

from conftest import tiny_llama
from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, derive_draft
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.harness.bench import Contenders, format_table, report, run_bench, weight_bytes_per_token
from speccomplete.harness.cases import Case, read_cases, write_cases


def _cases():
    text = "def f(x):\n    return x + 1\n\nfn main() {\n    let y = 2;\n}\n"
    return [Case("py-0", "a.py", text, 1, 4), Case("rs-0", "b.rs", text, 4, 4)]


def test_cases_round_trip_and_cursor(tmp_path):
    cases = _cases()
    write_cases(cases, tmp_path / "c.jsonl")
    back = read_cases(tmp_path / "c.jsonl")
    assert [c.__dict__ for c in back] == [c.__dict__ for c in cases]
    assert back[0].prefix.endswith("    ") and back[0].expected_line == "return x + 1"
    assert [c.language for c in back] == ["python", "rust"]


def test_bench_runs_all_methods_and_reports(tokenizer):
    target = tiny_llama(seed=3)
    draft = derive_draft(target, [0])
    ours = {"ar": SpeculativeDecoder(target, tokenizer),
            "spec": SpeculativeDecoder(target, tokenizer, ModelDrafter(draft), FixedGamma(2)),
            "spec_hybrid": SpeculativeDecoder(target, tokenizer, HybridDrafter(ModelDrafter(draft)), FixedGamma(2))}
    results = run_bench(_cases(), Contenders(ours, target, draft), max_new_tokens=8, max_prompt_tokens=64,
                        hf_gammas=[1], prompt_lookup=2)
    data = report(results, tokenizer, device="cpu", dtype="float32", target="tiny", draft="layers:0",
                  gamma="2", max_new_tokens=8, bandwidth_gbs=10.0, weight_bytes=weight_bytes_per_token(target))
    assert set(results[0].runs) == {"ar", "spec", "spec_hybrid", "hf_assisted_default", "hf_assisted_const1",
                                    "hf_greedy", "hf_assisted_lookup"}
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


def test_weight_bytes_count_a_tied_head_once(tokenizer):
    tied = tiny_llama(seed=3)
    params = sum(p.numel() for p in tied.parameters()) * 4
    embedding = tied.get_input_embeddings().weight.numel() * 4
    tied_head = tied.get_output_embeddings().weight is tied.get_input_embeddings().weight
    assert weight_bytes_per_token(tied) == (params if tied_head else params - embedding)


def test_full_vocab_head_proposes_what_the_sub_vocab_head_does(tokenizer):
    import torch

    from speccomplete.decoder.trained_draft import build_draft, with_full_vocab_head

    target = tiny_llama(seed=3)
    sub = build_draft(target, [0], vocab_ids=torch.arange(0, 200, 3))
    wide = with_full_vocab_head(sub)
    assert sub.lm_head is not wide.lm_head and sub.vocab_ids is not None and wide.vocab_ids is None
    ids = torch.randint(3, 200, (1, 30))
    with torch.inference_mode():
        narrow, full = sub(ids).logits[0], wide(ids).logits[0]
    assert torch.equal(sub.vocab_ids[narrow.argmax(-1)], full.argmax(-1))
    torch.testing.assert_close(full[:, sub.vocab_ids], narrow)


def test_next_line_quality_scores_each_language(tokenizer):
    from speccomplete.harness.nextline import next_line_quality

    rows = next_line_quality(SpeculativeDecoder(tiny_llama(seed=3), tokenizer), _cases(), max_new_tokens=6)
    assert set(rows) == {"python", "rust", "OVERALL"}
    assert rows["OVERALL"]["cases"] == 2
    for row in rows.values():
        assert 0 <= row["exact_match"] <= row["similarity"] <= 1  # an exact line has similarity 1
        assert row["tokens_per_s"] > 0


def test_step_costs_report_ratios(tokenizer):
    from speccomplete.harness.stepcost import step_costs

    row = step_costs(tiny_llama(seed=3), list(range(40)), widths=(1, 3), repeats=3)
    assert row["verify_3_ratio"] == row["target_3_ms"] / row["target_1_ms"]
    assert row["c"] == row["draft_1_ms"] / row["target_1_ms"] > 0


def test_ablation_rows_each_turn_one_lever(tokenizer):
    """`specdec bench --ablations`: the rows it builds, each token-identical to AR under greedy."""
    import argparse
    import copy

    from speccomplete.decoder.drafts import build_drafter
    from speccomplete.decoder.gamma import HeuristicGamma
    from speccomplete.decoder.kernels import pack_linear_weights
    from speccomplete.cli import _bench_contenders

    target = tiny_llama(seed=4, layers=3)
    stock = copy.deepcopy(target)
    args = argparse.Namespace(draft="ngram+none", gamma="heuristic", ablations=True, no_pack=False,
                              compare_gammas="heuristic,cost", compare_confidences="0.3,0.6",
                              device="cpu", dtype="auto")
    product, _ = build_drafter(args.draft, target, tokenizer)
    other = {"ngram+auto": build_drafter("ngram+auto", target, tokenizer)}  # 'auto' derives layers 0,1 here
    pack_linear_weights(target, other["ngram+auto"][1])
    decoder = SpeculativeDecoder(target, tokenizer, product, HeuristicGamma())
    contenders, doc = _bench_contenders(args, target, tokenizer, decoder, other, stock)
    ours = contenders.ours
    assert set(ours) == {"ar", "spec", "spec_draft_ngram+auto", "spec_gamma_cost", "spec_confidence_0.3",
                         "spec_confidence_0.6", "ar_unpacked", "spec_unpacked", "ar_hf_forward",
                         "spec_hf_forward"}
    assert set(doc) == set(ours)
    from speccomplete.decoder.lean_forward import supports
    assert supports(ours["ar"].target) and not supports(ours["ar_hf_forward"].target)  # the one lever it turns
    # the threshold rows pace the lookup-then-model draft, as the γ rows do, and differ only in it
    assert [ours[f"spec_confidence_{t}"].draft_confidence for t in ("0.3", "0.6")] == [0.3, 0.6]
    assert ours["spec_confidence_0.3"].drafter.model is not None
    assert ours["spec_confidence_0.3"].drafter is not ours["spec_confidence_0.6"].drafter  # each its own cache
    assert ours["spec_gamma_cost"].draft_confidence == 0.0
    prompt = "def f(x):\n    return x + 1\n\ndef g(x):\n    return"
    ar = ours["ar"].generate(prompt, DecodeOptions(max_new_tokens=12)).token_ids
    for name, row in ours.items():
        assert row.generate(prompt, DecodeOptions(max_new_tokens=12)).token_ids == ar, name
