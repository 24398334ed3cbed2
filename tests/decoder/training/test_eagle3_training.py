"""EAGLE-3 training on tiny models: the batched training-time test is what the engine decodes, features
are the target's states, the loss falls, and resuming after a time limit continues exactly."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers.tiny_models import tiny_llama
from helpers.tokenizers import BOS, EOS, make_byte_tokenizer

from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, KVCache, init_from_target
from speccomplete.decoder.kv_cache import forward_tapped, new_cache
from speccomplete.decoder.training.corpus import Document, Shards, build_corpus
from speccomplete.decoder.training.draft import frequent_token_ids
from speccomplete.decoder.training.eagle3 import (
    Eagle3TrainConfig,
    FeatureShards,
    OnlineFeatures,
    dev_fitness,
    extract_features,
    train_eagle3,
    trainable_parameters,
    ttt_forward,
    ttt_loss,
)

TOKENIZER = make_byte_tokenizer()
SOURCES = {
    "python": "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n",
    "rust": 'fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\nfn main() { println!("{}", add(1, 2)); }\n',
}
TAPS = (0, 2, 3)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=4, hidden=32, init=0.2)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    documents = {lang: [Document(lang, text * 3, f"{lang}:{i}") for i in range(8)] for lang, text in SOURCES.items()}
    build_corpus(documents, TOKENIZER, root / "train", {"*": 1024}, seq_len=32, seed=0)
    build_corpus(documents, TOKENIZER, root / "dev", {"*": 128}, seq_len=32, seed=1)
    return root


@pytest.fixture(scope="module")
def features(target, corpus, tmp_path_factory):
    root = tmp_path_factory.mktemp("features")
    extract_features(target, Shards.load(corpus / "train"), root / "train", TAPS, chunk_sequences=16)
    extract_features(target, Shards.load(corpus / "dev"), root / "dev", TAPS)
    return root


def make_draft(target, corpus, heads: int = 4, kv_heads: int = 2, seed: int = 0, taps: tuple[int, ...] = TAPS):
    vocab_ids = frequent_token_ids(Shards.load(corpus / "train").tokens, 64, [BOS, EOS], target.config.vocab_size)
    shape = Eagle3Shape(
        hidden_size=32,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=8,
        intermediate_size=64,
        target_vocab=target.config.vocab_size,
        draft_vocab=len(vocab_ids),
        aux_layers=taps,
    )
    return init_from_target(shape, target, vocab_ids, seed=seed)


def test_ttt_forward_is_what_sequential_decoding_computes(target, corpus):
    """Step s of row i in the batched forward == the engine's cache-based decode: step-0 rows 0..i,
    then s chained single-row steps feeding back the draft's own output state."""
    draft = make_draft(target, corpus)
    with torch.no_grad():  # weights far from init, so attention is far from uniform and a wrong mask shows
        for name, p in trainable_parameters(draft).items():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.3)
    draft.eval()
    gen = torch.Generator().manual_seed(0)
    length, steps = 9, 4
    ids = torch.randint(0, 256, (2, length), generator=gen)
    with torch.no_grad():
        features = torch.stack(
            [forward_tapped(target, new_cache(), row, keep=1, taps=TAPS)[1] for row in ids]
        )  # [2, L, 3h]
        batched = ttt_forward(draft, target.get_input_embeddings().weight, ids, features, steps)
        embed = target.get_input_embeddings().weight
        assert [q.shape[1] for q in batched] == [length - 1 - s for s in range(steps)]
        checked = 0
        for b in range(2):
            for i in range(length - 1):
                cache = KVCache()
                out = draft.step(
                    F.embedding(ids[b, 1 : i + 2], embed),
                    draft.fuse(features[b, : i + 1]),
                    torch.arange(1, i + 2),
                    cache,
                )
                h = out[i : i + 1]
                torch.testing.assert_close(draft.logits(h)[0], batched[0][b, i], atol=1e-5, rtol=1e-5)
                for s in range(1, steps):
                    if i + 1 + s > length - 1:
                        break
                    h = draft.step(
                        F.embedding(ids[b, i + 1 + s : i + 2 + s], embed), h, torch.tensor([i + 1 + s]), cache
                    )
                    torch.testing.assert_close(draft.logits(h)[0], batched[s][b, i], atol=1e-5, rtol=1e-5)
                    checked += 1
        assert checked == 2 * sum(length - 1 - s for s in range(1, steps))
        # a later step is not teacher forcing: it predicts the same token from the draft's own state
        assert not torch.allclose(batched[1][0, 3], batched[0][0, 4], atol=1e-2)


