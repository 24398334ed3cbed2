"""Everything a decode needs, from specs: target, tokenizer, drafter, γ policy, CPU kernels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from . import attend_rows, compiled_step, greedy_rows, int8_rows
from .compiled_step import BuildReport, CompiledStep
from .drafts import build_drafter, parse_draft_spec
from .drafts.eagle3 import compiled as compiled_draft
from .drafts.eagle3.model import Eagle3
from .engine import SpeculativeDecoder, round_rows
from .families import NAMES
from .gamma import parse_gamma_policy
from .kernels import can_int8, default_int8_kernel, int8_full_range, pack_linear_weights
from .lean_forward import attend_row_by_row, supports
from .models import Progress, load_model, parameter_count
from .target_steps import EagerTarget, target_steps

# what the target's linear weights become on the CPU: packed fp32 ("none"), int8 (decoder/kernels.py), or
# "auto": int8 where it is fast (resolve_quantization), since there it was the fastest in the typing replay
# (docs/benchmarks/README.md, section 10)
QUANTIZATIONS = ("auto", "none", "int8")


@dataclass
class LoadedDecoder:
    decoder: SpeculativeDecoder
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    draft_model: PreTrainedModel | None  # None for model-free drafts
    quantization: str = "none"  # what the target's linear weights are: "none" or "int8" (auto resolved)


def load_c_kernels() -> None:
    """Our C kernels (int8_rows.py, attend_rows.py, greedy_rows.py), from their cache or built, before a model
    loads: a small process loads and checks them in milliseconds; once a model is mapped, reading which OpenMP
    runtime torch runs (c_kernels.openmp_runtime) alone takes a fifth of a second, and the attention and decision
    kernels would load at the first decode step, inside the first completion (docs/cpu.md, "What a start costs")."""
    int8_rows.available()
    attend_rows.available()
    greedy_rows.available()


# The share of a load's progress bar a first start's model conversion takes (decoder/models.py); the weights' read,
# the draft and the packing come after it.
CONVERTED = 0.8


def load_decoder(
    target: str,
    draft: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    gamma: str = "heuristic",
    draft_confidence: float = 0.0,
    tree_nodes: int = 0,
    pack: bool = True,
    steps: str = "auto",
    quantization: str = "auto",
    progress: Progress | None = None,
) -> LoadedDecoder:
    """Load and assemble; `pack` swaps CPU fp32 linears for oneDNN-packed ones (use_cpu_kernels), or
    with `quantization` "int8" for int8 ones (a caller that packs later passes it on: the bench);
    `steps` says how the target runs (decoder/target_steps.py); `progress` hears a first run's conversion, then
    each part of the load; `tree_nodes`: the most drafts of a round's draft tree (engine.SpeculativeDecoder), 0 for
    chains."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    policy = parse_gamma_policy(gamma)
    draft_spec = parse_draft_spec(draft)  # a mistyped one fails now, not after the target has loaded
    if pack and device in ("auto", "cpu"):
        load_c_kernels()
    say = progress or (lambda fraction, message: None)
    # A first start's conversion fills the bar up to CONVERTED; the rest of the load says where it is at, so that
    # no part of a start stands still for seconds.
    target_model, tokenizer = load_model(
        target, device=device, dtype=dtype, progress=lambda fraction, message: say(CONVERTED * fraction, message)
    )
    say(0.9, f"loading the draft {draft}")
    drafter, draft_model = build_drafter(draft_spec, target_model, tokenizer, device=device, dtype=dtype)
    stepper = target_steps(
        target_model,
        steps,
        round_rows(policy, drafter),
        hidden=drafter is not None and drafter.drafts_on_the_target,
        taps=drafter.target_taps if drafter is not None else (),
    )
    quantization = resolve_quantization(quantization, target_model, stepper)
    if pack:
        say(0.95, "packing the weights in int8" if quantization == "int8" else "packing the weights")
        use_cpu_kernels(
            stepper,
            target_model,
            draft_model,
            *(drafter.own_modules if drafter is not None else ()),
            int8=quantization == "int8",
        )
    decoder = SpeculativeDecoder(
        target_model,
        tokenizer,
        drafter,
        policy if drafter else None,
        draft_confidence=draft_confidence,
        steps=stepper,
        tree_nodes=tree_nodes,
    )
    if steps == "compiled" and pack and isinstance(stepper, EagerTarget):  # a caller that packs later compiles then
        compiled, _ = compile_steps(decoder, quantization)
        stepper.use_compiled(compiled)
    say(1.0, f"loaded {target}")
    return LoadedDecoder(decoder, target_model, tokenizer, draft_model, quantization)


