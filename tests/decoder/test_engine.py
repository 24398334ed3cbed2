"""The decoding loop: cache rollback, stop conditions, streaming, cancellation and statistics."""

from __future__ import annotations

import json
import threading

import pytest
import torch
from helpers.decoding import check_stats, generate, random_prompts
from helpers.tokenizers import EOS, byte_ids
from transformers import DynamicCache

import speccomplete.decoder.target_steps as target_steps
from speccomplete.decoder.drafts import ModelDrafter, NgramDrafter, derive_draft
from speccomplete.decoder.drafts.base import Drafter, Proposal
from speccomplete.decoder.engine import SpeculativeDecoder, context_window, eos_ids
from speccomplete.decoder.gamma import FixedGamma, HeuristicGamma
from speccomplete.decoder.kv_cache import forward_logits
from speccomplete.decoder.sampling import SamplingParams
from speccomplete.decoder.stats import GenerationStats
from speccomplete.decoder.text import REPLACEMENT, TextStream

PROMPTS = random_prompts(12, seed=7)


# ----------------------------------------------------------------------------- cache rollback


def assert_cache_is_fresh_prefill(model, cache, tokens):
    """`cache` must hold exactly what a fresh prefill of `tokens` computes, in every layer."""
    fresh = DynamicCache()
    forward_logits(model, fresh, tokens, keep=1)
    assert cache.get_seq_length() == len(tokens)
    assert len(cache.layers) == len(fresh.layers)
    for i, (got, want) in enumerate(zip(cache.layers, fresh.layers)):
        assert got.is_initialized == want.is_initialized, i
        if want.is_initialized:
            assert got.keys.shape == want.keys.shape, i
            assert torch.allclose(got.keys, want.keys, atol=1e-5), i
            assert torch.allclose(got.values, want.values, atol=1e-5), i


def run_spying(decoder, prompt, monkeypatch, **options):
    """Generate while capturing the target's cache and every round's committed tokens."""
    caches, rounds = [], []
    original_new_cache, original_round = target_steps.new_cache, decoder._round

    def recording_new_cache():
        caches.append(original_new_cache())
        return caches[-1]

    def recording_round(*args, **kwargs):
        out = original_round(*args, **kwargs)
        rounds.append(list(out[0]))  # (tokens, their log-probabilities)
        return out

    with monkeypatch.context() as patch:
        patch.setattr(target_steps, "new_cache", recording_new_cache)
        patch.setattr(decoder, "_round", recording_round)
        gen = generate(decoder, prompt, **options)
    assert len(caches) == 1
    committed = decoder.encode(prompt) + [t for r in rounds for t in r]
    return gen, caches[0], committed


@pytest.mark.parametrize("which", ["llama-derived", "llama-skip", "llama-independent", "gemma3-derived"])
@pytest.mark.parametrize("sampled", [False, True])
def test_caches_after_rejections_equal_a_fresh_prefill(which, sampled, request, tokenizer, monkeypatch):
    name, kind = which.split("-")
    model = request.getfixturevalue(name)
    draft_model = {
        "derived": lambda: derive_draft(model, [0]),
        "skip": lambda: derive_draft(model, [0, 2]),
        "independent": lambda: request.getfixturevalue("llama_other"),
    }[kind]()
    drafter = ModelDrafter(draft_model)
    decoder = SpeculativeDecoder(model, tokenizer, drafter, FixedGamma(4))
    sampling = SamplingParams(temperature=1.0) if sampled else SamplingParams()
    rejections = 0
    for i, prompt in enumerate(PROMPTS[:4]):
        gen, cache, committed = run_spying(decoder, prompt, monkeypatch, max_new_tokens=14, sampling=sampling, seed=i)
        rejections += gen.stats.rejected_rounds
        # invariant: the target cache holds every committed token but the last
        assert_cache_is_fresh_prefill(model, cache, committed[:-1])
        # the draft's cache holds a prefix of the committed tokens, nothing it drafted and lost
        held = drafter.cache.get_seq_length()
        assert held <= len(committed) - 1
        assert_cache_is_fresh_prefill(draft_model, drafter.cache, committed[:held])
        assert gen.token_ids == committed[len(decoder.encode(prompt)) :][: len(gen.token_ids)]
    assert rejections > 0


