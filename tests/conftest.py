"""Shared fixtures: tiny random models and a byte-level tokenizer, all built in-process.

There is no model hub here, so every model is a few-thousand-parameter random network made
from a config, and the tokenizer is a byte-level BPE with no merges: token id i is byte i
(0..255), then <s> (256) and </s> (257). Everything is seeded.
"""

from __future__ import annotations

import copy
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

from speccomplete.decoder.engine import DecodeOptions, Generation, SpeculativeDecoder
from speccomplete.harness.tiny_gguf import bytes_to_unicode
from speccomplete.languages import LANGUAGES

# One intra-op thread, not two: these models are a few thousand parameters wide, so a second thread
# only adds synchronisation, and when another process is busy on the 2-core machine, two spinning
# OpenMP threads made each forward pass ~20x slower (measured; ~15x for the 135M integration model).
torch.set_num_threads(1)
hf_logging.set_verbosity_error()

BOS, EOS = 256, 257

# The 14 code languages of the report's resource groups (tests/server/test_language.py pins them)
CODE_LANGUAGES = frozenset(language.name for language in LANGUAGES if language.group)
BYTE_VOCAB = 258  # 256 bytes + <s> + </s>

# Where the tiny models live: the CPU, or `SPECDEC_TEST_DEVICE=cuda` for the decoder tests' CUDA run
# (gpu/step.sh tests). Models built here carry their device, so decoders on them follow it.
TEST_DEVICE = torch.device(os.environ.get("SPECDEC_TEST_DEVICE", "cpu"))


# --------------------------------------------------------------------------- the run's summary


def pytest_addoption(parser):
    parser.addoption(
        "--summary-json",
        metavar="FILE",
        help="at the end, write the counts, the failed tests and the machine's facts here (JSON), also when "
        "the run is interrupted: gpu/step.sh tests stops pytest with SIGINT at its cap",
    )


# Each test's outcome as its reports come in: passed, failed (its call), error (its setup or teardown, or a
# module that did not collect) or skipped (xfail too). A module global: pytest_runtest_logreport has no config.
_OUTCOMES: dict[str, str] = {}
_STARTED = time.monotonic()


def pytest_collectreport(report):
    if report.failed:
        _OUTCOMES[report.nodeid] = "error"


def pytest_runtest_logreport(report):
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:  # a setup or teardown that passed says nothing of the test
        return
    if _OUTCOMES.get(report.nodeid) not in ("failed", "error"):  # a teardown after a failure keeps the failure
        _OUTCOMES[report.nodeid] = outcome


def pytest_sessionfinish(session, exitstatus):
    """pytest calls this after a KeyboardInterrupt too, so a run cut by its cap still leaves its summary."""
    path = session.config.getoption("summary_json", None)
    if not path:
        return
    from speccomplete.harness.returns import write_summary

    counts = Counter(_OUTCOMES.values())
    rows = {
        "exit": int(exitstatus),
        "interrupted": exitstatus == pytest.ExitCode.INTERRUPTED,
        "seconds": round(time.monotonic() - _STARTED, 1),
        "tests": len(_OUTCOMES),
        "passed": counts["passed"],
        "failures": counts["failed"],
        "errors": counts["error"],
        "skipped": counts["skipped"],
        "failed": [test for test, outcome in _OUTCOMES.items() if outcome in ("failed", "error")],
    }
    write_summary(path, rows)


# --------------------------------------------------------------------------- tokenizer