# `compileStep: auto` compiles a target of at least this many parameters: the smallest coders people run (SmolLM2-135M,
# Gemma-3-270M) and up. Below it a step is a few ms eager, and a build's minute of a core is spent for little.
COMPILE_MIN_PARAMETERS = 100_000_000


def wants_compiled_step(setting: bool | str, decoder) -> bool:
    """Whether the server should build or load `decoder`'s compiled step: `setting` is compileStep (true, false
    or "auto"), and only a decoder that can_compile_steps can."""
    if setting is False or not can_compile_steps(decoder):
        return False
    return setting is True or parameter_count(decoder.target.config) >= COMPILE_MIN_PARAMETERS


def can_compile_steps(decoder) -> bool:
    """Whether compile_steps can compile `decoder`'s steps: our decoder, on eager steps, of a target the lean
    forward runs on the CPU."""
    return (
        isinstance(decoder, SpeculativeDecoder)
        and isinstance(decoder.steps, EagerTarget)
        and compiled_step.supports(decoder.target)
    )


def compile_steps(
    decoder: SpeculativeDecoder, quantization: str, build: Callable[[], None] | None = None
) -> tuple[CompiledStep, BuildReport]:
    """The target's compiled CPU step for every feed `decoder` makes (compiled_step.py), from the disk cache
    or built; slow, so the server calls it off its decode worker and installs the result between two
    requests (EagerTarget.use_compiled). `quantization`: the target's weights, "none" or "int8". Call it
    once they are packed (use_cpu_kernels): the graphs run the modules they were traced with. `build`: where
    no entry is cached, what writes it in another process (compiled_step.build_or_load)."""
    if not can_compile_steps(decoder):
        raise ValueError("compiled CPU steps run eager-step targets of the lean forward's families on the CPU")
    steps = decoder.steps
    drafter = decoder.drafter
    rows = round_rows(decoder.gamma, drafter)
    # the count an idle machine decodes at, not whatever the worker's last request left (IdleCores)
    threads = decoder.idle_cores.ceiling if decoder.idle_cores is not None else None
    compiled, report = compiled_step.build_or_load(
        decoder.target,
        quantization,
        rows,
        threads=threads,
        taps=steps.features.taps if steps.features is not None else (),
        build=build,
    )
    # an EAGLE-3 draft's layer step rides with the target's (the drafter runs it once these steps are installed)
    draft = eagle3_draft(drafter)
    if draft is not None:
        compiled.draft_step, _ = compiled_draft.build_or_load(draft, quantization, rows, threads=threads, build=build)
    return compiled, report


def eagle3_draft(drafter) -> Eagle3 | None:
    """The EAGLE-3 draft among `drafter`'s own modules (alone or behind a lookup), or None."""
    return next((module for module in (drafter.own_modules if drafter else ()) if isinstance(module, Eagle3)), None)


def resolve_quantization(requested: str, target, steps) -> str:
    """Auto is int8 where int8 runs (the CPU, a target of a family the lean forward runs, in float32, eager
    steps) on exact full-range int8 products (the rows kernel, with AVX2 or VNNI; or oneDNN's, with VNNI or
    AMX: int8_full_range), else none."""
    if requested != "auto":
        return requested
    runs = not steps.records_graphs and can_int8(target) and supports(target)
    return "int8" if runs and (int8_rows.available() or int8_full_range()) else "none"


def use_cpu_kernels(
    steps, *models, int8: bool = False, int8_kernel: Callable[[int], str] = default_int8_kernel
) -> None:
    """oneDNN-packed linears (decoder/kernels.py) for models run on eager steps; compiled steps keep
    the stock linears, which inductor packs itself. Call it after the drafts are built, from the
    target's plain weights. The first model is the target: with `int8`, its verify rows also attend
    one by one, so a verify stays bit-equal to one-row steps (lean_forward.attend_row_by_row); `int8_kernel`
    picks each weight's product (kernels.INT8_KERNELS) by its size."""
    if int8:
        target = models[0]
        if steps.records_graphs or not can_int8(target) or not supports(target):
            raise ValueError(
                "int8 weights run on the CPU, with eager steps, for float32 targets of the families in "
                f"docs/models.md ({NAMES})"
            )
        attend_row_by_row(target)
    if not steps.records_graphs:
        pack_linear_weights(*models, int8=int8, int8_kernel=int8_kernel)