@pytest.mark.parametrize("sampled", [False, True])
def test_logprobs_are_the_targets_own_for_each_committed_token(llama, tokenizer, sampled):
    """Generation.logprobs (the confidence gate's evidence): whatever the drafts did, each token's is what a
    fresh forward pass of the target over the whole sequence gives it, under the raw logits."""
    decoder = SpeculativeDecoder(llama, tokenizer, ModelDrafter(derive_draft(llama, [0])), FixedGamma(4))
    sampling = SamplingParams(temperature=1.0) if sampled else SamplingParams()
    rejected = 0
    for i, prompt in enumerate(PROMPTS[:4]):
        gen = generate(decoder, prompt, max_new_tokens=14, sampling=sampling, seed=i)
        rejected += gen.stats.rejected_rounds
        ids = decoder.encode(prompt)
        sequence = torch.tensor([ids + gen.token_ids])
        with torch.no_grad():
            logits = llama(sequence).logits[0, len(ids) - 1 : -1].double()
        want = logits.log_softmax(-1).gather(-1, torch.tensor(gen.token_ids).view(-1, 1)).squeeze(-1)
        assert len(gen.logprobs) == len(gen.token_ids)
        assert torch.allclose(torch.tensor(gen.logprobs, dtype=torch.double), want, atol=1e-4)
    assert rejected > 0, "the rows after a rejection were checked too"


def test_model_drafter_propose_rollback_propose(llama, tokenizer):
    draft_model = derive_draft(llama, [0, 1])
    prompt = tokenizer("def f(x):")["input_ids"]
    greedy = SamplingParams()
    drafter = ModelDrafter(draft_model)
    drafter.reset(prompt)
    assert_cache_is_fresh_prefill(draft_model, drafter.cache, prompt[:-1])
    first = drafter.propose(prompt, 5, greedy, None)
    assert len(first.tokens) == 5 and first.q is None  # greedy drafts carry no q
    assert drafter.cache.get_seq_length() == len(prompt) + 4  # the last draft is not fed yet

    # the target accepted two drafts and chose its own third token
    drafter.rollback(len(prompt) + 2)
    assert_cache_is_fresh_prefill(draft_model, drafter.cache, prompt + first.tokens[:2])
    committed = prompt + first.tokens[:2] + [(first.tokens[2] + 1) % 256]
    again = drafter.propose(committed, 3, greedy, None)
    fresh = ModelDrafter(draft_model)
    fresh.reset(committed)
    assert again.tokens == fresh.propose(committed, 3, greedy, None).tokens
    assert_cache_is_fresh_prefill(draft_model, drafter.cache, committed + again.tokens[:2])

    # a rollback past the end is a no-op; proposing for a shorter history crops the cache itself
    drafter.rollback(10_000)
    assert drafter.cache.get_seq_length() == len(committed) + 2
    replay = drafter.propose(prompt, 5, greedy, None)
    assert replay.tokens == first.tokens


def test_model_drafter_sampled_q_matches_fresh(llama, tokenizer):
    draft_model = derive_draft(llama, [0])
    prompt = tokenizer("abc abc")["input_ids"]
    params = SamplingParams(temperature=0.9, top_k=20)
    used = ModelDrafter(draft_model)
    used.reset(prompt)
    used.propose(prompt, 4, params, torch.Generator(llama.device).manual_seed(0))
    used.rollback(len(prompt))
    fresh = ModelDrafter(draft_model)
    fresh.reset(prompt)
    a = used.propose(prompt, 3, params, torch.Generator(llama.device).manual_seed(5))
    b = fresh.propose(prompt, 3, params, torch.Generator(llama.device).manual_seed(5))
    assert a.tokens == b.tokens
    assert a.q.shape == (3, llama.config.vocab_size)
    assert torch.allclose(a.q, b.q, atol=1e-6)
    assert torch.allclose(a.q.sum(-1), torch.ones(3, device=a.q.device))
    assert ((a.q > 0).sum(-1) <= 20).all()  # the same top-k as the target's


