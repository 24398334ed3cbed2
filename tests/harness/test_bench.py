"""The bench harness end to end on a tiny model: every method runs on the same prompts."""

import json

import pytest
from helpers.tiny_models import tiny_llama

from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.harness.bench.contenders import Contenders
from speccomplete.harness.bench.loop import run_bench
from speccomplete.harness.bench.summary import bench_events, report
from speccomplete.harness.bench.table import format_table
from speccomplete.harness.lib.cases import Case, write_cases
from speccomplete.harness.lib.roofline import weight_bytes_per_token


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
    # every method's decode rate leaves its prefill out: ours by its stats, HF's by its first streamed token
    for name, method in data["methods"].items():
        assert method["decode_tokens_per_s"] > method["tokens_per_s"], name
    for case in data["per_case"]:
        for name in results[0].runs:
            prefill, decode = case[f"{name}_prefill_ms"], case[f"{name}_decode_ms"]
            assert 0 < prefill and 0 < decode and prefill + decode == pytest.approx(1000 * case[f"{name}_s"], abs=0.1)
            assert case[f"{name}_first_token_ms"] >= prefill - 0.01  # our prefill is stamped before the first token
    ar_run = results[0].runs["ar"]
    assert data["per_case"][0]["ar_prefill_ms"] == round(ar_run.stats.prefill_ms, 2)
    # on the CPU nothing is recorded, and the check ran: counted around every case
    assert data["steady_state"] is True and data["recordings"]["cases_recording"] == []
    assert data["recordings"]["in_timed_runs"]["cuda_graphs"] == 0
    assert all(r.recorded and not any(r.recorded.values()) for r in results)
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
    assert table.splitlines()[-1].startswith("steady state: nothing recorded") and "NOT STEADY" not in table
    data["device_facts"] = {"cpu": "AMD EPYC", "cpu_family_model": "26/2", "cpu_isa": ["avx2", "avx512_vnni"]}
    assert format_table(data).splitlines()[0].endswith(" cpu=AMD EPYC (26/2: avx2 avx512_vnni)")


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


def test_a_graph_recorded_inside_a_timed_run_is_reported_not_passed(tokenizer, monkeypatch):
    """A recording during a case's runs (here counted by hand, as Captured counts one on CUDA) makes
    the report say so: steady_state false, the counts, the case, and a loud line in the table."""
    from speccomplete.decoder import cuda_graphs

    target = tiny_llama(seed=3)
    ar = SpeculativeDecoder(target, tokenizer)
    spec = SpeculativeDecoder(target, tokenizer, ModelDrafter(derive_draft(target, [0])), FixedGamma(2))
    monkeypatch.setattr(cuda_graphs, "_recordings", cuda_graphs.recordings())
    generate, calls = spec.generate, []

    def generate_recording_once(ids, options):
        calls.append(options.gamma_group)
        if options.gamma_group == "rust":  # the second case's timed run, after the warm-up's
            cuda_graphs._recordings += 1
        return generate(ids, options)

    monkeypatch.setattr(spec, "generate", generate_recording_once)
    results = run_bench(_cases(), Contenders({"ar": ar, "spec": spec}), max_new_tokens=4, max_prompt_tokens=64)
    assert calls[0] == "warm-up" and "rust" in calls
    data = report(
        results, tokenizer, device="cpu", dtype="float32", target="tiny", draft="layers:0", gamma="2", max_new_tokens=4
    )
    assert data["steady_state"] is False
    assert data["recordings"]["in_timed_runs"]["cuda_graphs"] == 1
    assert data["recordings"]["cases_recording"] == ["rs-0"]
    assert [case["recorded"]["cuda_graphs"] for case in data["per_case"]] == [0, 1]
    table = format_table(data).splitlines()
    assert table[2].startswith("!!! NOT STEADY STATE") and "cases rs-0" in table[2] and table[-1] == table[2]


def test_the_warm_up_calls_every_row_count_of_compiled_steps_twice(tokenizer):
    """torch.compile's cudagraph trees record a graph on its second call: before the timed runs, every
    row count of compiled steps has been called at least twice (here fixed steps marked compiled, which
    run the same padded forwards eagerly on the CPU)."""
    from speccomplete.decoder.target_steps import FixedShapeTarget
    from speccomplete.harness.bench.loop import warm_up
    from speccomplete.harness.bench.methods import build_methods

    target = tiny_llama(seed=3)
    steps = FixedShapeTarget(target, capacity=128, max_rows=3)
    steps.records_graphs = True
    calls: list[int] = []
    padded = steps._padded_logits

    def counted(input_ids):
        calls.append(input_ids.shape[1])
        return padded(input_ids)

    steps._padded_logits = counted
    drafter = ModelDrafter(derive_draft(target, [0]))
    ours = {
        "ar": SpeculativeDecoder(target, tokenizer, steps=steps),
        "spec": SpeculativeDecoder(target, tokenizer, drafter, FixedGamma(2), steps=steps),
    }
    contenders = Contenders(ours)
    said: list[str] = []
    warm_up(build_methods(contenders, 4, [], None), contenders, list(range(10, 30)), said.append)
    assert steps.buckets == (1, 3) and all(calls.count(rows) >= 2 for rows in steps.buckets)
    assert len(said) == 2 and all("the second of 2 runs" in line for line in said)


