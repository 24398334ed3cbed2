"""Which decoders `specdec bench` times: our AR baseline and the product's decoder, the drafts
compared beside it, and with --ablations one decoder per lever turned off or swapped; llama.cpp's rows,
each in a process of its own; and how a target runs, as the header names it (`step_kind`)."""

from __future__ import annotations

import argparse
import multiprocessing
import os
from dataclasses import dataclass, field

from speccomplete.decoder.engine import SpeculativeDecoder

# The drafters the ablation rows compare with the product's: lookup only, lookup then the target's
# own draft (reduced head), lookup then the trained draft, the trained draft only.
ABLATION_DRAFTS = ("ngram+none", "ngram+self", "ngram+auto", "auto")
LLAMACPP_AR = "llamacpp_ar"  # llama.cpp without speculation: what its speculative rows must equal
QUANTIZED_ROWS = {"none": "fp32", "int8": "int8"}  # --compare-quantization: the prefix of its two rows


@dataclass
class Contenders:
    """Our decoders by method name ("ar" and "spec" required), llama.cpp's, and HF's models (None: skip HF)."""

    ours: dict[str, SpeculativeDecoder]
    hf_target: object | None = None
    hf_draft: object | None = None  # full-vocabulary draft for HF assisted; None: no assisted column
    llamacpp: dict[str, object] = field(default_factory=dict)  # LlamaCppDecoder by method name
    # rows whose lookup may also copy from the case's workspace (Case.workspace, harness/workspace.py), and the
    # shortest match it copies on (0: no such row)
    referring: set[str] = field(default_factory=set)
    workspace_ngram: int = 0


def llamacpp_contenders(methods: str, gguf: str) -> tuple[dict[str, object], dict[str, str]]:
    """llama.cpp on `gguf`, one row per speculative method in the comma list ("none" is its AR), each
    prefilling every prompt from scratch like our rows, each in a process of its own; with what each row is."""
    decoders: dict[str, object] = {}
    doc: dict[str, str] = {}
    for method in [m for m in methods.split(",") if m]:
        name = LLAMACPP_AR if method == "none" else f"llamacpp_{method}"
        decoders[name] = LlamaCppProcess(gguf, method)
        doc[name] = f"llama.cpp (xllamacpp, own process) on {os.path.basename(gguf)}, speculative {method}"
    return decoders, doc


class LlamaCppProcess:
    """A LlamaCppDecoder in a process of its own, asked over a pipe: loaded in ours, even idle, it slowed our
    AR by about a third (docs/benchmarks/README.md, section 13), so no row would be fair to us. Its process
    waits on the pipe, using no CPU, while ours run."""

    def __init__(self, gguf: str, speculative: str):
        context = multiprocessing.get_context("spawn")  # no copy of our models, threads or allocator state
        self._pipe, theirs = context.Pipe()
        self._process = context.Process(target=_serve_llamacpp, args=(theirs, gguf, speculative), daemon=True)
        self._process.start()
        self._answer()  # loaded, or its error raised here

    def generate(self, prompt, options):
        self._pipe.send((prompt, options))
        return self._answer()

    def _answer(self):
        answer = self._pipe.recv()
        if isinstance(answer, BaseException):
            raise answer
        return answer


def _serve_llamacpp(pipe, gguf: str, speculative: str) -> None:
    from speccomplete.decoder.backends.llamacpp import LlamaCppDecoder

    try:
        decoder = LlamaCppDecoder(gguf, speculative=speculative, cache_prompt=False)
    except Exception as e:
        pipe.send(e)
        return
    pipe.send(None)
    while True:
        try:
            prompt, options = pipe.recv()
        except EOFError:  # the bench is done
            return
        try:
            pipe.send(decoder.generate(prompt, options))
        except Exception as e:
            pipe.send(e)