def test_two_consecutive_generations_are_identical(llama, llama_other, tokenizer):
    greedy = SpeculativeDecoder(llama, tokenizer, ModelDrafter(derive_draft(llama, [0])), HeuristicGamma())
    for p in PROMPTS[:4]:
        a, b = generate(greedy, p, max_new_tokens=16), generate(greedy, p, max_new_tokens=16)
        assert (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)
    sampled = SpeculativeDecoder(llama, tokenizer, ModelDrafter(llama_other), FixedGamma(3))
    for i, p in enumerate(PROMPTS[:4]):
        opts = dict(max_new_tokens=16, sampling=SamplingParams(temperature=1.0), seed=i)
        a, b = generate(sampled, p, **opts), generate(sampled, p, **opts)
        assert (a.token_ids, a.text) == (b.token_ids, b.text)


# ----------------------------------------------------------------------------- stop conditions


@pytest.fixture(scope="module")
def ar_outputs(llama, tokenizer):
    ar = SpeculativeDecoder(llama, tokenizer)
    return {p: generate(ar, p, max_new_tokens=24) for p in PROMPTS}


def _decoders(llama, tokenizer):
    return {
        "ar": SpeculativeDecoder(llama, tokenizer),
        "derived": SpeculativeDecoder(llama, tokenizer, ModelDrafter(derive_draft(llama, [0])), FixedGamma(4)),
        "ngram": SpeculativeDecoder(llama, tokenizer, NgramDrafter(), HeuristicGamma()),
    }


def test_max_tokens_finishes_with_length(llama, tokenizer):
    for name, dec in _decoders(llama, tokenizer).items():
        for n in (1, 2, 7):
            g = generate(dec, "x = 1", max_new_tokens=n)
            assert g.finish_reason == "length" and len(g.token_ids) == n, name
            assert g.text == tokenizer.decode(g.token_ids)


def test_eos_finishes_with_eos(llama, tokenizer, ar_outputs, monkeypatch):
    prompt, full = next((p, g) for p, g in ar_outputs.items() if g.token_ids[5] not in g.token_ids[:5])
    stop_token = full.token_ids[5]
    monkeypatch.setattr(llama.generation_config, "eos_token_id", [EOS, stop_token])
    for name, dec in _decoders(llama, tokenizer).items():
        assert stop_token in dec.eos
        g = generate(dec, prompt, max_new_tokens=24)
        assert g.finish_reason == "eos", name
        assert g.token_ids == full.token_ids[:5], name  # the EOS token itself is not part of the output
        assert g.text == tokenizer.decode(full.token_ids[:5])


def test_eos_ids_come_from_tokenizer_and_generation_config(llama, tokenizer, monkeypatch):
    assert eos_ids(llama, tokenizer) == {EOS}
    monkeypatch.setattr(llama.generation_config, "eos_token_id", [3, 4])
    assert eos_ids(llama, tokenizer) == {EOS, 3, 4}
    monkeypatch.setattr(llama.generation_config, "eos_token_id", 9)
    assert eos_ids(llama, tokenizer) == {EOS, 9}
    monkeypatch.setattr(llama.generation_config, "eos_token_id", None)
    assert eos_ids(llama, tokenizer) == {EOS}


def _stop_candidate(ar_outputs):
    """A 2-character ASCII stop string that first occurs strictly inside some AR output."""
    for prompt, g in ar_outputs.items():
        text = g.text
        for i in range(1, len(text) - 2):
            s = text[i : i + 2]
            if all(32 < ord(c) < 127 for c in s) and text.find(s) == i:
                return prompt, g, s
    raise AssertionError("no usable stop string in the reference outputs")


def test_stop_string_cuts_text_and_never_streams_it(llama, tokenizer, ar_outputs):
    prompt, full, stop = _stop_candidate(ar_outputs)
    want = full.text[: full.text.find(stop)]
    for name, dec in _decoders(llama, tokenizer).items():
        chunks = []
        g = generate(dec, prompt, max_new_tokens=24, stop_strings=(stop,), on_text=chunks.append)
        assert g.finish_reason == "stop", name
        assert g.text == want, name
        assert "".join(chunks) == want, name
        assert all(stop not in c for c in chunks)
        # the tokens up to the stop are the model's own, and generation stopped soon after
        assert g.token_ids == full.token_ids[: len(g.token_ids)]
        assert len(g.token_ids) < 24


