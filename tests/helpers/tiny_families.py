"""Tiny random models of the decoder families beyond conftest's Llama and Gemma-3, built in-process.

Each builder is `tiny_<family>(seed=0, **overrides)`: a config of the family at test size (hidden 32, 4 heads
over 2 key-value heads, the byte vocabulary of conftest's tokenizer), any field overridden by keyword, and a
model in fp32, in eval mode, on conftest's TEST_DEVICE. HF initializes biases to zero and norms to their
identity, which would hide a bias or a norm applied the wrong way, so each builder then draws them at random
(seeded) too.
"""

from __future__ import annotations

import torch
from conftest import BOS, BYTE_VOCAB, EOS, TEST_DEVICE
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    GemmaConfig,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    Starcoder2Config,
)

# what every tiny config shares; a family's builder adds its own fields
_COMMON = {
    "vocab_size": BYTE_VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "pad_token_id": None,
    "initializer_range": 0.05,
}

# the spread of the random biases and of the norms' weights around their identity
BIAS_STD = 0.1
NORM_STD = 0.1


def _build(config_class: type[PretrainedConfig], seed: int, fields: dict, overrides: dict):
    config = config_class(**{**_COMMON, **fields, **overrides})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(BIAS_STD * torch.randn(param.shape, generator=generator))
            elif "norm" in name:  # RMSNorm (w or 1 + w) and LayerNorm weights
                param.add_(NORM_STD * torch.randn(param.shape, generator=generator))
    return model.to(TEST_DEVICE).eval().requires_grad_(False)


def tiny_qwen2(seed: int = 0, **overrides):
    """Qwen2: biases on q, k and v (none on o); no sliding window unless `use_sliding_window=True`."""
    return _build(Qwen2Config, seed, {"use_sliding_window": False}, overrides)


def tiny_qwen3(seed: int = 0, **overrides):
    """Qwen3: RMS norms over each head's queries and keys; no biases (`attention_bias=False`)."""
    return _build(Qwen3Config, seed, {"head_dim": 8, "use_sliding_window": False}, overrides)


def tiny_mistral(seed: int = 0, **overrides):
    """Mistral: Llama's layer with a sliding window (None: full attention; pass e.g. `sliding_window=8`)."""
    return _build(MistralConfig, seed, {"sliding_window": None}, overrides)


def tiny_gemma(seed: int = 0, **overrides):
    """Gemma 1 (CodeGemma's architecture): RMS norms by 1 + w, embeddings scaled by sqrt(hidden), GELU-tanh
    gated MLP, tied head."""
    return _build(GemmaConfig, seed, {"head_dim": 8}, overrides)


GEMMA2_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def tiny_gemma2(seed: int = 0, **overrides):
    """Gemma 2: Gemma's four norms a layer, sliding and full layers alternating, attention logits and final
    logits soft-capped (the family's defaults, 50 and 30), queries scaled by query_pre_attn_scalar**-0.5."""
    fields = {
        "num_hidden_layers": 4,
        "head_dim": 8,
        "sliding_window": 8,
        "layer_types": list(GEMMA2_LAYER_TYPES),
        "query_pre_attn_scalar": 16,  # not head_dim, so a scale taken from head_dim shows
    }
    if "num_hidden_layers" in overrides and "layer_types" not in overrides:
        layers = overrides["num_hidden_layers"]
        fields["layer_types"] = [GEMMA2_LAYER_TYPES[i % 2] for i in range(layers)]
    return _build(Gemma2Config, seed, fields, overrides)


def tiny_starcoder2(seed: int = 0, **overrides):
    """StarCoder2: LayerNorm with biases, biases on q, k, v and o, a plain GELU MLP (c_fc, c_proj), tied head;
    full attention unless `sliding_window` is given."""
    return _build(Starcoder2Config, seed, {"sliding_window": None, "use_bias": True}, overrides)


FAMILY_BUILDERS = {
    "qwen2": tiny_qwen2,
    "qwen3": tiny_qwen3,
    "mistral": tiny_mistral,
    "gemma": tiny_gemma,
    "gemma2": tiny_gemma2,
    "starcoder2": tiny_starcoder2,
}