def quantization_contenders(
    args: argparse.Namespace, quantization: str
) -> tuple[dict[str, SpeculativeDecoder], dict[str, str]]:
    """A second copy of the target with other weights (decoder/kernels.py): its AR and the product's
    decoder on it, rows `<fp32|int8>_ar` and `<fp32|int8>_spec`; each must equal its own AR."""
    from ..lib.model_args import load

    loaded = load(args, pack=True, quantization=quantization)
    prefix = QUANTIZED_ROWS[quantization]
    weights = "int8 weights, per-row scales" if quantization == "int8" else "oneDNN-packed fp32 weights"
    rows = {
        f"{prefix}_ar": SpeculativeDecoder(loaded.target, loaded.tokenizer, steps=loaded.decoder.steps),
        f"{prefix}_spec": loaded.decoder,
    }
    doc = {f"{prefix}_ar": f"our AR on {weights}", f"{prefix}_spec": f"draft {args.draft} on {weights}"}
    return rows, doc


def build_contenders(
    args: argparse.Namespace, target, tokenizer, decoder: SpeculativeDecoder, other_drafts: dict, stock
) -> tuple[Contenders, dict[str, str]]:
    """Our AR and product decoder, and with --ablations one decoder per lever turned off or swapped;
    with what each row is, by method name.

    `other_drafts` maps a draft spec to its (drafter, draft model), built on `target`; `stock` is
    the target as HF users run it (plain weights, HF's forward), needed for the unpacked and
    HF-forward rows.
    """
    import copy

    from speccomplete.decoder.drafts import HybridDrafter, ModelDrafter, SelfDrafter, build_drafter
    from speccomplete.decoder.gamma import parse_gamma_policy
    from speccomplete.decoder.kernels import pack_linear_weights
    from speccomplete.decoder.lean_forward import keep_hf_forward

    steps = decoder.steps  # every decoder on the target runs on the product's cache (and compiled graphs)
    # the loader packs only CPU linears on eager steps (decoder/loader.py, use_cpu_kernels)
    cpu_eager = target.device.type == "cpu" and not steps.records_graphs
    packed = "int8" if args.quantization == "int8" else "oneDNN-packed" if cpu_eager and not args.no_pack else "plain"
    ours = {"ar": SpeculativeDecoder(target, tokenizer, steps=steps), "spec": decoder}
    doc = {
        "ar": f"our AR baseline: same engine, {packed} weights, same target steps and cache, γ=0",
        "spec": f"our speculative decoder: draft {args.draft}, γ {args.gamma}, {packed} weights",
    }
    for spec, (drafter, _) in other_drafts.items():
        ours[f"spec_draft_{spec}"] = SpeculativeDecoder(
            target, tokenizer, drafter, parse_gamma_policy(args.gamma), steps=steps
        )
        doc[f"spec_draft_{spec}"] = f"draft {spec} instead of {args.draft}"

    def twin(name: str, tree_nodes: int) -> SpeculativeDecoder:
        """Row `name`'s decoder again, on the same drafter (it follows the shared steps' cache, as every row here
        does) and a copy of its γ policy."""
        row = ours[name]
        return SpeculativeDecoder(
            target,
            tokenizer,
            row.drafter,
            copy.deepcopy(row.gamma),
            draft_confidence=row.draft_confidence,
            steps=steps,
            tree_nodes=tree_nodes,
        )

    speculative = [name for name in ours if name == "spec" or name.startswith("spec_draft_")]
    for nodes in [int(n) for n in (args.compare_tree_nodes or "").split(",") if n]:
        for name in speculative:
            ours[f"{name}_tree{nodes}"] = twin(name, nodes)
            doc[f"{name}_tree{nodes}"] = f"{doc[name]}; draft trees of up to {nodes} nodes" + (
                " (chains)" if not nodes else ""
            )
    referring = set()
    if args.compare_workspace:
        for name in [name for name in ours if name.startswith("spec") and ours[name].drafter is not None]:
            ours[f"{name}_workspace"] = twin(name, ours[name].tree_nodes)
            doc[f"{name}_workspace"] = (
                f"{doc[name]}; the lookup also copies from the case's workspace ({args.compare_workspace}+ tokens)"
            )
            referring.add(f"{name}_workspace")
    if not args.ablations:
        return Contenders(ours, referring=referring, workspace_ngram=args.compare_workspace), doc

    def same_drafter(drafter):  # a drafter of its own (drafters hold a cache) over the same draft model
        if isinstance(drafter, HybridDrafter):
            return HybridDrafter(drafter.model and same_drafter(drafter.model))
        if isinstance(drafter, SelfDrafter):
            return copy.copy(drafter)  # shares the cut head; its decoder attaches it to the target's steps
        return ModelDrafter(drafter.model) if isinstance(drafter, ModelDrafter) else type(drafter)()

    def lever_off(name: str, model, lever: str):
        """AR, and the product's draft, on `model`: the rows with one lever off. Returns the draft model."""
        drafter, draft_model = build_drafter(args.draft, model, tokenizer, device=args.device, dtype=args.dtype)
        ours[f"ar_{name}"] = SpeculativeDecoder(model, tokenizer)
        doc[f"ar_{name}"] = f"lever off: {lever} (AR)"
        if drafter is not None:
            ours[f"spec_{name}"] = SpeculativeDecoder(model, tokenizer, drafter, parse_gamma_policy(args.gamma))
            doc[f"spec_{name}"] = f"lever off: {lever} (speculative)"
        return draft_model

    # γ only paces a model draft: the rows use the product's, or else the lookup-then-model draft's
    drafter, spec = decoder.drafter, args.draft
    if drafter is None or (isinstance(drafter, HybridDrafter) and drafter.model is None):
        spec = "ngram+auto"
        drafter = other_drafts[spec][0] if spec in other_drafts else None

    def paced(name: str, gamma: str, what: str, confidence: float = 0.0):
        """A row on that draft with its own pacing: a γ policy, and where drafting stops."""
        ours[name] = SpeculativeDecoder(
            target,
            tokenizer,
            same_drafter(drafter),
            parse_gamma_policy(gamma),
            draft_confidence=confidence,
            steps=steps,
        )
        doc[name] = f"draft {spec}, {what}"

    if drafter is not None:
        for gamma in [g for g in args.compare_gammas.split(",") if g and g != args.gamma]:
            paced(f"spec_gamma_{gamma}", gamma, f"γ policy {gamma} instead of {args.gamma}")
        for threshold in [float(t) for t in args.compare_confidences.split(",") if t]:
            paced(
                f"spec_confidence_{threshold:g}",
                args.gamma,
                f"γ policy {args.gamma}, and drafting stops where the draft's top probability is under {threshold:g}",
                confidence=threshold,
            )
    if not args.no_pack:
        # a second packed copy, built from plain weights like the product
        hf_forward = copy.deepcopy(stock)
        draft_model = lever_off("hf_forward", hf_forward, "our forward (decoder/lean_forward.py), HF's instead")
        pack_linear_weights(hf_forward, draft_model)
        keep_hf_forward(hf_forward)
        lever_off("unpacked", stock, "packed weights, on the stock nn.Linear / MKL path")
    return Contenders(ours, referring=referring, workspace_ngram=args.compare_workspace), doc


def step_kind(steps) -> str:
    """How a target runs, as the bench's header names it: eager, compiled (on the CPU: eager steps with short
    feeds compiled, decoder/compiled_step.py), fixed or graphs (decoder/target_steps.py)."""
    if getattr(steps, "compiled", None) is not None:
        return "compiled"
    if getattr(steps, "records_graphs", False):
        return "graphs" if type(steps).__name__ == "GraphTarget" else "compiled"
    return "eager" if type(steps).__name__ == "EagerTarget" else "fixed"