def test_stop_string_prefix_is_held_back_then_released(llama, tokenizer, ar_outputs):
    """A stop string whose start appears but which never completes must not lose any text."""
    prompt, full, stop = _stop_candidate(ar_outputs)
    never = stop + "\x00never"
    for name, dec in _decoders(llama, tokenizer).items():
        chunks = []
        g = generate(dec, prompt, max_new_tokens=24, stop_strings=(never, ""), on_text=chunks.append)
        assert g.finish_reason == "length", name
        assert g.text == full.text and "".join(chunks) == full.text, name


def test_stop_when_predicate(llama, tokenizer, ar_outputs):
    prompt, full = next((p, g) for p, g in ar_outputs.items() if len(g.text) > 8)
    seen = []

    def long_enough(text):
        seen.append(text)
        return len(text) >= 4

    ar = SpeculativeDecoder(llama, tokenizer)
    g = generate(ar, prompt, max_new_tokens=24, stop_when=long_enough)
    assert g.finish_reason == "predicate"
    assert len(g.text) >= 4 and len(tokenizer.decode(g.token_ids[:-1])) < 4  # stopped at the first chance
    assert g.token_ids == full.token_ids[: len(g.token_ids)]
    assert all(len(t) < 4 for t in seen[:-1])
    for name, dec in _decoders(llama, tokenizer).items():
        g = generate(dec, prompt, max_new_tokens=24, stop_when=lambda t: len(t) >= 4)
        assert g.finish_reason == "predicate" and len(g.text) >= 4, name
        assert g.token_ids == full.token_ids[: len(g.token_ids)]
        assert len(g.token_ids) < 24


class _Oracle(Drafter):
    """Proposes the target's own greedy continuation, 8 tokens a round, as a lookup would copy it."""

    lookup_tokens = 8

    def __init__(self, continuation: list[int]):
        self.continuation = continuation
        self.prompt_tokens = 0

    def reset(self, prompt, reused=0):
        self.prompt_tokens = len(prompt)

    def propose(self, committed, gamma, params, generator, min_confidence=0.0):
        done = len(committed) - self.prompt_tokens
        return Proposal(self.continuation[done : done + self.lookup_tokens], None, lookup=True)

    def rollback(self, valid):
        pass


def test_drafts_past_a_stop_string_are_not_verified(llama, tokenizer, ar_outputs):
    """A draft whose text holds a stop string ends the round's proposal: the generation stops there."""
    prompt, full = next((p, g) for p, g in ar_outputs.items() if any(32 < b < 127 for b in g.token_ids[1:6]))
    at = next(i for i in range(1, 6) if 32 < full.token_ids[i] < 127)  # a one-byte token: its text is one character
    stop = tokenizer.decode([full.token_ids[at]])
    at = full.token_ids.index(full.token_ids[at])  # its first occurrence
    spec = SpeculativeDecoder(llama, tokenizer, _Oracle(full.token_ids), FixedGamma(4))
    g = generate(spec, prompt, max_new_tokens=24, stop_strings=(stop,))
    assert g.finish_reason == "stop"
    assert g.text == full.text[: full.text.find(stop)]
    assert g.stats.drafted == at + 1  # the copy was cut after the stop's token; all of it was accepted
    assert g.token_ids == full.token_ids[: at + 2]  # the stop's token and the target's one after it
    unstopped = generate(spec, prompt, max_new_tokens=24)
    assert unstopped.token_ids == full.token_ids and unstopped.stats.drafted > at + 1


def test_stop_string_wins_over_length_in_the_same_round(llama, tokenizer, ar_outputs):
    prompt, full, stop = _stop_candidate(ar_outputs)
    # allow exactly the tokens that complete the stop string: both conditions hit at once
    n = next(k for k in range(1, 25) if stop in tokenizer.decode(full.token_ids[:k]))
    g = generate(SpeculativeDecoder(llama, tokenizer), prompt, max_new_tokens=n, stop_strings=(stop,))
    assert g.finish_reason == "stop" and g.text == full.text[: full.text.find(stop)]