def test_ttt_matches_sequential_without_gqa_and_teacher_applies_the_softcap(target, corpus):
    draft = make_draft(target, corpus, heads=2, kv_heads=2, seed=1)
    ids = torch.randint(0, 256, (1, 6), generator=torch.Generator().manual_seed(1))
    features = torch.randn(1, 6, 3 * 32, generator=torch.Generator().manual_seed(2))
    embed = target.get_input_embeddings().weight
    with torch.no_grad():
        batched = ttt_forward(draft, embed, ids, features, 2)
        cache = KVCache()
        out = draft.step(F.embedding(ids[0, 1:3], embed), draft.fuse(features[0, :2]), torch.arange(1, 3), cache)
        h = draft.step(F.embedding(ids[0, 3:4], embed), out[1:2], torch.tensor([3]), cache)
        torch.testing.assert_close(draft.logits(h)[0], batched[1][0, 1], atol=1e-5, rtol=1e-5)
        final = torch.randn(1, 6, 32, generator=torch.Generator().manual_seed(3)) * 50
        plain, _ = ttt_loss(draft, embed, ids, features, final, steps=2)
        capped, _ = ttt_loss(draft, embed, ids, features, final, steps=2, softcap=1.0)
    assert plain.item() != pytest.approx(capped.item(), rel=1e-3)


