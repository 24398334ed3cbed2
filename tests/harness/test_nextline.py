"""`specdec nextline`: greedy next-line quality of a target, per language."""

from helpers.tiny_models import tiny_llama

from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.harness.lib.cases import Case
from speccomplete.harness.nextline import next_line_quality


def test_next_line_quality_scores_each_language(tokenizer):
    text = "def f(x):\n    return x + 1\n\nfn main() {\n    let y = 2;\n}\n"
    cases = [Case("py-0", "a.py", text, 1, 4), Case("rs-0", "b.rs", text, 4, 4)]
    rows = next_line_quality(SpeculativeDecoder(tiny_llama(seed=3), tokenizer), cases, max_new_tokens=6)
    assert set(rows) == {"python", "rust", "OVERALL"}
    assert rows["OVERALL"]["cases"] == 2
    for row in rows.values():
        assert 0 <= row["exact_match"] <= row["similarity"] <= 1  # an exact line has similarity 1
        assert row["tokens_per_s"] > 0