def test_cancel_from_on_text(llama, tokenizer, ar_outputs):
    prompt, full = next((p, g) for p, g in ar_outputs.items() if len(g.text) > 8)
    for name, dec in _decoders(llama, tokenizer).items():
        cancel = threading.Event()
        chunks = []

        def on_text(chunk):
            chunks.append(chunk)
            cancel.set()

        g = generate(dec, prompt, max_new_tokens=24, cancel=cancel, on_text=on_text)
        assert g.finish_reason == "cancelled", name
        assert 0 < len(g.token_ids) < 24
        assert g.token_ids == full.token_ids[: len(g.token_ids)]
        assert "".join(chunks) == g.text


def test_cancel_before_start(llama, tokenizer):
    cancel = threading.Event()
    cancel.set()
    g = generate(SpeculativeDecoder(llama, tokenizer), "hello", max_new_tokens=10, cancel=cancel)
    assert g.finish_reason == "cancelled" and g.token_ids == [] and g.text == ""
    assert g.stats.rounds == 0


def test_cancel_from_another_thread(llama, tokenizer):
    cancel = threading.Event()
    chunks = []
    first_text = threading.Event()
    release = threading.Event()

    def on_text(chunk):
        chunks.append(chunk)
        first_text.set()
        release.wait(5)  # hold the decoder until the other thread has cancelled

    def canceller():
        first_text.wait(5)
        cancel.set()
        release.set()

    t = threading.Thread(target=canceller)
    t.start()
    g = generate(SpeculativeDecoder(llama, tokenizer), "def f(", max_new_tokens=40, cancel=cancel, on_text=on_text)
    t.join()
    assert g.finish_reason == "cancelled" and len(g.token_ids) < 40


# ----------------------------------------------------------------------------- streaming


def test_streamed_chunks_concatenate_to_text(llama, llama_other, tokenizer):
    decoders = _decoders(llama, tokenizer) | {
        "independent": SpeculativeDecoder(llama, tokenizer, ModelDrafter(llama_other), FixedGamma(3))
    }
    for name, dec in decoders.items():
        for i, p in enumerate(PROMPTS[:8]):
            for sampling in (SamplingParams(), SamplingParams(temperature=1.0)):
                chunks = []
                g = generate(dec, p, max_new_tokens=20, sampling=sampling, seed=i, on_text=chunks.append)
                assert "".join(chunks) == g.text, (name, p)
                assert all(chunks), "empty chunks are not sent"
                assert g.text == tokenizer.decode(g.token_ids, skip_special_tokens=True)


MULTI = "héllo 世界 🙂 ok"


def _feed(stream, ids, step=1):
    chunks = []
    for i in range(step, len(ids) + step, step):
        chunks.append(stream.update(ids[:i]))
    chunks.append(stream.finish())
    return [c for c in chunks if c]


@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("prompt", ["", "x", "日本"])
def test_text_stream_multibyte(tokenizer, step, prompt):
    ids = byte_ids(MULTI)
    assert len(ids) > len(MULTI)  # really multi-byte
    stream = TextStream(tokenizer, byte_ids(prompt))
    chunks = _feed(stream, ids, step)
    assert "".join(chunks) == MULTI
    assert all(REPLACEMENT not in c for c in chunks)
    assert stream.text == MULTI


def test_text_stream_keeps_real_replacement_characters(tokenizer):
    """Invalid bytes decode to U+FFFD for good; they are held only until the text moves on."""
    ids = byte_ids("ab") + [0xFF] + byte_ids("cd")
    stream = TextStream(tokenizer, [])
    chunks = _feed(stream, ids)
    assert "".join(chunks) == tokenizer.decode(ids) == "ab" + REPLACEMENT + "cd"


def test_text_stream_holds_back_a_possible_stop_string(tokenizer):
    stream = TextStream(tokenizer, [], ("END",))
    ids = byte_ids("abcENxyz")
    out = [stream.update(ids[: i + 1]) for i in range(len(ids))]
    assert out[:3] == ["a", "b", "c"]
    assert out[3] == "" and out[4] == ""  # "E", "EN" might start "END"
    assert out[5] == "ENx"  # released once it cannot
    assert "".join(out) + stream.finish() == "abcENxyz"
    assert not stream.stopped