def test_features_are_the_targets_hidden_states_and_extraction_resumes(target, corpus, tmp_path):
    shards = Shards.load(corpus / "train")
    out = tmp_path / "f"
    manifest = extract_features(target, shards, out, TAPS, sequences=5, chunk_sequences=2, seed=4)
    assert manifest["sequences"] == 5 and [c["sequences"] for c in manifest["chunks"]] == [2, 2, 1]
    assert manifest["taps"] == list(TAPS) and manifest["hidden_size"] == 32 and manifest["tokens"] == 5 * 32
    loaded = FeatureShards(out)
    assert len(loaded) == 5 and loaded.languages == shards.languages
    order = torch.randperm(len(shards.tokens), generator=torch.Generator().manual_seed(4))[:5]
    assert torch.equal(loaded.tokens, shards.tokens[order]) and torch.equal(loaded.language, shards.language[order])
    ids, features, final = loaded.batch(torch.tensor([4, 1]))
    with torch.no_grad():
        states = target(input_ids=ids, output_hidden_states=True).hidden_states
    expected = torch.cat([states[k] for k in TAPS], dim=-1)
    assert features.shape == (2, 32, 96) and features.dtype == torch.float32
    torch.testing.assert_close(features, expected.to(torch.bfloat16).float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(final, states[-1].to(torch.bfloat16).float(), atol=2e-2, rtol=2e-2)
    # the final state is what the head reads: it gives the target's logits
    with torch.no_grad():
        logits = target(input_ids=ids).logits
    torch.testing.assert_close(target.lm_head(final), logits, atol=0.1, rtol=0.05)

    # resuming: written chunks are kept, a missing one is redone, a bigger request adds chunks
    kept = (out / "chunk-00000.safetensors").stat().st_mtime_ns
    (out / "chunk-00001.safetensors").unlink()
    manifest = extract_features(target, shards, out, TAPS, sequences=7, chunk_sequences=2, seed=4)
    assert (out / "chunk-00000.safetensors").stat().st_mtime_ns == kept
    assert [c["sequences"] for c in manifest["chunks"]] == [2, 2, 2, 1]
    again = FeatureShards(out)
    assert torch.equal(again.batch(torch.tensor([4]))[1], loaded.batch(torch.tensor([4]))[1])
    # another seed picks other sequences: the chunks are redone, not mixed with the old ones
    extract_features(target, shards, out, TAPS, sequences=7, chunk_sequences=2, seed=5)
    other = torch.randperm(len(shards.tokens), generator=torch.Generator().manual_seed(5))[:7]
    assert torch.equal(FeatureShards(out).tokens, shards.tokens[other])
    # the final normed state may be an aux layer too (a shallow target's default): tapped once, used twice
    both = extract_features(target, shards, tmp_path / "final", (1, 4), sequences=2)
    assert both["taps"] == [1, 4]
    ids, features, final = FeatureShards(tmp_path / "final").batch(torch.tensor([0, 1]))
    assert torch.equal(features[..., 32:], final)
    torch.testing.assert_close(final, target.model(input_ids=ids).last_hidden_state.to(torch.bfloat16).float())
    with pytest.raises(ValueError, match="another target"):
        extract_features(target, shards, out, (0, 1, 2), sequences=7, chunk_sequences=2)
    with pytest.raises(ValueError, match="aux layers"):
        extract_features(target, shards, tmp_path / "g", (0, 1, 5))


def config(out, steps: int, **kw) -> Eagle3TrainConfig:
    return Eagle3TrainConfig(
        out=str(out),
        tokens=steps * 4 * 32,
        batch_size=4,
        lr=kw.pop("lr", 3e-3),
        warmup_tokens=128,
        eval_every=kw.pop("eval_every", 10_000),
        checkpoint_every=kw.pop("checkpoint_every", 10_000),
        **kw,
    )


def test_overfitting_lowers_the_loss_and_raises_dev_agreement(target, corpus, features, tmp_path):
    draft = make_draft(target, corpus)
    head = draft.lm_head.weight.clone()
    records = []
    state = train_eagle3(
        target.get_input_embeddings().weight,
        draft,
        config(tmp_path, 40, balance="scdf", eval_every=20),
        FeatureShards(features / "train"),
        FeatureShards(features / "dev"),
        progress=records.append,
    )
    assert len(records) == 40 and state["complete"] and state["tokens"] == 40 * 4 * 32
    first, last = records[:5], records[-5:]
    assert sum(r["loss"] for r in last) < 0.6 * sum(r["loss"] for r in first)
    for s in range(3):
        assert sum(r[f"top1_{s}"] for r in last) > sum(r[f"top1_{s}"] for r in first)
    before, after = state["evals"][0]["dev"], state["evals"][-1]["dev"]
    assert [e["step"] for e in state["evals"]] == [0, 20, 40]
    assert set(before) == {"python", "rust", "all"}
    assert after["all"]["expected_acceptance"] > before["all"]["expected_acceptance"]
    assert after["all"]["top1_0"] > before["all"]["top1_0"]
    assert torch.equal(draft.lm_head.weight, head)  # the head is the target's rows, frozen
    assert not draft.lm_head.weight.requires_grad


def test_resume_after_max_seconds_continues_exactly(target, corpus, features, tmp_path):
    embed = target.get_input_embeddings().weight
    straight = make_draft(target, corpus)
    train_eagle3(embed, straight, config(tmp_path / "a", 6), FeatureShards(features / "train"))

    interrupted = make_draft(target, corpus)
    state = train_eagle3(
        embed, interrupted, config(tmp_path / "b", 6, max_seconds=1e-9), FeatureShards(features / "train")
    )
    assert not state["complete"] and state["step"] == 1 and state["tokens"] == 4 * 32
    saved = json.loads((tmp_path / "b" / "checkpoint" / "state.json").read_text())
    assert saved["step"] == 1 and saved["sampler"] is not None and saved["adam_steps"]

    resumed = make_draft(target, corpus)  # a fresh process: weights, moments and sampler come from the checkpoint
    state = train_eagle3(embed, resumed, config(tmp_path / "b", 6), FeatureShards(features / "train"))
    assert state["complete"] and state["step"] == 6 and state["tokens"] == 6 * 4 * 32
    for (name, a), b in zip(trainable_parameters(straight).items(), trainable_parameters(resumed).values()):
        assert torch.equal(a, b), name
    log = [json.loads(line) for line in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2, 3, 4, 5, 6]


def test_features_for_other_layers_are_refused(target, corpus, features, tmp_path):
    draft = make_draft(target, corpus, taps=(1, 2, 3))
    with pytest.raises(ValueError, match="tap layers"):
        embed = target.get_input_embeddings().weight
        train_eagle3(embed, draft, config(tmp_path, 2), FeatureShards(features / "train"))


def test_dev_fitness_against_the_full_distribution_counts_tokens_the_draft_cannot_write(target, corpus, features):
    draft = make_draft(target, corpus).eval()
    embed, dev = target.get_input_embeddings().weight, FeatureShards(features / "dev")
    cfg = config("unused", 1, eval_sequences=2)
    within = dev_fitness(draft, embed, dev, cfg)
    full = dev_fitness(draft, embed, dev, cfg, target_head=target.lm_head.weight)
    assert set(full) == {"python", "rust", "all"}
    assert set(full["python"]) == {"expected_acceptance", "cross_entropy"} | {
        f"{k}_{s}" for k in ("top1", "acceptance") for s in range(3)
    }
    for lang in ("python", "rust"):
        # P over 258 target tokens puts mass where the 64-token draft has none: less is accepted
        assert full[lang]["expected_acceptance"] < within[lang]["expected_acceptance"]
        assert full[lang]["acceptance_0"] == full[lang]["expected_acceptance"]
        assert 0.0 < full[lang]["expected_acceptance"] < 1.0


def test_online_features_are_the_extracted_ones_a_batch_at_once(target, corpus, tmp_path):
    """The GPU's source of states (the target inside the step, batched) gives what extraction stored."""
    shards = Shards.load(corpus / "train")
    extract_features(target, shards, tmp_path / "f", (1, 4), sequences=3, seed=2)
    stored = FeatureShards(tmp_path / "f")
    online = OnlineFeatures(target, shards, (1, 4))
    order = torch.randperm(len(shards.tokens), generator=torch.Generator().manual_seed(2))[:3]
    ids, features, final = online.batch(order)
    assert torch.equal(ids, stored.tokens) and features.shape == (3, 32, 64) and final.shape == (3, 32, 32)
    _, stored_features, stored_final = stored.batch(torch.arange(3))
    torch.testing.assert_close(features.to(torch.bfloat16).float(), stored_features, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(final.to(torch.bfloat16).float(), stored_final, atol=2e-2, rtol=2e-2)
    assert torch.equal(features[..., 32:], final)  # tap 4 of 4 layers: the final normed state
    with pytest.raises(ValueError, match="aux layers"):
        OnlineFeatures(target, shards, (0, 1, 5))


def test_online_training_learns_stops_on_time_and_resumes_exactly(target, corpus, tmp_path):
    embed = target.get_input_embeddings().weight
    train_data = OnlineFeatures(target, Shards.load(corpus / "train"), TAPS)
    dev = OnlineFeatures(target, Shards.load(corpus / "dev"), TAPS)
    draft = make_draft(target, corpus)
    records = []
    state = train_eagle3(
        embed, draft, config(tmp_path / "a", 30, log_every=5), train_data, dev, progress=records.append
    )
    # the losses come back once every 5 steps, as their mean
    assert [r["step"] for r in records] == [5, 10, 15, 20, 25, 30] and state["complete"]
    assert records[-1]["loss"] < 0.7 * records[0]["loss"]
    before, after = state["evals"][0]["dev"]["all"], state["evals"][-1]["dev"]["all"]
    assert after["expected_acceptance"] > before["expected_acceptance"]

    straight = make_draft(target, corpus)
    train_eagle3(embed, straight, config(tmp_path / "b", 6), train_data)
    interrupted = make_draft(target, corpus)
    stopped = train_eagle3(embed, interrupted, config(tmp_path / "c", 6, max_seconds=1e-9), train_data, dev)
    assert not stopped["complete"] and stopped["step"] == 1
    assert [e["step"] for e in stopped["evals"]] == [0, 1]  # a run the clock ends is evaluated at its end too
    resumed = make_draft(target, corpus)
    state = train_eagle3(embed, resumed, config(tmp_path / "c", 6), train_data)
    assert state["complete"] and state["step"] == 6
    for (name, a), b in zip(trainable_parameters(straight).items(), trainable_parameters(resumed).values()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_ttt_loss_is_the_decayed_kl_of_each_step(target, corpus):
    draft = make_draft(target, corpus, seed=2)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (2, 7), generator=gen)
    features, final = torch.randn(2, 7, 96, generator=gen), torch.randn(2, 7, 32, generator=gen) * 5
    embed = target.get_input_embeddings().weight
    with torch.no_grad():
        loss, parts = ttt_loss(draft, embed, ids, features, final, steps=3, decay=0.5)
        q_steps = ttt_forward(draft, embed, ids, features, 3)
        log_p = torch.log_softmax(draft.lm_head(final[:, 1:]), -1)
    expected = 0
    for s, q in enumerate(q_steps):
        lp = log_p[:, s : s + q.shape[1]]
        kl = (lp.exp() * (lp - torch.log_softmax(q, -1))).sum(-1).mean()
        torch.testing.assert_close(parts[f"kl_{s}"], kl)
        expected += 0.5**s * kl
    torch.testing.assert_close(loss, expected)
