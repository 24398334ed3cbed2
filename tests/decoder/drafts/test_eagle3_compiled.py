"""The EAGLE-3 draft's compiled layer step (decoder/drafts/eagle3/compiled.py): what the eager step computes and
writes into the draft cache, speculation on it still the target's AR token for token, installed with the target's
compiled step by the loader, and its disk cache loaded the second time. Compiling takes seconds a tiny model."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from helpers.decoding import assert_greedy_matches, random_prompts
from helpers.eagle3 import make_draft

from speccomplete.decoder import compiled_step
from speccomplete.decoder.drafts import Eagle3Drafter, HybridDrafter
from speccomplete.decoder.drafts.eagle3 import compiled as compiled_draft
from speccomplete.decoder.drafts.eagle3.model import KVCache
from speccomplete.decoder.engine import SpeculativeDecoder
from speccomplete.decoder.gamma import FixedGamma
from speccomplete.decoder.loader import compile_steps, use_cpu_kernels
from speccomplete.decoder.target_steps import EagerTarget

GAMMA = 3
ROWS = GAMMA + 1


@pytest.fixture
def int8_eagle3(gemma3):
    """An int8 copy of the tiny Gemma-3 and an EAGLE-3 drafter on it, packed in one call as the loader does."""
    target = copy.deepcopy(gemma3)
    drafter = Eagle3Drafter(make_draft(target, "whole"), target)
    use_cpu_kernels(SimpleNamespace(records_graphs=False), target, *drafter.own_modules, int8=True)
    return target, drafter


def test_the_compiled_step_computes_and_writes_what_the_eager_step_does(int8_eagle3, cache_dir):
    """Onto a cache of 9 rows, 1 and then 3 new rows: the same output states (to float rounding: the graph fuses
    differently) and the same keys and values written, the length moved as an append moves it."""
    _, drafter = int8_eagle3
    draft = drafter.draft
    step, report = compiled_draft.build_or_load(draft, "int8", ROWS)
    assert not report.loaded and report.bytes > 0
    h = draft.shape.hidden_size
    generator = torch.Generator().manual_seed(0)
    rows = [(torch.randn(n, h, generator=generator), torch.randn(n, h, generator=generator)) for n in (9, 1, 3)]
    eager, compiled = KVCache(), KVCache()
    step.reserve(compiled)
    with torch.inference_mode():
        for cache in (eager, compiled):
            draft.step(*rows[0], torch.arange(1, 10), cache)
        for embeds, hidden in rows[1:]:
            start = eager.length
            want = draft.step(embeds, hidden, torch.arange(start + 1, start + 1 + len(embeds)), eager)
            assert step.covers(len(embeds), compiled)
            got = step.step(embeds, hidden, compiled)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert compiled.length == eager.length
    assert compiled.keys is not None and eager.keys is not None
    torch.testing.assert_close(compiled.keys, eager.keys, rtol=1e-4, atol=1e-4)
    assert not step.covers(ROWS + 1, compiled)  # wider than the graph: eager
    assert not step.covers(1, eager)  # buffers not at the graph's capacity: eager


def test_ngram_eagle3_on_the_loader_s_compiled_steps_is_the_target_s_ar(int8_eagle3, tokenizer, cache_dir):
    """compile_steps builds the draft's step beside the target's and the drafter runs it once those steps are in
    use: greedy speculation is still the compiled AR, token for token, with the draft's chains on the graph."""
    target, drafter = int8_eagle3
    hybrid = HybridDrafter(drafter, lookup_tokens=3)
    steps = EagerTarget(target, drafter.target_taps)
    spec = SpeculativeDecoder(target, tokenizer, hybrid, FixedGamma(GAMMA), steps=steps)
    compiled, _ = compile_steps(spec, "int8")
    assert isinstance(compiled.draft_step, compiled_draft.CompiledDraftStep)
    assert compiled.draft_step.draft is drafter.draft
    steps.use_compiled(compiled)
    calls = []
    run = compiled.draft_step.step
    compiled.draft_step.step = lambda *args: calls.append(len(args[0])) or run(*args)
    compiled_ar = SpeculativeDecoder(target, tokenizer, None, None, steps=steps)
    assert_greedy_matches(compiled_ar, spec, random_prompts(3), max_new_tokens=24)
    assert calls and 1 in calls  # chained tokens, one row each
    assert steps.compiled is compiled
    # a second load of the same draft finds its entry
    _, report = compiled_draft.build_or_load(drafter.draft, "int8", compiled.max_rows)
    assert report.loaded


def test_the_draft_s_key_follows_its_weights_and_threads(int8_eagle3, gemma3):
    _, drafter = int8_eagle3
    draft = drafter.draft
    key = compiled_draft.entry_key(draft, "int8", ROWS, 2)
    assert key == compiled_draft.entry_key(draft, "int8", ROWS, 2)
    assert key != compiled_draft.entry_key(draft, "int8", ROWS, 1)
    assert key != compiled_draft.entry_key(draft, "int8", ROWS + 1, 2)
    other = make_draft(copy.deepcopy(gemma3), "whole", seed=1)
    with torch.no_grad():
        other.norm.weight.add_(1)
    assert key != compiled_draft.entry_key(other, "int8", ROWS, 2)
    assert compiled_step.entry_path(key).name == key