def make_byte_tokenizer(
    bos: bool = True, eos: bool = True, eos_name: str = "</s>", merges: tuple[tuple[str, str], ...] = ()
) -> PreTrainedTokenizerFast:
    """Byte-level BPE, 256 byte tokens (id == byte value), no merges; specials appended after them.
    merges: pairs of texts that become one token each (ids from 256, before the specials; e.g. (" ", "*"))."""
    byte_char = bytes_to_unicode()
    vocab = {byte_char[b]: b for b in range(256)}

    def piece(text: str) -> str:
        return "".join(byte_char[b] for b in text.encode("utf-8"))

    for left, right in merges:
        vocab[piece(left + right)] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(piece(left), piece(right)) for left, right in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    kwargs = {}
    if bos:
        kwargs["bos_token"] = "<s>"
    if eos:
        kwargs["eos_token"] = eos_name
    out = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    if bos and not merges:
        assert out.bos_token_id == BOS
    if eos and not merges:
        assert out.eos_token_id == (EOS if bos else BOS)
    return out


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


# --------------------------------------------------------------------------- models


def _build(config, seed: int):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(TEST_DEVICE).eval().requires_grad_(False)


def tiny_llama(
    seed: int = 0,
    vocab: int = BYTE_VOCAB,
    layers: int = 2,
    hidden: int = 32,
    init: float = 0.02,
    max_pos: int = 512,
    eos: int | None = EOS,
    bos: int | None = BOS,
):
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_pos,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=None,
        initializer_range=init,
    )
    return _build(config, seed)


def tiny_gpt2(
    seed: int = 0,
    vocab: int = BYTE_VOCAB,
    layers: int = 2,
    hidden: int = 32,
    init: float = 0.2,
    max_pos: int = 512,
    eos: int | None = EOS,
    bos: int | None = BOS,
):
    config = GPT2Config(
        vocab_size=vocab,
        n_embd=hidden,
        n_layer=layers,
        n_head=4,
        n_positions=max_pos,
        bos_token_id=bos,
        eos_token_id=eos,
        initializer_range=init,
    )
    return _build(config, seed)


GEMMA_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def tiny_gemma3(seed: int = 0, sliding_window: int = 8, init: float = 0.05, max_pos: int = 512):
    config = Gemma3TextConfig(
        vocab_size=BYTE_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=max_pos,
        sliding_window=sliding_window,
        layer_types=list(GEMMA_LAYER_TYPES),
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=None,
        initializer_range=init,
    )
    return _build(config, seed)


def noisy_copy(model, layers: int, noise: float, seed: int = 7):
    """An independent draft model: its own parameters, fewer layers, the target's weights plus noise.

    It shares no module with the target (unlike `derive_draft`), so its acceptance rate is
    moderate instead of ~0, which keeps the identity tests fast while still rejecting often.
    """
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    draft = _build(config, seed)
    state = {k: v for k, v in model.state_dict().items() if k in draft.state_dict()}
    gen = torch.Generator().manual_seed(seed)
    state = {
        k: v + noise * v.std().nan_to_num(0.0) * torch.randn(v.shape, generator=gen).to(v.device)
        if v.numel() > 1
        else v
        for k, v in state.items()
    }
    draft.load_state_dict(state, strict=False)
    return draft.eval().requires_grad_(False)


# --------------------------------------------------------------------------- prompts

CODE_SNIPPETS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i)\n",
    "x = x + 1; y = y + 1; z = z + ",
    "if (a < b) { return a; } else { return b; }",
    "import os\nimport sys\nimport ",
]


def random_prompts(n: int, seed: int = 1234) -> list[str]:
    """A mix of random printable text, code snippets and repetitive text (which the n-gram drafter likes)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            out.append("".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(1, 24))))
        elif kind == 1:
            snippet = rng.choice(CODE_SNIPPETS)
            out.append(snippet[: rng.randrange(1, len(snippet) + 1)])
        else:
            word = "".join(rng.choice("abcdefg ") for _ in range(rng.randrange(2, 6)))
            out.append(word * rng.randrange(2, 5))
    return out


# --------------------------------------------------------------------------- checks


def check_stats(gen: Generation) -> None:
    """Invariants every generation's statistics must satisfy."""
    s = gen.stats
    assert 0 <= s.accepted <= s.drafted
    assert s.drafted == sum(s.gammas)
    assert len(s.gammas) == s.rounds
    assert sum(s.accepted_histogram) == sum(1 for g in s.gammas if g > 0)
    assert sum(n * c for n, c in enumerate(s.accepted_histogram)) == s.accepted
    assert s.rejected_rounds <= sum(1 for g in s.gammas if g > 0)
    assert s.new_tokens == len(gen.token_ids)
    assert s.finish_reason == gen.finish_reason
    # every round commits at least one token (unless generation ended inside it)
    assert s.rounds <= len(gen.token_ids) + 1


