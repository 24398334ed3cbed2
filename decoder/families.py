"""The model families our own forward runs: one record each, read by the lean forward (lean_forward.py, its
facts), the int8 kernels (kernels.py, which attention and MLP modules it may fuse), the self draft (drafts/
self_draft.py, whether the head alone makes its logits), the loader's message (loader.py) and docs/models.md.

Adding a family is a record here (checked against its modeling file in transformers), a tiny-config builder in
tests/helpers/tiny_models.py (FAMILY_BUILDERS) and, where it has fill-in-the-middle markers, their tokenizer
(server/prompt.py); tests/decoder/test_families.py runs every record lean and in int8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Family:
    """A family, and where its layer differs from Llama's, as its modeling file in transformers 5 computes it."""

    name: str  # what people call it (docs/models.md)
    model: str  # the base model's class in transformers
    attention: str  # its attention module's class
    gated_mlp: str | None  # its MLP's class where that is down_proj(act_fn(gate_proj(x)) * up_proj(x)); else None
    norm: Literal["w", "1+w", "layer"] = "w"  # RMS norm times w; times 1 + w (Gemma); LayerNorm with bias
    sandwich: bool = False  # norms after attention and after the MLP as well (Gemma 2 and 3)
    window_in_config: bool = False  # every layer slides over config.sliding_window (Mistral, StarCoder2)
    attention_softcap: bool = False  # attention logits soft-capped as the attention module says (Gemma 2)
    logit_softcap: bool = False  # its CausalLM soft-caps the logits by config.final_logit_softcapping where set


FAMILIES = (
    Family("Llama", "LlamaModel", "LlamaAttention", "LlamaMLP"),
    Family("Mistral", "MistralModel", "MistralAttention", "MistralMLP", window_in_config=True),
    # a per-layer window (use_sliding_window) is its attention's sliding_window
    Family("Qwen2", "Qwen2Model", "Qwen2Attention", "Qwen2MLP"),
    Family("Qwen3", "Qwen3Model", "Qwen3Attention", "Qwen3MLP"),
    Family("Gemma", "GemmaModel", "GemmaAttention", "GemmaMLP", norm="1+w"),
    Family(
        "Gemma 2",
        "Gemma2Model",
        "Gemma2Attention",
        "Gemma2MLP",
        norm="1+w",
        sandwich=True,
        attention_softcap=True,
        logit_softcap=True,
    ),
    Family("Gemma 3", "Gemma3TextModel", "Gemma3Attention", "Gemma3MLP", norm="1+w", sandwich=True, logit_softcap=True),
    # its MLP is a plain c_fc, GELU, c_proj
    Family("StarCoder2", "Starcoder2Model", "Starcoder2Attention", None, norm="layer", window_in_config=True),
)

BY_MODEL = {family.model: family for family in FAMILIES}
# the attention modules int8 may fuse q, k and v in: their forward is the lean forward's (kernels.py)
LEAN_ATTENTIONS = frozenset(family.attention for family in FAMILIES)
NAMES = ", ".join(family.name for family in FAMILIES)