def test_text_stream_stops_and_cuts(tokenizer):
    stream = TextStream(tokenizer, [], ("END", "\n\n"))
    ids = byte_ids("abcEND more\n\n")
    chunks = []
    for i in range(len(ids)):
        chunks.append(stream.update(ids[: i + 1]))
        if stream.stopped:
            break
    chunks.append(stream.finish())
    assert stream.stopped and stream.text == "abc" and "".join(chunks) == "abc"
    assert i == len("abcEND") - 1

    # the earliest of several stop strings wins, even when they complete in one update
    stream = TextStream(tokenizer, [], ("END", "\n\n"))
    assert stream.update(byte_ids("ab\n\ncdEND")) == "ab" and stream.stopped and stream.text == "ab"
    stream = TextStream(tokenizer, [], ("END",))
    assert stream.update(byte_ids("ENDabc")) == "" and stream.stopped and stream.finish() == ""


def test_text_stream_multibyte_stop_string(tokenizer):
    stream = TextStream(tokenizer, [], ("世界",))
    chunks = []
    ids = byte_ids(MULTI)
    for i in range(len(ids)):
        chunks.append(stream.update(ids[: i + 1]))
        if stream.stopped:
            break
    chunks.append(stream.finish())
    assert stream.stopped and "".join(chunks) == "héllo "
    assert all("世" not in c and REPLACEMENT not in c for c in chunks)


def test_generation_streams_multibyte_text(llama, tokenizer, monkeypatch):
    """End to end: a model whose greedy output is a multi-byte string, streamed through the engine."""
    target = byte_ids(MULTI)
    original = llama.forward

    def scripted(*args, **kwargs):  # steer the logits so the model spells out MULTI byte by byte
        out = original(*args, **kwargs)
        cache = kwargs["past_key_values"]
        end = cache.get_seq_length()  # positions end-k .. end-1 were just computed
        k = out.logits.shape[1]
        bias = torch.zeros_like(out.logits)
        for j in range(k):
            produced = end - k + j + 1 - scripted.prompt_len  # index of the token this row predicts
            if 0 <= produced < len(target):
                bias[0, j, target[produced]] = 1e4
        out.logits = out.logits + bias
        return out

    scripted.prompt_len = 1
    monkeypatch.setitem(llama.__dict__, "forward", scripted)  # an instance attribute, removed afterwards
    for dec in (
        SpeculativeDecoder(llama, tokenizer),
        SpeculativeDecoder(llama, tokenizer, ModelDrafter(derive_draft(llama, [0])), FixedGamma(3)),
    ):
        chunks = []
        g = generate(dec, [byte_ids("#")[0]], max_new_tokens=len(target), on_text=chunks.append)
        assert g.token_ids == target
        assert g.text == MULTI and "".join(chunks) == MULTI
        assert all(REPLACEMENT not in c for c in chunks)


# ----------------------------------------------------------------------------- statistics


def test_stats_alpha_and_record_round():
    s = GenerationStats()
    assert s.alpha is None and s.mean_accepted is None and s.tokens_per_s == 0.0
    for drafted, accepted in [(4, 4), (4, 1), (0, 0), (3, 0), (2, 2)]:
        s.record_round(drafted, accepted)
    assert s.rounds == 5 and s.gammas == [4, 4, 0, 3, 2]
    assert s.drafted == 13 and s.accepted == 7 and s.rejected_rounds == 2
    assert s.accepted_histogram == [1, 1, 1, 0, 1]
    assert s.alpha == pytest.approx(7 / (7 + 2))
    assert s.mean_accepted == pytest.approx(7 / 4)


def test_model_alpha_leaves_lookup_copies_out():
    s = GenerationStats()
    for drafted, accepted, lookup in [(6, 6, True), (5, 2, True), (3, 1, False), (2, 2, False), (4, 0, False)]:
        s.record_round(drafted, accepted, lookup)
    assert s.lookup_rejected_rounds == 1 and s.rejected_rounds == 3
    assert s.model_alpha == pytest.approx(3 / (3 + 2))  # the model's 3 accepted, its 2 rejecting rounds
    assert s.alpha == pytest.approx(11 / (11 + 3))
    assert s.to_dict()["model_alpha"] == s.model_alpha