def generate(decoder: SpeculativeDecoder, prompt, **options) -> Generation:
    gen = decoder.generate(prompt, DecodeOptions(**options))
    check_stats(gen)
    return gen


def assert_greedy_matches(ar: SpeculativeDecoder, spec: SpeculativeDecoder, prompts, max_new_tokens: int) -> None:
    """`spec` writes what `ar` writes on every prompt, token for token, and its drafts were both
    accepted and rejected along the way (so both paths of the acceptance ran)."""
    gens = []
    for prompt in prompts:
        want = generate(ar, prompt, max_new_tokens=max_new_tokens)
        got = generate(spec, prompt, max_new_tokens=max_new_tokens)
        assert got.token_ids == want.token_ids, prompt
        gens.append(got)
    assert sum(g.stats.accepted for g in gens) > 0 and sum(g.stats.rejected_rounds for g in gens) > 0


def assert_steps_match_reference(
    reference: SpeculativeDecoder,
    spec: SpeculativeDecoder,
    ar: SpeculativeDecoder,
    prompts,
    max_new_tokens: int,
    logprobs: bool = False,
) -> int:
    """`spec` and `ar`, taking turns on the steps under test, both write what `reference` writes on every
    prompt, token for token (and with its log-probabilities if `logprobs`); returns the tokens `spec` drafted."""
    drafted = 0
    for prompt in prompts:
        want = generate(reference, prompt, max_new_tokens=max_new_tokens)
        got = generate(spec, prompt, max_new_tokens=max_new_tokens)
        assert got.token_ids == want.token_ids, prompt
        if logprobs:
            torch.testing.assert_close(torch.tensor(got.logprobs), torch.tensor(want.logprobs), rtol=1e-4, atol=1e-4)
        assert generate(ar, prompt, max_new_tokens=max_new_tokens).token_ids == want.token_ids, prompt
        drafted += got.stats.drafted
    return drafted


def write_python_splits(root: Path, files: int) -> Path:
    """`root/splits` with python.train.txt and python.dev.txt, each listing `files` small Python sources
    (what `specdec corpus --splits` reads); returns the splits folder."""
    source = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n" * 8
    splits = root / "splits"
    splits.mkdir()
    for split in ("train", "dev"):
        paths = []
        for i in range(files):
            path = root / f"{split}{i}.py"
            path.write_text(source.replace("add", f"add{i}"))
            paths.append(str(path))
        (splits / f"python.{split}.txt").write_text("\n".join(paths) + "\n")
    return splits


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _seed_and_threads():
    random.seed(0)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    # The CLI run in-process (speccomplete/cli.py) sets one thread per core, and compiled steps guard on
    # the thread count: a later test would see its graphs recompile.
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tokenizer():
    return make_byte_tokenizer()


@pytest.fixture(scope="session")
def llama():
    return tiny_llama(seed=0, layers=3)


@pytest.fixture(scope="session")
def llama_other(llama):
    """An independent model with the same vocabulary (own parameters, not derived)."""
    return noisy_copy(llama, layers=2, noise=0.3)


@pytest.fixture(scope="session")
def gpt2():
    return tiny_gpt2(seed=0, layers=2)


@pytest.fixture(scope="session")
def gpt2_other(gpt2):
    return noisy_copy(gpt2, layers=1, noise=0.3)


@pytest.fixture(scope="session")
def gemma3():
    return tiny_gemma3(seed=0)
