"""Draft training on tiny models: the loss falls, resume is exact, the saved draft loads and decodes losslessly."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.decoding import check_stats, random_prompts
from helpers.tiny_models import tiny_llama
from helpers.tokenizers import BOS, EOS, make_byte_tokenizer

from speccomplete.decoder.drafts import ModelDrafter, build_drafter
from speccomplete.decoder.drafts.trained import (
    DraftLoadError,
    DraftMeta,
    load_draft,
    owned_parameters,
    save_draft,
    target_signature,
)
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.sampling import SamplingParams
from speccomplete.decoder.training.corpus import Document, Shards, build_corpus
from speccomplete.decoder.training.derived import Phase, TrainConfig, train
from speccomplete.decoder.training.draft import build_draft, frequent_token_ids
from speccomplete.decoder.training.fitness import fitness_from_logits
from speccomplete.decoder.training.trainer import BatchSampler

TOKENIZER = make_byte_tokenizer()
SOURCES = {
    "python": "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n",
    "rust": 'fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\nfn main() { println!("{}", add(1, 2)); }\n',
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    documents = {lang: [Document(lang, text * 3, f"{lang}:{i}") for i in range(20)] for lang, text in SOURCES.items()}
    build_corpus(documents, TOKENIZER, root / "train", {"*": 4096}, seq_len=64, seed=0)
    build_corpus(documents, TOKENIZER, root / "dev", {"*": 256}, seq_len=64, seed=1)
    return root


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=3, hidden=32, init=0.2)


def make_draft(target, corpus, init="derived"):
    vocab_ids = frequent_token_ids(Shards.load(corpus / "train").tokens, 64, [BOS, EOS], target.config.vocab_size)
    return build_draft(target, [0], init, vocab_ids)


def config(corpus, out, steps: int, **kw) -> TrainConfig:
    return TrainConfig(
        phases=[Phase(str(corpus / "train"), steps * 2 * 64)],
        out=str(out),
        batch_size=2,
        lr=3e-3,
        warmup_tokens=128,
        eval_every=10_000,
        checkpoint_every=kw.pop("checkpoint_every", 10_000),
        **kw,
    )


@pytest.mark.parametrize("objective", [{"kd_weight": 1.0}, {"ce_weight": 1.0, "kd_weight": 0.0}])
def test_a_few_steps_lower_the_loss_and_raise_dev_fitness(target, corpus, tmp_path, objective):
    draft = make_draft(target, corpus)
    losses = []
    state = train(
        target,
        draft,
        owned_parameters(draft),
        config(corpus, tmp_path, 40, dev=str(corpus / "dev"), eval_sequences=2, **objective),
        progress=lambda r: losses.append(r["loss"]),
    )
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    before, after = state["evals"][0]["dev"]["all"], state["evals"][-1]["dev"]["all"]
    assert state["evals"][0]["step"] == 0 and state["evals"][-1]["step"] == 40
    if objective["kd_weight"]:  # distillation moves the draft toward the target (CE toward the corpus)
        assert after["expected_acceptance"] > before["expected_acceptance"]
        assert after["cross_entropy"] < before["cross_entropy"]


def test_resume_continues_exactly(target, corpus, tmp_path):
    torch.set_num_threads(1)
    straight = make_draft(target, corpus)
    train(target, straight, owned_parameters(straight), config(corpus, tmp_path / "a", 8, checkpoint_every=4))

    interrupted = make_draft(target, corpus)

    def crash_after_checkpoint(record):
        if record["step"] == 6:
            raise KeyboardInterrupt

    cfg = config(corpus, tmp_path / "b", 8, checkpoint_every=4)
    with pytest.raises(KeyboardInterrupt):
        train(target, interrupted, owned_parameters(interrupted), cfg, progress=crash_after_checkpoint)
    resumed = make_draft(target, corpus)  # a fresh process: weights, moments and sampler come from the checkpoint
    state = train(target, resumed, owned_parameters(resumed), cfg)
    assert state["step"] == 8
    for (name, a), b in zip(owned_parameters(straight).items(), owned_parameters(resumed).values()):
        assert torch.equal(a, b), name
    log = [json.loads(line) for line in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2, 3, 4, 5, 6, 5, 6, 7, 8]


def test_saved_draft_loads_and_greedy_stays_identical(target, corpus, tmp_path):
    draft = make_draft(target, corpus)
    train(target, draft, owned_parameters(draft), config(corpus, tmp_path, 20))
    folder = save_draft(
        draft, tmp_path / "draft", DraftMeta(target_config=target_signature(target), layers=[0]), dtype=torch.float32
    )
    loaded = load_draft(folder, target)
    assert torch.equal(loaded.vocab_ids, draft.vocab_ids)
    for (name, a), b in zip(owned_parameters(draft).items(), owned_parameters(loaded).values()):
        assert torch.equal(a, b), name
    drafter, model = build_drafter(str(folder), target, TOKENIZER)
    assert isinstance(drafter, ModelDrafter) and model is not None
    spec = SpeculativeDecoder(target, TOKENIZER, drafter, FixedGamma(3))
    plain = SpeculativeDecoder(target, TOKENIZER)
    drafted = 0
    for prompt in random_prompts(12) + list(SOURCES.values()):
        a = spec.generate(prompt, DecodeOptions(max_new_tokens=24))
        b = plain.generate(prompt, DecodeOptions(max_new_tokens=24))
        check_stats(a)
        assert a.token_ids == b.token_ids, prompt
        assert set(a.token_ids) <= set(range(target.config.vocab_size))
        drafted += a.stats.drafted
    assert drafted > 0
    # sampling maps the draft's sub-vocabulary q back into the target vocabulary
    sampled = spec.generate("def ", DecodeOptions(max_new_tokens=16, sampling=SamplingParams(1.0), seed=0))
    check_stats(sampled)
    assert sampled.stats.drafted > 0


def test_scratch_init_trains(target, corpus, tmp_path):
    draft = make_draft(target, corpus, init="scratch")
    derived = make_draft(target, corpus)
    first = owned_parameters(draft)
    assert not all(torch.equal(a, b) for a, b in zip(first.values(), owned_parameters(derived).values()))
    losses = []
    train(
        target,
        draft,
        first,
        config(corpus, tmp_path, 20, ce_weight=1.0, kd_weight=0.0),
        progress=lambda r: losses.append(r["loss"]),
    )
    assert losses[-1] < losses[0]


def test_draft_for_another_target_is_refused(target, corpus, tmp_path):
    draft = make_draft(target, corpus)
    folder = save_draft(draft, tmp_path / "d", DraftMeta(target_config=target_signature(target), layers=[0]))
    other = tiny_llama(seed=1, layers=3, hidden=32, vocab=300)
    with pytest.raises(DraftLoadError, match="vocab_size=258"):
        load_draft(folder, other)
    with pytest.raises(DraftLoadError, match="cannot read"):
        load_draft(tmp_path, target)


def test_scdf_upweights_the_worst_fitting_language(corpus):
    sampler = BatchSampler(Shards.load(corpus / "train"), "scdf", seed=0)
    sampler.set_fitness({"python": 0.8, "rust": 0.4}, strength=0.5)
    weights = dict(zip(sampler.data.languages, sampler.weights.tolist()))
    assert weights["rust"] == pytest.approx(0.25 + 0.5 * 2 / 3)
    assert weights["python"] == pytest.approx(0.25 + 0.5 * 1 / 3)
    picks = sampler.sample(3000)
    rust_share = (sampler.data.language[picks] == sampler.data.languages.index("rust")).float().mean()
    assert abs(float(rust_share) - weights["rust"]) < 0.04


def test_fitness_over_a_sub_vocabulary_by_hand():
    p_logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0 + 1e-9]]))
    q_logits = torch.log(torch.tensor([[0.6, 0.4]]))  # the draft covers target ids 1 and 0, in that order
    f = fitness_from_logits(p_logits, q_logits, torch.tensor([1, 0]))
    # q over target ids: id1 = 0.6, id0 = 0.4 -> Σ min(p, q) = min(.5,.4) + min(.3,.6) = 0.7
    assert f["expected_acceptance"] == pytest.approx(0.7, abs=1e-6)
    assert f["top1_agreement"] == 0.0  # draft's top is id 1, target's is id 0
