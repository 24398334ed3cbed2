"""The compiled CPU step (decoder/compiled_step.py): the same greedy tokens as the eager step, speculation on it
token-identical to its own AR (int8 too), and its disk cache built once, loaded after, and rebuilt when corrupt.

Each compile of a tiny model takes seconds to tens of seconds, so the tests share built steps where they can."""

from __future__ import annotations

import copy
import logging
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch
from helpers.decoding import assert_compiled_ar_is_eager_ar, assert_greedy_matches, generate, random_prompts

from speccomplete.decoder import compiled_step
from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, SelfDrafter, derive_draft
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.lean_forward import attend_row_by_row
from speccomplete.decoder.loader import use_cpu_kernels
from speccomplete.decoder.target_steps import EagerTarget

GAMMA = 3
ROWS = GAMMA + 1


def packed_pair(model, int8: bool):
    """A packed (or int8) copy of `model` and a one-layer draft derived from it, as the loader makes them."""
    target = copy.deepcopy(model)
    draft = derive_draft(target, [0])
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, draft, int8=int8)
    return target, draft


def decoders(target, draft, tokenizer, compiled):
    """AR on the eager steps, and speculation and AR on steps running `compiled`."""
    steps = EagerTarget(target)
    steps.use_compiled(compiled)
    eager_ar = SpeculativeDecoder(target, tokenizer, None, None)
    spec = SpeculativeDecoder(target, tokenizer, ModelDrafter(draft), FixedGamma(GAMMA), steps=steps)
    compiled_ar = SpeculativeDecoder(target, tokenizer, None, None, steps=steps)
    return eager_ar, spec, compiled_ar


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_compiled_steps_write_what_eager_steps_write(int8, llama, tokenizer, cache_dir):
    """Greedy: compiled AR = eager AR, and speculation on the compiled step = its own AR, token for token;
    with int8 too, whose verify rows attend row by row."""
    target, draft = packed_pair(llama, int8)
    compiled, report = compiled_step.build_or_load(target, "int8" if int8 else "none", ROWS)
    assert not report.loaded and report.path.exists() and report.bytes > 0
    eager_ar, spec, compiled_ar = decoders(target, draft, tokenizer, compiled)
    prompts = random_prompts(4)
    for prompt in prompts:
        assert (
            generate(compiled_ar, prompt, max_new_tokens=24).token_ids
            == generate(eager_ar, prompt, max_new_tokens=24).token_ids
        )
    assert_greedy_matches(compiled_ar, spec, prompts, max_new_tokens=24)
    assert spec.steps.compiled is compiled  # never fell back to eager


