"""The bench harness end to end on a tiny model: every method runs on the same prompts."""

import json

from conftest import tiny_llama
from decoder.drafts import ModelDrafter, derive_draft
from decoder.engine import SpeculativeDecoder
from decoder.gamma import FixedGamma
from specdec.bench import format_table, report, run_bench
from specdec.cases import Case, read_cases, write_cases


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
    spec = SpeculativeDecoder(target, tokenizer, ModelDrafter(draft), FixedGamma(2))
    results = run_bench(_cases(), target, tokenizer, spec, draft, max_new_tokens=8, max_prompt_tokens=64,
                        hf_gammas=[1], prompt_lookup=2)
    data = report(results, tokenizer, device="cpu", dtype="float32", target="tiny", draft="layers:0",
                  gamma="2", max_new_tokens=8)
    assert set(results[0].runs) == {"ar", "spec", "hf_assisted_default", "hf_assisted_const1",
                                    "hf_greedy", "hf_prompt_lookup"}
    overall = data["overall"]
    # greedy speculative decoding reproduces AR, and AR reproduces HF greedy
    assert overall["identical_to_ar"] is True
    for r in results:
        assert r.runs["ar"].tokens == r.runs["hf_greedy"].tokens
    assert set(data["languages"]) == {"python", "rust"}
    assert overall["speedup_vs_ar"] == overall["spec_tokens_per_s"] / overall["ar_tokens_per_s"]
    assert data["assisted_method"] in ("hf_assisted_default", "hf_assisted_const1")
    json.dumps(data)  # the report is plain JSON
    table = format_table(data)
    assert "OVERALL" in table and "python" in table


def test_next_line_quality_scores_each_language(tokenizer):
    from specdec.nextline import next_line_quality

    rows = next_line_quality(SpeculativeDecoder(tiny_llama(seed=3), tokenizer), _cases(), max_new_tokens=6)
    assert set(rows) == {"python", "rust", "OVERALL"}
    assert rows["OVERALL"]["cases"] == 2
    for row in rows.values():
        assert 0 <= row["exact_match"] <= row["similarity"] <= 1  # an exact line has similarity 1
        assert row["tokens_per_s"] > 0


def test_step_costs_report_ratios(tokenizer):
    from specdec.stepcost import step_costs

    row = step_costs(tiny_llama(seed=3), list(range(40)), widths=(1, 3), repeats=3)
    assert row["verify_3_ratio"] == row["target_3_ms"] / row["target_1_ms"]
    assert row["c"] == row["draft_1_ms"] / row["target_1_ms"] > 0