def test_recordings_count_the_cudagraph_trees_recording_trigger():
    """Each cudagraph-tree recording runs dynamo's start callbacks with CUDAGRAPH_RECORDING; compiles
    (DYNAMO) are counted apart, by dynamo's own counter."""
    from torch._dynamo.callback import CallbackTrigger, callback_handler

    from speccomplete.harness.bench.loop import Recordings, counts_between

    recordings = Recordings()
    try:
        before = recordings.counts()
        with callback_handler.install_callbacks(CallbackTrigger.CUDAGRAPH_RECORDING, "0/0"):
            pass
        with callback_handler.install_callbacks(CallbackTrigger.DYNAMO, "0/1"):
            pass
        assert counts_between(before, recordings.counts()) == {
            "cuda_graphs": 0,
            "cudagraph_trees": 1,
            "compiled_graphs": 0,
        }
    finally:
        recordings.close()
    assert recordings._on_start not in callback_handler.start_callbacks


def test_specdec_bench_writes_its_tables_after_every_case(tmp_path, monkeypatch):
    """A bench stopped between cases (a time cap) leaves the report of the cases it finished."""
    from helpers.lsp import save_random_model

    from speccomplete.cli import main
    from speccomplete.harness import bench

    model = save_random_model(tmp_path / "tiny")
    cases = tmp_path / "cases.jsonl"
    write_cases(_cases(), cases)
    line = bench.case_line

    def stop_after_the_first(result):
        if result.case.id == "rs-0":
            raise KeyboardInterrupt  # as a cap's signal would stop it
        return line(result)

    monkeypatch.setattr(bench, "case_line", stop_after_the_first)
    out = tmp_path / "bench.json"
    args = ["bench", "--cases", str(cases), "--target", str(model), "--draft", "ngram", "--no-hf"]
    with pytest.raises(KeyboardInterrupt):
        main([*args, "--max-new-tokens", "4", "--device", "cpu", "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["complete"] is False and data["cases"] == 1 and data["per_case"][0]["id"] == "py-0"
    assert data["steady_state"] is True and data["bandwidth_bound"]["bound_tokens_per_s"] > 0
    assert "OVERALL" in (tmp_path / "bench.txt").read_text()


def test_compiled_steps_are_built_for_every_row_an_eagle3_draft_among_them(tmp_path, cache_dir):
    """`--steps compiled` comparing an EAGLE-3 draft with a draft that keeps no states: the graph is built once every
    row's drafter is attached, with the draft's taps (built before, it would be dropped when the draft attached, and
    every row would run eagerly), and the draft's own step is compiled beside it."""
    from helpers.eagle3 import make_draft
    from helpers.lsp import save_random_model

    from speccomplete.cli import main
    from speccomplete.decoder.drafts.eagle3.model import save_eagle3, speculators_config
    from speccomplete.decoder.models import load_model

    model = save_random_model(tmp_path / "tiny")
    target, _ = load_model(str(model), device="cpu", dtype="float32")
    draft = make_draft(target)
    eagle = tmp_path / "eagle"
    save_eagle3(draft, eagle, speculators_config(draft.shape, ["LlamaForCausalLM"], None, 3, head_from_target=True))
    cases = tmp_path / "cases.jsonl"
    write_cases(_cases(), cases)
    out = tmp_path / "bench.json"
    args = ["bench", "--cases", str(cases), "--target", str(model), "--draft", "ngram", "--no-hf", "--device", "cpu"]
    main(
        [*args, "--compare-drafts", f"ngram+{eagle}", "--steps", "compiled", "--max-new-tokens", "4"]
        + ["--json", str(out)]
    )
    data = json.loads(out.read_text())
    assert data["steps"] == "compiled" and data["complete"] is True
    entries = [entry.name for entry in (cache_dir / "compiled").iterdir()]
    assert any(name.startswith("eagle3-") for name in entries), entries
