"""Token healing (decoder/healing.py): the prompt's last token is taken back and the first generated token
must start with its text. A tokenizer with a few merged tokens (` *`, ` x`, ...) stands in for Gemma's, where
a prompt ending in a lone ` ` cuts what training text wrote as one token.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from helpers.decoding import random_prompts
from helpers.tiny_models import tiny_llama
from helpers.tokenizers import make_byte_tokenizer
from scipy import stats

from speccomplete.decoder import healing
from speccomplete.decoder.drafts import ModelDrafter, NgramDrafter
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.healing import allowed_first, heal, token_strings, token_text
from speccomplete.decoder.sampling import SamplingParams, probabilities

# 8 tokens that join a space to text, ids 256..263, and two of whitespace alone, which healing never chooses
SPACE_MERGES = tuple((" ", c) for c in "*xyzabcd") + ((" ", " "), ("\n", "\n"))


@pytest.fixture(scope="module")
def merged():
    return make_byte_tokenizer(merges=SPACE_MERGES)


@pytest.fixture(scope="module")
def merged_target(merged):
    return tiny_llama(seed=3, vocab=len(merged), init=0.3, bos=merged.bos_token_id, eos=merged.eos_token_id)


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_heal_takes_back_the_last_token_and_its_text(merged):
    ids = ids_of(merged, "a\n ")
    assert heal(merged, ids) == (ids[:-1], " ")
    assert heal(merged, ids_of(merged, "x = ")) == (ids_of(merged, "x ="), " ")


def test_nothing_to_heal(merged):
    assert heal(merged, [97]) == ([97], "")  # a one-token prompt keeps its token
    for whole in ("a = x", "a\n", "a\n  "):  # no token continues ` x`; `\n\n` and `   ` only add whitespace
        assert heal(merged, ids_of(merged, whole)) == (ids_of(merged, whole), ""), whole
    ends_special = ids_of(merged, "a ") + [merged.eos_token_id]  # e.g. a FIM prompt's <fim_middle>
    assert heal(merged, ends_special) == (ends_special, "")
    partial = list("é".encode())  # the first byte of a two-byte character is not text on its own
    assert heal(merged, [97, partial[0]]) == ([97, partial[0]], "")


def test_allowed_first_tokens_start_with_the_healed_text(merged):
    texts, _ = token_strings(merged)
    assert texts == sorted(texts) and "<s>" not in texts and "</s>" not in texts
    allowed = allowed_first(merged, " ", len(merged) + 4, torch.device("cpu"))  # a head wider than the vocabulary
    assert allowed.shape == (len(merged) + 4,)
    want = {32} | {ids_of(merged, " " + c)[0] for c in "*xyzabcd"}  # not "  ": the cursor's whitespace stays
    assert set(torch.nonzero(allowed).flatten().tolist()) == want
    assert set(torch.nonzero(allowed_first(merged, " x", len(merged), torch.device("cpu"))).flatten().tolist()) == {
        ids_of(merged, " x")[0]
    }


def test_the_table_is_kept_in_the_model_cache_and_read_back(merged, tmp_path, monkeypatch, caplog):
    """A tokenizer read from a folder has its table built once (each token's text as its decoder makes it), and
    read from the model cache after; a table that cannot be read is built again."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    merged.save_pretrained(tmp_path / "tokenizer")
    from transformers import AutoTokenizer

    def load():
        healing._token_strings.cache_clear()
        return AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"))

    built = load()
    texts, ids = token_strings(built)
    backend = built.backend_tokenizer  # each token through the decoder alone, as token_texts' one call gives them
    assert texts == [backend.decoder.decode([backend.id_to_token(i)]) for i in ids.tolist()]
    assert texts == sorted(texts) and texts == [token_text(built, i) for i in ids.tolist()]
    kept = list((tmp_path / "cache" / "healing").iterdir())
    assert len(kept) == 1

    def never(tokenizer):
        raise AssertionError("built again")

    with monkeypatch.context() as patched:
        patched.setattr(healing, "_sorted_texts", never)
        read_texts, read_ids = token_strings(load())
    assert read_texts == texts and torch.equal(read_ids, ids)
    kept[0].write_text('{"texts": ["a"]')
    with caplog.at_level(logging.WARNING):
        again_texts, again_ids = token_strings(load())
    assert "unreadable" in caplog.text and again_texts == texts and torch.equal(again_ids, ids)
    assert token_strings(merged)[0] == texts  # a tokenizer made in memory: built, not kept
    assert len(list((tmp_path / "cache" / "healing").iterdir())) == 1


def test_with_one_token_a_character_nothing_is_healed(llama, tokenizer):
    """Byte tokens: no token continues the last byte, so taking it back would only bring it back."""
    decoder = SpeculativeDecoder(llama, tokenizer, NgramDrafter(), FixedGamma(3))
    for prompt in random_prompts(8, seed=5):
        plain = decoder.generate(prompt, DecodeOptions(max_new_tokens=9))
        healed = decoder.generate(prompt, DecodeOptions(max_new_tokens=9, heal=True))
        assert healed.healed == "" and (healed.token_ids, healed.text) == (plain.token_ids, plain.text)


def test_healed_greedy_speculation_is_the_targets_healed_greedy(merged, merged_target):
    """The mask is on the first token's row in the verify as in plain decoding: token-identical, through
    drafts that start with a disallowed token and drafts that do not."""
    ar = SpeculativeDecoder(merged_target, merged)
    draft = tiny_llama(seed=4, vocab=len(merged), init=0.3)
    spec = SpeculativeDecoder(merged_target, merged, ModelDrafter(draft), FixedGamma(3))
    rng = np.random.default_rng(0)
    words = ["a", "x", "*", "b", "=", "\n", "yz", "(c)"]
    prompts = ["".join(rng.choice(words, size=8)) + " " for _ in range(12)] + ["def f(x):\n  return", "a\n * b\n "]
    for prompt in prompts:
        want = ar.generate(prompt, DecodeOptions(max_new_tokens=8, heal=True))
        got = spec.generate(prompt, DecodeOptions(max_new_tokens=8, heal=True))
        assert got.token_ids == want.token_ids and got.text == want.text, prompt
        assert want.healed == heal(merged, ids_of(merged, prompt))[1] == got.healed
        assert merged.decode(want.token_ids[:1]).startswith(want.healed)
        assert merged.decode(want.token_ids, skip_special_tokens=True) == want.healed + want.text
    assert sum(bool(ar.generate(p, DecodeOptions(max_new_tokens=1, heal=True)).healed) for p in prompts) == 13


def test_healed_sampling_draws_the_first_token_from_the_masked_target(merged, merged_target):
    """Lossless under the mask: the first token of speculative sampling, through an independent draft whose
    proposals are mostly outside the allowed set, follows the target's distribution over the allowed tokens."""
    params = SamplingParams(temperature=1.0)
    prompt = "a = b\n "
    draft = tiny_llama(seed=5, vocab=len(merged), init=0.5)
    spec = SpeculativeDecoder(merged_target, merged, ModelDrafter(draft), FixedGamma(2))
    allowed = allowed_first(merged, " ", len(merged), torch.device("cpu"))
    with torch.inference_mode():
        x = torch.tensor([ids_of(merged, prompt)[:-1]], device=merged_target.device)
        logits = merged_target(input_ids=x, use_cache=False).logits[0, -1:].cpu()
    p = probabilities(logits.masked_fill(~allowed, float("-inf")), params)[0].double().numpy()
    cells = np.flatnonzero(allowed.numpy())
    counts = dict.fromkeys(cells.tolist(), 0)
    n = 800
    for seed in range(n):
        g = spec.generate(prompt, DecodeOptions(max_new_tokens=3, sampling=params, seed=seed, heal=True))
        counts[g.token_ids[0]] += 1  # a KeyError here: a first token outside the allowed set
    assert spec.generate(prompt, DecodeOptions(max_new_tokens=3, sampling=params, seed=0, heal=True)).healed == " "
    observed = np.array([counts[c] for c in cells])
    expected = p[cells] / p[cells].sum() * n
    assert stats.chisquare(observed, expected).pvalue > 1e-3
