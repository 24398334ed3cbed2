"""Everything a decode needs, from specs: target, tokenizer, drafter, γ policy, CPU kernels."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .drafts import build_drafter
from .engine import SpeculativeDecoder, round_rows
from .gamma import parse_gamma_policy
from .kernels import pack_linear_weights
from .models import load_model
from .target_steps import target_steps


@dataclass
class LoadedDecoder:
    decoder: SpeculativeDecoder
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    draft_model: PreTrainedModel | None  # None for model-free drafts


def load_decoder(
    target: str,
    draft: str,
    *,
    device: str = "auto",
    dtype: str = "auto",
    gamma: str = "heuristic",
    draft_confidence: float = 0.0,
    pack: bool = True,
    steps: str = "auto",
) -> LoadedDecoder:
    """Load and assemble; `pack` swaps CPU fp32 linears for oneDNN-packed ones (use_cpu_kernels);
    `steps` says how the target runs (decoder/target_steps.py)."""
    policy = parse_gamma_policy(gamma)
    target_model, tokenizer = load_model(target, device=device, dtype=dtype)
    drafter, draft_model = build_drafter(draft, target_model, tokenizer, device=device, dtype=dtype)
    stepper = target_steps(
        target_model,
        steps,
        round_rows(policy, drafter),
        hidden=drafter is not None and drafter.drafts_on_the_target,
        taps=drafter.target_taps if drafter is not None else (),
    )
    if pack:
        use_cpu_kernels(stepper, target_model, draft_model, *(drafter.own_modules if drafter is not None else ()))
    decoder = SpeculativeDecoder(
        target_model, tokenizer, drafter, policy if drafter else None, draft_confidence=draft_confidence, steps=stepper
    )
    return LoadedDecoder(decoder, target_model, tokenizer, draft_model)


def use_cpu_kernels(steps, *models) -> None:
    """oneDNN-packed linears (decoder/kernels.py) for models run on eager steps; compiled steps keep
    the stock linears, which inductor packs itself. Call it after the drafts are built, from the
    target's plain weights."""
    if not steps.compiled:
        pack_linear_weights(*models)