def test_a_step_for_plain_decoding_is_one_row(llama, tokenizer, cache_dir):
    """Without a draft a step feeds one row (a static shape), and compiled AR writes what eager AR writes."""
    target, _ = packed_pair(llama, int8=False)
    compiled, _ = compiled_step.build_or_load(target, "none", 1)
    assert_compiled_ar_is_eager_ar(target, tokenizer, compiled, random_prompts(2))


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_the_self_draft_on_the_compiled_step_is_its_ar(int8, gemma3, tokenizer, cache_dir):
    """The self draft's hidden states are the target's own, and the verify keeps their keys and values: on the
    compiled step they must be what its logits steps make, with a lookup's copied rows fed beside them."""
    target = copy.deepcopy(gemma3)
    vocabulary = torch.randperm(target.config.vocab_size, generator=torch.Generator().manual_seed(0))
    drafter = HybridDrafter(SelfDrafter(target, vocabulary[: target.config.vocab_size // 2]), lookup_tokens=3)
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, int8=int8)
    compiled, _ = compiled_step.build_or_load(target, "int8" if int8 else "none", ROWS)
    steps = EagerTarget(target)
    steps.use_compiled(compiled)
    spec = SpeculativeDecoder(target, tokenizer, drafter, FixedGamma(GAMMA), steps=steps)
    compiled_ar = SpeculativeDecoder(target, tokenizer, None, None, steps=steps)
    prompts = [p + p for p in random_prompts(3)]  # repeats for the lookup to copy
    assert_greedy_matches(compiled_ar, spec, prompts, max_new_tokens=24)
    assert spec.steps.compiled is compiled


def test_draft_trees_on_the_compiled_step_are_its_ar(gemma3, tokenizer, cache_dir):
    """A draft tree's verify runs on the same compiled graph (each row at the end of its path; the build checks
    its rows against one-row steps): int8 speculation with EAGLE-3 and lookup trees is still its AR."""
    from speccomplete.decoder.drafts import Eagle3Drafter
    from speccomplete.decoder.drafts.eagle3.model import Eagle3Shape, init_from_target

    target = copy.deepcopy(gemma3)
    ids = torch.arange(3, 200)
    draft = init_from_target(Eagle3Shape.for_target(target, draft_vocab=len(ids)), target, ids, seed=0).eval()
    drafter = HybridDrafter(Eagle3Drafter(draft.requires_grad_(False), target), lookup_tokens=7, min_ngram=1)
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, draft, int8=True)
    compiled, _ = compiled_step.build_or_load(target, "int8", 8, taps=drafter.target_taps)
    steps = EagerTarget(target, drafter.target_taps)
    steps.use_compiled(compiled)
    spec = SpeculativeDecoder(target, tokenizer, drafter, FixedGamma(GAMMA), steps=steps, tree_nodes=6)
    trees = []
    verify_tree = spec._verify_tree
    spec._verify_tree = lambda *args: trees.append(args[2]) or verify_tree(*args)
    compiled_ar = SpeculativeDecoder(target, tokenizer, None, None, steps=steps)
    prompts = [p + "".join(random_prompts(12, seed=i)) for i, p in enumerate(random_prompts(3))]
    assert_greedy_matches(compiled_ar, spec, prompts, max_new_tokens=24)
    assert trees and max(len(tree) for tree in trees) <= 6, [t for t in trees if len(t) > 6]
    assert spec.steps.compiled is compiled


def test_int8_verify_rows_equal_one_row_steps(gemma3, cache_dir):
    """What makes int8 speculation exact, compiled too: a verify's logits are the one-row steps', bit for bit
    (Gemma-3: sliding-window layers and q/k norms)."""
    target = copy.deepcopy(gemma3)
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, int8=True)
    attend_row_by_row(target)
    compiled, _ = compiled_step.build_or_load(target, "int8", ROWS)
    ids = torch.randint(0, target.config.vocab_size, (20,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        steps = EagerTarget(target)
        steps.use_compiled(compiled)
        steps.forward(ids[:12], keep=1)
        verify = steps.forward(ids[12:15], keep=3)
        steps.truncate(12)
        one_by_one = torch.cat([steps.forward([token], keep=1) for token in ids[12:15]])
    assert torch.equal(verify, one_by_one)


def test_the_cache_entry_is_loaded_and_a_corrupt_one_rebuilt(llama, cache_dir, caplog, monkeypatch):
    """And a package's verify rows are checked at its first load only, and again once it has been rewritten."""
    target, _ = packed_pair(llama, int8=False)
    checks = []
    check = compiled_step.CompiledStep.check_verify_rows
    monkeypatch.setattr(compiled_step.CompiledStep, "check_verify_rows", lambda step: checks.append(check(step)))
    _, built = compiled_step.build_or_load(target, "none", ROWS)
    _, loaded = compiled_step.build_or_load(target, "none", ROWS)
    assert not built.loaded and loaded.loaded and loaded.path == built.path
    assert len(checks) == 1 and (built.path / compiled_step.CHECKED).is_file()
    (built.path / compiled_step.PACKAGE).write_bytes(b"not a cache")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    abandoned = built.path.with_name(f"{built.path.name}.{gone.stdout.strip()}.part")  # a build whose server stopped
    abandoned.mkdir()
    with caplog.at_level(logging.WARNING):
        step, rebuilt = compiled_step.build_or_load(target, "none", ROWS)
    assert not rebuilt.loaded and "unreadable" in caplog.text
    assert not abandoned.exists()
    assert (rebuilt.path / compiled_step.PACKAGE).read_bytes() != b"not a cache"
    assert len(checks) == 2  # the new package checked
    with torch.inference_mode():  # and it runs
        steps = EagerTarget(target)
        steps.use_compiled(step)
        steps.forward(list(range(10)), keep=1)
        assert steps.hidden([5, 6]).shape == (2, target.config.hidden_size)


def test_a_package_that_fails_the_check_is_refused_at_every_load(llama, cache_dir, monkeypatch):
    target, _ = packed_pair(llama, int8=False)
    _, built = compiled_step.build_or_load(target, "none", ROWS)
    (built.path / compiled_step.CHECKED).unlink()  # as if its first check here were to come

    def differs(step) -> None:
        raise compiled_step.CompiledStepError("the compiled step's verify rows differ from its one-row steps")

    monkeypatch.setattr(compiled_step.CompiledStep, "check_verify_rows", differs)
    for _ in range(2):
        with pytest.raises(compiled_step.CompiledStepError):
            compiled_step.build_or_load(target, "none", ROWS)
    assert not (built.path / compiled_step.CHECKED).exists()


def test_a_step_built_on_another_thread_runs_at_the_count_asked_for(llama, cache_dir):
    """The server builds on a thread of its own while its worker moves the thread count (IdleCores): the step
    is built for the count asked for, not the one another thread set last, and steps at that count run it."""
    target, _ = packed_pair(llama, int8=False)
    asked = 2
    built: dict = {}

    def build() -> None:
        built["step"], _ = compiled_step.build_or_load(target, "none", ROWS, threads=asked)

    torch.set_num_threads(1)  # what the worker sets while the build keeps a core busy
    builder = threading.Thread(target=build)
    builder.start()
    builder.join()
    torch.set_num_threads(asked)  # the worker, idle again
    with torch.inference_mode():
        steps = EagerTarget(target)
        steps.forward(list(range(10)), keep=1)
        assert built["step"].threads == asked and built["step"].covers(1, steps.cache)


def test_the_key_says_what_the_code_is_valid_for(llama, gemma3):
    key = compiled_step.entry_key(llama, "none", ROWS, 2, ())
    assert key == compiled_step.entry_key(llama, "none", ROWS, 2, ())
    others = [
        compiled_step.entry_key(gemma3, "none", ROWS, 2, ()),
        compiled_step.entry_key(llama, "int8", ROWS, 2, ()),
        compiled_step.entry_key(llama, "none", ROWS + 1, 2, ()),
        compiled_step.entry_key(llama, "none", ROWS, 2, (1,)),
        compiled_step.entry_key(llama, "none", ROWS, 1, ()),
    ]
    assert key not in others and len(set(others)) == len(others)


def test_compile_step_auto_compiles_targets_of_real_size(llama, tokenizer, monkeypatch):
    from speccomplete.decoder import loader

    decoder = SpeculativeDecoder(llama, tokenizer, None, None, steps=EagerTarget(llama))
    assert loader.wants_compiled_step(True, decoder) and not loader.wants_compiled_step(False, decoder)
    assert not loader.wants_compiled_step("auto", decoder)  # a tiny model: its step is cheap eager already
    monkeypatch.setattr(loader, "COMPILE_MIN_PARAMETERS", sum(p.numel() for p in llama.parameters()))
    assert loader.wants_compiled_step("auto", decoder)
