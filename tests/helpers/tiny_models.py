"""Tiny random models, one builder a family, built in-process: there is no model hub here, so every model is a
few-thousand-parameter random network made from a config, over the byte vocabulary of helpers.tokenizers, in
fp32, in eval mode, on TEST_DEVICE. Everything is seeded.

Llama, GPT-2 and Gemma-3 (tiny_llama, tiny_gpt2, tiny_gemma3) take their sizes as arguments and keep HF's
initialization. The Llama's config is the installed harness's (harness/stress/wire.py's tiny_llama_config), whose
stress checks save the same tiny Llama for `specdec stress`. The other families' builders are
`tiny_<family>(seed=0, **overrides)`: a config of the family at test size (hidden 32, 4 heads over 2 key-value
heads), any field overridden by keyword. HF initializes biases to zero and norms to their identity, which would hide
a bias or a norm applied the wrong way, so these builders then draw them at random (seeded) too.
"""

from __future__ import annotations

import copy
import os

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GPT2Config,
    MistralConfig,
    PretrainedConfig,
    Qwen2Config,
    Qwen3Config,
    Starcoder2Config,
)

from helpers.tokenizers import BOS, BYTE_VOCAB, EOS
from speccomplete.harness.stress.wire import tiny_llama_config

# Where the tiny models live: the CPU, or `SPECDEC_TEST_DEVICE=cuda` for the decoder tests' CUDA run
# (gpu/step.sh tests). Models built here carry their device, so decoders on them follow it.
TEST_DEVICE = torch.device(os.environ.get("SPECDEC_TEST_DEVICE", "cpu"))


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
    config = tiny_llama_config(vocab=vocab, layers=layers, hidden=hidden, init=init, max_pos=max_pos, eos=eos, bos=bos)
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


GEMMA3_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


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
        layer_types=list(GEMMA3_LAYER_TYPES),
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


# --------------------------------------------------------------------------- the other families: biases and norms drawn

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


def _build_drawn(config_class: type[PretrainedConfig], seed: int, fields: dict, overrides: dict):
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
    return _build_drawn(Qwen2Config, seed, {"use_sliding_window": False}, overrides)


def tiny_qwen3(seed: int = 0, **overrides):
    """Qwen3: RMS norms over each head's queries and keys; no biases (`attention_bias=False`)."""
    return _build_drawn(Qwen3Config, seed, {"head_dim": 8, "use_sliding_window": False}, overrides)


def tiny_mistral(seed: int = 0, **overrides):
    """Mistral: Llama's layer with a sliding window (None: full attention; pass e.g. `sliding_window=8`)."""
    return _build_drawn(MistralConfig, seed, {"sliding_window": None}, overrides)


def tiny_gemma(seed: int = 0, **overrides):
    """Gemma 1 (CodeGemma's architecture): RMS norms by 1 + w, embeddings scaled by sqrt(hidden), GELU-tanh
    gated MLP, tied head."""
    return _build_drawn(GemmaConfig, seed, {"head_dim": 8}, overrides)


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
    return _build_drawn(Gemma2Config, seed, fields, overrides)


def tiny_starcoder2(seed: int = 0, **overrides):
    """StarCoder2: LayerNorm with biases, biases on q, k, v and o, a plain GELU MLP (c_fc, c_proj), tied head;
    full attention unless `sliding_window` is given."""
    return _build_drawn(Starcoder2Config, seed, {"sliding_window": None, "use_bias": True}, overrides)


FAMILY_BUILDERS = {
    "qwen2": tiny_qwen2,
    "qwen3": tiny_qwen3,
    "mistral": tiny_mistral,
    "gemma": tiny_gemma,
    "gemma2": tiny_gemma2,
    "starcoder2": tiny_starcoder2,
}
