"""`specdec bench --ablations`, `--compare-tree-nodes` and `--compare-workspace`: the rows they build, each
one lever turned off or swapped."""

import argparse
import copy

from helpers.tiny_models import tiny_llama

from speccomplete.decoder.drafts import build_drafter
from speccomplete.decoder.drafts.references import References
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import HeuristicGamma
from speccomplete.decoder.kernels import pack_linear_weights
from speccomplete.decoder.lean_forward import supports
from speccomplete.harness import bench
from speccomplete.harness.bench.contenders import build_contenders


def bench_args(*flags: str) -> argparse.Namespace:
    """`specdec bench`'s arguments as its own parser reads them, on the tiny models' CPU."""
    parser = argparse.ArgumentParser()
    bench.add_parser(parser.add_subparsers())
    return parser.parse_args(["bench", "--cases", "unused.jsonl", "--device", "cpu", "--quantization", "none", *flags])


def test_ablation_rows_each_turn_one_lever(tokenizer):
    """Each row is token-identical to AR under greedy."""
    target = tiny_llama(seed=4, layers=3)
    stock = copy.deepcopy(target)
    args = bench_args(
        "--draft", "ngram+none", "--ablations", "--compare-gammas", "heuristic,cost", "--compare-confidences", "0.3,0.6"
    )
    product, _ = build_drafter(args.draft, target, tokenizer)
    other = {"ngram+auto": build_drafter("ngram+auto", target, tokenizer)}  # 'auto' derives layers 0,1 here
    pack_linear_weights(target, other["ngram+auto"][1])
    decoder = SpeculativeDecoder(target, tokenizer, product, HeuristicGamma())
    contenders, doc = build_contenders(args, target, tokenizer, decoder, other, stock)
    ours = contenders.ours
    assert set(ours) == {
        "ar",
        "spec",
        "spec_draft_ngram+auto",
        "spec_gamma_cost",
        "spec_confidence_0.3",
        "spec_confidence_0.6",
        "ar_unpacked",
        "spec_unpacked",
        "ar_hf_forward",
        "spec_hf_forward",
    }
    assert set(doc) == set(ours)
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


def test_without_ablations_only_the_compared_drafts(tokenizer):
    target = tiny_llama(seed=4)
    args = bench_args("--draft", "ngram+none", "--no-pack")
    product, _ = build_drafter(args.draft, target, tokenizer)
    other = {"ngram+auto": build_drafter("ngram+auto", target, tokenizer)}
    decoder = SpeculativeDecoder(target, tokenizer, product, HeuristicGamma())
    contenders, doc = build_contenders(args, target, tokenizer, decoder, other, None)
    assert set(contenders.ours) == set(doc) == {"ar", "spec", "spec_draft_ngram+auto"}
    assert contenders.ours["spec"] is decoder and contenders.hf_target is None
    assert "plain weights" in doc["spec"]


def test_tree_rows_twin_each_speculative_row(tokenizer):
    """--compare-tree-nodes: each speculative row again with draft trees, on the same drafter and steps, as
    token-identical to AR as its chains."""
    target = tiny_llama(seed=4)
    args = bench_args("--draft", "ngram+none", "--no-pack", "--compare-tree-nodes", "4")
    product, _ = build_drafter(args.draft, target, tokenizer)
    decoder = SpeculativeDecoder(target, tokenizer, product, HeuristicGamma())
    contenders, doc = build_contenders(args, target, tokenizer, decoder, {}, None)
    ours = contenders.ours
    assert set(ours) == set(doc) == {"ar", "spec", "spec_tree4"}
    assert ours["spec_tree4"].tree_nodes == 4 and ours["spec"].tree_nodes == 0
    assert ours["spec_tree4"].drafter is decoder.drafter and ours["spec_tree4"].steps is decoder.steps
    prompt = "abcabdabeabcabdab"
    ar = ours["ar"].generate(prompt, DecodeOptions(max_new_tokens=12)).token_ids
    assert ours["spec_tree4"].generate(prompt, DecodeOptions(max_new_tokens=12)).token_ids == ar


def test_workspace_rows_twin_each_speculative_row(tokenizer):
    """--compare-workspace: each speculative row again, its lookup also copying from the case's workspace; the
    AR row is left alone, and the twin is as token-identical to AR as the row it twins."""
    target = tiny_llama(seed=4)
    args = bench_args("--draft", "ngram+none", "--no-pack", "--compare-workspace", "2")
    product, _ = build_drafter(args.draft, target, tokenizer)
    decoder = SpeculativeDecoder(target, tokenizer, product, HeuristicGamma())
    contenders, doc = build_contenders(args, target, tokenizer, decoder, {}, None)
    ours = contenders.ours
    assert set(ours) == set(doc) == {"ar", "spec", "spec_workspace"}
    assert contenders.referring == {"spec_workspace"} and contenders.workspace_ngram == 2
    prompt = "abcabdabeabcabdab"
    ar = ours["ar"].generate(prompt, DecodeOptions(max_new_tokens=12)).token_ids
    references = References([decoder.encode(prompt + "xyzxyz")], max_tokens=1000, min_ngram=2, max_ngram=4)
    twin = ours["spec_workspace"].generate(prompt, DecodeOptions(max_new_tokens=12, references=references))
    assert twin.token_ids == ar