def test_stats_from_a_real_generation(llama, tokenizer):
    dec = SpeculativeDecoder(llama, tokenizer, ModelDrafter(derive_draft(llama, [0])), FixedGamma(4))
    g = generate(dec, PROMPTS[0], max_new_tokens=20)
    s = g.stats
    assert s.drafted > 0 and s.rejected_rounds > 0
    assert s.alpha == pytest.approx(s.accepted / (s.accepted + s.rejected_rounds))
    assert s.total_ms > 0 and s.verify_ms > 0 and s.draft_ms > 0 and 0 < s.ttft_ms <= s.total_ms
    d = s.to_dict()
    back = json.loads(json.dumps(d))
    assert back["alpha"] == pytest.approx(s.alpha)
    assert back["new_tokens"] == 20 and back["finish_reason"] == "length"
    assert back["accepted_histogram"] == s.accepted_histogram and back["gammas"] == s.gammas
    assert {"mean_accepted", "tokens_per_s", "prompt_tokens", "prompt_truncated_tokens"} <= set(back)
    # plain AR: nothing drafted, alpha is null in JSON
    ar = generate(SpeculativeDecoder(llama, tokenizer), PROMPTS[0], max_new_tokens=5)
    assert json.loads(json.dumps(ar.stats.to_dict()))["alpha"] is None


def test_context_window_names(llama, gpt2):
    assert context_window(llama.config) == llama.config.max_position_embeddings
    assert context_window(gpt2.config) == gpt2.config.n_positions

    class NoWindow:
        pass

    assert context_window(NoWindow()) is None


def test_generate_accepts_token_ids(llama, tokenizer):
    dec = SpeculativeDecoder(llama, tokenizer)
    a = generate(dec, "def f(x):", max_new_tokens=8)
    b = generate(dec, tokenizer("def f(x):")["input_ids"], max_new_tokens=8)
    assert a.token_ids == b.token_ids and a.text == b.text
    check_stats(b)


# ----------------------------------------------------------------------------- γ policies


def test_fixed_gamma():
    g = FixedGamma(3)
    for drafted, accepted in [(3, 0), (3, 3), (0, 0)]:
        assert g.next_gamma() == 3
        g.update(3, drafted, accepted)
    assert g.max_gamma == 3 and repr(g) == "fixed(3)"


def test_heuristic_gamma_schedule():
    g = HeuristicGamma(start=2, max_gamma=5, first_probe_after=2, max_probe_after=8)
    seq = []
    for drafted, accepted in [(2, 2), (4, 4), (5, 5), (5, 1), (4, 0), (3, 0), (2, 1), (1, 0)]:
        gamma = g.next_gamma()
        seq.append(gamma)
        assert drafted <= gamma
        g.update(gamma, drafted, accepted)
    assert seq == [2, 4, 5, 5, 4, 3, 2, 1]  # +2 after a full round (capped at max), -1 otherwise
    assert g.gamma == 0

    def run_at_zero(rounds):
        out = []
        for _ in range(rounds):
            gamma = g.next_gamma()
            out.append(gamma)
            if gamma == 0:
                g.update(0, 0, 0)
            else:
                return out
        return out

    assert run_at_zero(10) == [0, 0, 1]  # probe after first_probe_after rounds at 0
    g.update(1, 1, 0)  # failed probe: back off
    assert run_at_zero(10) == [0, 0, 0, 0, 1]
    g.update(1, 0, 0)  # a probe that drafted nothing is no evidence: retried after the same wait
    assert run_at_zero(20) == [0] * 4 + [1]
    g.update(1, 1, 0)
    assert run_at_zero(20) == [0] * 8 + [1]
    g.update(1, 1, 0)
    assert run_at_zero(20) == [0] * 8 + [1]  # capped at max_probe_after
    g.update(1, 1, 1)  # successful probe: drafting resumes at γ = 1, the backoff resets
    assert g.next_gamma() == 1 and g.probe_after == 2
    g.update(1, 1, 1)
    assert g.next_gamma() == 3


def test_heuristic_gamma_ignores_rounds_that_drafted_nothing():
    g = HeuristicGamma(start=3, max_gamma=8)
    g.update(3, 0, 0)  # e.g. no n-gram match: neither a success nor a failure
    assert g.next_gamma() == 3
    g.update(3, 2, 1)
    assert g.next_gamma() == 2


