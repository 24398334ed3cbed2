"""The bench's loop: the warm-up, then every case's methods in an order rotated case by case, the
product's follow-up request after each, and the graphs recorded or compiled around each case's runs
(`Recordings`), by which the report says whether the times are of steady state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from speccomplete.decoder import cuda_graphs
from speccomplete.decoder.drafts.references import References
from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder

from ..lib.cases import Case
from ..workspace import nearest_files, read_texts, workspace_references
from .contenders import Contenders
from .methods import Method, build_methods
from .records import CaseRuns


class Recordings:
    """How many graphs this process has recorded or compiled, by kind: our CUDA graphs
    (decoder/cuda_graphs.py), torch.compile's cudagraph-tree recordings and dynamo's compiled graphs.

    The cudagraph trees keep no counter of their own; each recording runs dynamo's start callbacks with
    the trigger CUDAGRAPH_RECORDING, so a callback counts them. On a torch without that trigger the
    count is None, and dynamo's compiles (`counters["stats"]["unique_graphs"]`) still catch a graph
    compiled inside a timed run, though not a recording of one compiled before.
    """

    def __init__(self):
        self._trigger: Any = None
        self._handler: Any = None
        self.tree_recordings = 0
        try:
            from torch._dynamo.callback import CallbackTrigger, callback_handler
        except ImportError:  # a torch before dynamo's callbacks: the compiles are still counted
            return
        self._trigger = getattr(CallbackTrigger, "CUDAGRAPH_RECORDING", None)
        self._handler = callback_handler
        if self._trigger is not None:
            callback_handler.register_start_callback(self._on_start)

    def _on_start(self, args) -> None:
        if args.callback_trigger is self._trigger:
            self.tree_recordings += 1

    def counts(self) -> dict[str, int | None]:
        from torch._dynamo.utils import counters

        return {
            "cuda_graphs": cuda_graphs.recordings(),
            "cudagraph_trees": self.tree_recordings if self._trigger is not None else None,
            "compiled_graphs": int(counters["stats"]["unique_graphs"]),
        }

    def close(self) -> None:
        if self._trigger is not None and self._handler is not None:
            self._handler.remove_start_callback(self._on_start)


def counts_between(before: dict[str, int | None], after: dict[str, int | None]) -> dict[str, int]:
    """What was recorded or compiled between two `Recordings.counts()`, the kinds counted in both."""
    counted = {kind: (n, after.get(kind)) for kind, n in before.items()}
    return {kind: later - n for kind, (n, later) in counted.items() if n is not None and later is not None}


def _followup(spec: SpeculativeDecoder, ids: list[int], accepted: list[int]) -> dict[str, float]:
    """Time to the first token when the user took the completion's first tokens and asks again:
    with the cache as this case's runs left it, and then cold."""
    out = {}
    for name in ("warm", "cold"):
        if name == "cold":
            spec.steps.truncate(0)
        generation = spec.generate(ids + accepted, DecodeOptions(max_new_tokens=1))
        out[name] = generation.stats.total_ms
        out[f"{name}_prefilled_tokens"] = generation.stats.prompt_tokens - generation.stats.prompt_reused_tokens
    return out


def run_bench(
    cases: list[Case],
    contenders: Contenders,
    *,
    max_new_tokens: int,
    max_prompt_tokens: int,
    hf_gammas: Sequence[int] = (),
    prompt_lookup: int | None = None,
    progress=None,
    say=None,
) -> list[CaseRuns]:
    methods = build_methods(contenders, max_new_tokens, list(hf_gammas), prompt_lookup)
    names = list(methods)
    ar, spec = contenders.ours["ar"], contenders.ours["spec"]
    prompts = [ar.fit_prompt(ar.encode(c.prefix), max_new_tokens, max_prompt_tokens)[0] for c in cases]
    workspaces = [case_references(c, ar.tokenizer, contenders.workspace_ngram) for c in cases]
    recordings = Recordings()
    try:
        warm_up(methods, contenders, prompts[0], say, workspaces[0])
        results = []
        for i, (case, ids, references) in enumerate(zip(cases, prompts, workspaces)):
            result = CaseRuns(case)
            before = recordings.counts()
            for name in names[i % len(names) :] + names[: i % len(names)]:
                result.runs[name] = methods[name](ids, case.language, references)
            result.followup = _followup(spec, ids, result.runs["spec"].tokens[:8])
            result.recordings_after = recordings.counts()
            result.recorded = counts_between(before, result.recordings_after)
            results.append(result)
            if progress:
                progress(result)
        return results
    finally:
        recordings.close()


def case_references(case: Case, tokenizer, min_ngram: int) -> References | None:
    """What a lookup may copy from in the case's workspace (harness/workspace.py), matches of `min_ngram` tokens
    or more; None for a case without one, or where `min_ngram` is 0 (no row copies from it)."""
    if not case.workspace or not min_ngram:
        return None
    texts = read_texts(nearest_files(case.workspace, case.path, case.language))
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return workspace_references(texts, encode, min_ngram=min_ngram)


def warm_up(
    methods: dict[str, Method], contenders: Contenders, ids: list[int], say=None, references: References | None = None
) -> None:
    """Every method on the first case's whole prompt (allocator, kernels, thread pools, compiling: after a
    64-token warm-up, an H200's first full-length AR run took 1303 ms, the next case's 162, docs/gpu.md);
    then every graph of steps that run graphs (`compiled`: torch.compile's, or recorded ones,
    graph_target.py) recorded. torch.compile's cudagraph trees record a graph on its second call, so there
    our methods run twice and the steps' `warm_up` (every row count, hidden-state steps too where a
    drafter drafts on the target) runs twice; recorded steps record whatever graph is missing in it."""
    # steps with graphs (FixedShapeTarget compiled, GraphTarget), by identity: decoders share them
    compiled: dict[int, Any] = {id(d.steps): d.steps for d in contenders.ours.values() if d.steps.records_graphs}
    for name, method in methods.items():
        times = 2 if compiled and name in contenders.ours else 1
        for _ in range(times):
            run = method(ids, "warm-up", references)
        if say:
            say(f"warm-up {name}: {run.seconds:.1f} s" + (f" (the second of {times} runs)" if times > 1 else ""))
    for key, steps in compiled.items():
        hidden = any(
            d.drafter is not None and d.drafter.drafts_on_the_target
            for d in contenders.ours.values()
            if id(d.steps) == key
        )
        for _ in range(2):
            steps.warm_up(hidden)