def test_decoder_without_drafter_never_drafts(llama, tokenizer):
    dec = SpeculativeDecoder(llama, tokenizer, None, FixedGamma(4))
    g = generate(dec, "abc", max_new_tokens=5)
    assert g.stats.gammas == [0] * 5 and g.stats.drafted == 0


# ------------------------------------------------------------------ cost-model γ and per-group policies


def test_cost_model_gamma_follows_acceptance():
    from speccomplete.decoder.gamma import CostModelGamma

    policy = CostModelGamma(draft_cost=0.1, verify_cost=0.0, max_gamma=16, probe_after=4)
    assert policy.next_gamma() > 0  # the prior (α 0.5) is worth drafting at c = 0.1
    for _ in range(40):  # a draft that is always right: γ* grows to the cap region
        policy.update(policy.next_gamma(), policy.next_gamma(), policy.next_gamma())
    assert policy.alpha > 0.95 and policy.best_gamma() >= 10
    for _ in range(150):  # then always wrong: γ* falls to 0, with a probe every 4 rounds
        g = policy.next_gamma()
        policy.update(g, g, 0)
    assert policy.alpha < 0.1 and policy.best_gamma() == 0
    seen = []
    for _ in range(10):
        g = policy.next_gamma()
        seen.append(g)
        policy.update(g, g, 0)
    assert seen.count(1) >= 1 and seen.count(0) >= 6


def test_cost_model_matches_the_closed_form():
    """docs/speculative-decoding.md: with c = 0.1 and a free verify, α 0.6 -> γ* 3, 0.8 -> γ* 6, 0.9 -> γ* 10."""
    from speccomplete.decoder.gamma import CostModelGamma

    for alpha, want in ((0.6, 3), (0.8, 6), (0.9, 10)):
        policy = CostModelGamma(draft_cost=0.1, verify_cost=0.0, max_gamma=32)
        policy.accepted, policy.rejections = alpha, 1 - alpha
        assert policy.best_gamma() == want


def test_gamma_groups_adapt_separately(llama, tokenizer):
    from speccomplete.decoder.drafts import ModelDrafter, derive_draft
    from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
    from speccomplete.decoder.gamma import HeuristicGamma

    decoder = SpeculativeDecoder(llama, tokenizer, ModelDrafter(derive_draft(llama, [0])), HeuristicGamma(start=3))
    decoder.generate("abc abc abc", DecodeOptions(max_new_tokens=8, gamma_group="python"))
    assert set(decoder.group_gammas) == {"python"}
    assert decoder.gamma.gamma == 3  # the template is untouched; "python" has its own copy
    assert decoder.group_gammas["python"] is not decoder.gamma


def test_hybrid_lookup_span_adapts_to_what_was_accepted():
    from speccomplete.decoder.drafts import HybridDrafter, Proposal
    from speccomplete.decoder.sampling import SamplingParams

    class ModelStub:
        def __init__(self):
            self.calls = []

        def reset(self, prompt, reused=0):
            pass

        def propose(self, committed, gamma, params, generator, min_confidence=0.0, lookup=None):
            self.calls.append(gamma)
            return Proposal([1] * gamma, None)

        def rollback(self, valid):
            pass

    model = ModelStub()
    hybrid = HybridDrafter(model, lookup_tokens=8)
    greedy = SamplingParams()
    context = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 5, 6]  # "5 6" occurred before: copy what followed
    first = hybrid.propose(context, 2, greedy, None)
    assert first.lookup and first.tokens == [7, 8, 9, 10]  # span starts at lookup_tokens // 2
    hybrid.rollback(len(context) + 4)  # all four accepted: the next copy may be longer
    assert hybrid.span == 6
    hybrid.propose(context, 2, greedy, None)
    hybrid.rollback(len(context) + 1)  # one of six accepted: propose two next time
    assert hybrid.span == 2
    fallback = hybrid.propose([1, 2, 3], 3, greedy, None)  # no repeated n-gram: the model drafts γ
    assert not fallback.lookup and fallback.tokens == [1, 1, 1] and model.calls == [3]
    hybrid.span = 8
    hybrid.reset(context)  # a new request starts from the middle span again
    assert hybrid.propose(context, 2, greedy, None).tokens == [7, 8, 9, 10]
