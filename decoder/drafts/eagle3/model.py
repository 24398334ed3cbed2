"""EAGLE-3 drafts: one decoder layer that predicts from the target's own hidden states, and their
file format, which is the `speculators` package's, so vLLM and SGLang serve the same folder.

The draft reads three of the target's hidden states per position (`aux_layers`; id k is the
state entering the target's layer k, as vLLM and speculators count), fuses them with `fc` into
one vector g_t, and runs one decoder layer over [embed(x_{t+1}) ; g_t] at position t + 1 to
predict x_{t+2} over a reduced vocabulary. To draft further it feeds its own output state back
in place of g, with the token it just drafted (the "training-time test" of decoder/training/eagle3.py
trains exactly that). The layer is Llama's, with q/k/v widened to take both halves and a second
norm (`hidden_norm`) for the feature half.

Its vocabulary is the target's most frequent code tokens (the shipped trained draft's, 32k of
Gemma-3's 262k): `d2t[i]` is the offset from draft id i to its target id, and `t2d` marks which
target ids the draft can write, as speculators defines them. The head starts as the target's
rows for those ids and stays frozen; a folder whose head equals those rows may leave it out
(`head_from_target` in config.json), and loading takes it from the target again.

On disk, a folder: `config.json` (speculators' Eagle3SpeculatorConfig) and `model.safetensors`
(fc, layers.0.*, norm, lm_head, d2t, t2d; no embeddings: the target's are shared).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..trained import missing_shipped_weights

CONFIG_JSON = "config.json"
WEIGHTS = "model.safetensors"
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose config classes read these folders (tests)


class Eagle3LoadError(ValueError):
    pass


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """Low, middle and high features: speculators' and vLLM's default ids, (2, n // 2, n - 3);
    a target too shallow for those three distinct gets three spread over 0..n."""
    ids = (2, num_layers // 2, num_layers - 3)
    if ids[0] < ids[1] < ids[2]:
        return ids
    if num_layers >= 3:
        return (num_layers // 4, num_layers // 2, num_layers - 1)
    return (0, 1, 2) if num_layers == 2 else (0, 1)


@dataclass(frozen=True)
class Eagle3Shape:
    hidden_size: int  # the target's: the draft adds to its embeddings and reads its states
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_vocab: int
    draft_vocab: int
    aux_layers: tuple[int, ...]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_positions: int = 32768
    # The layer's residual is the feature half after hidden_norm instead of before (speculators' and
    # vLLM's flag of that name). Off by default: it did not train faster here (docs/eagle3.md).
    norm_before_residual: bool = False

    def __post_init__(self):
        # the states are concatenated in layer order, as the target's forward passes them (vLLM does too)
        ids = self.aux_layers
        if not ids or ids[0] < 0 or any(b <= a for a, b in zip(ids, ids[1:])):
            raise ValueError(f"EAGLE-3 aux layer ids must be distinct, ascending and >= 0, got {list(ids)}")

    @classmethod
    def for_target(cls, target, draft_vocab: int, aux_layers: tuple[int, ...] | None = None) -> Eagle3Shape:
        """A draft layer sized for `target`: its width, 64-wide heads, an MLP of 2.7x the width."""
        config = target.config.get_text_config()
        hidden = config.hidden_size
        heads = max(1, hidden // 64)
        return cls(
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=max(1, heads // 4) if heads % 4 == 0 else heads,
            head_dim=64 if hidden >= 64 else hidden,
            intermediate_size=int(round(hidden * 2.7 / 64)) * 64 or 64,
            target_vocab=target.get_output_embeddings().out_features,
            draft_vocab=draft_vocab,
            aux_layers=tuple(aux_layers or default_aux_layers(config.num_hidden_layers)),
            rms_norm_eps=float(getattr(config, "rms_norm_eps", 1e-6)),
            max_positions=int(getattr(config, "max_position_embeddings", 32768)),
        )


class RMSNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(torch.nn.Module):
    # q, k and v read the same rows: on the CPU decoder/kernels.py packs them as one product, `projections`
    fusable_projections = ("q_proj", "k_proj", "v_proj")

    def __init__(self, shape: Eagle3Shape):
        super().__init__()
        s = shape
        self.num_heads, self.num_kv_heads, self.head_dim = s.num_heads, s.num_kv_heads, s.head_dim
        self.q_proj = torch.nn.Linear(2 * s.hidden_size, s.num_heads * s.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(2 * s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(2 * s.hidden_size, s.num_kv_heads * s.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(s.num_heads * s.head_dim, s.hidden_size, bias=False)
        self.projections: torch.nn.Module | None = None

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q [B, H, T, d], k and v [B, Hkv, T, d] of rows x [B, T, 2h], rotated to their positions."""
        b, t, _ = x.shape
        if self.projections is not None:
            q, k, v = self.projections(x)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v


class Eagle3MLP(torch.nn.Module):
    """Llama's MLP; decoder/kernels.py fuses gate and up into one product on the CPU, as in the target."""

    def __init__(self, shape: Eagle3Shape):
        super().__init__()
        self.gate_proj = torch.nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = torch.nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = torch.nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)
        self.act_fn = F.silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    """Llama's decoder layer over [norm(embeds) ; hidden_norm(hidden)]; the residual is the hidden half."""

    def __init__(self, shape: Eagle3Shape):
        super().__init__()
        self.self_attn = Attention(shape)
        self.mlp = Eagle3MLP(shape)
        self.input_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.hidden_norm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size, shape.rms_norm_eps)
        self.norm_before_residual = shape.norm_before_residual

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, cos, sin):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        return self.self_attn.project(x, cos, sin)

    def finish(self, hidden: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """attended [B, H, T, d]: the attention's output before o_proj."""
        b, _, t, _ = attended.shape
        residual = self.hidden_norm(hidden) if self.norm_before_residual else hidden
        x = residual + self.self_attn.o_proj(attended.transpose(1, 2).reshape(b, t, -1))
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3(torch.nn.Module):
    """The draft's own weights; the target's embeddings are passed in (shared, never copied)."""

    def __init__(self, shape: Eagle3Shape):
        super().__init__()
        self.shape = shape
        h = shape.hidden_size
        self.fc = torch.nn.Linear(len(shape.aux_layers) * h, h, bias=False)
        self.layers = torch.nn.ModuleList([Layer(shape)])
        self.norm = RMSNorm(h, shape.rms_norm_eps)
        self.lm_head = torch.nn.Linear(h, shape.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(shape.target_vocab, dtype=torch.bool))
        inv_freq = 1.0 / (shape.rope_theta ** (torch.arange(0, shape.head_dim, 2).float() / shape.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    d2t: torch.Tensor
    t2d: torch.Tensor
    inv_freq: torch.Tensor

    @property
    def layer(self) -> Layer:
        return cast(Layer, self.layers[0])

    @property
    def device(self) -> torch.device:  # read from a buffer: packing (decoder/kernels.py) replaces the linears
        return self.d2t.device

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def set_vocabulary(self, vocab_ids: torch.Tensor, target_head: torch.nn.Linear) -> None:
        """Draft id i writes target id vocab_ids[i] (ascending); the head starts as the target's rows, frozen."""
        ids = vocab_ids.to(torch.long).cpu()
        if len(ids) != self.shape.draft_vocab or bool((ids[1:] <= ids[:-1]).any()):
            raise ValueError(f"need {self.shape.draft_vocab} ascending target ids, got {len(ids)}")
        with torch.no_grad():
            self.d2t.copy_(ids - torch.arange(len(ids)))
            self.t2d.zero_()
            self.t2d[ids] = True
            self.lm_head.weight.copy_(target_head.weight[ids.to(target_head.weight.device)])
        self.lm_head.weight.requires_grad_(False)

    def target_ids(self) -> torch.Tensor:
        """vocab_ids: the target id of each draft id."""
        return torch.arange(self.shape.draft_vocab, device=self.d2t.device) + self.d2t

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [..., T, 1... broadcastable to [B, H, T, d]] for positions [B, T] or [T]."""
        angles = positions[..., None].float() * self.inv_freq
        angles = torch.cat([angles, angles], dim=-1)
        if angles.dim() == 3:  # [B, T, d] -> [B, 1, T, d]
            angles = angles[:, None]
        return angles.cos(), angles.sin()

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's concatenated aux states [..., 3h] -> g [..., h]."""
        return self.fc(features.to(self.dtype))

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))

    # Decoding: a cache of the layer's keys and values, one row per position drafted from.
    def step(
        self,
        embeds: torch.Tensor,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rows [T, h] at `positions` [T] appended to `cache`; each attends to the cache and the rows
        before it, or where `mask` [T, rows held after] says (a draft tree's rows: their paths). Returns the
        layer's output states [T, h] (feed back as `hidden`, or `logits` them)."""
        cos, sin = self.rotary(positions)
        q, k, v = self.layer.qkv(embeds[None], hidden[None], cos, sin)
        keys, values = cache.append(k, v)
        rows, held = q.shape[2], keys.shape[2]
        if mask is None and rows > 1:
            mask = torch.ones(rows, held, dtype=torch.bool, device=q.device).tril(held - rows)
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.layer.finish(hidden[None], attended)[0]

    def step_at(
        self, embeds: torch.Tensor, hidden: torch.Tensor, position: torch.Tensor, slot: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        """One row [1, h] at `position`, written at row `slot` of the cache's buffers (both device tensors
        [1]), attending to every row up to it. The shapes are the buffers', whatever the position, so a CUDA
        graph can record it (decoder/drafts/eagle3/chain.py); the cache's length does not move."""
        cos, sin = self.rotary(position)
        q, k, v = self.layer.qkv(embeds[None], hidden[None], cos, sin)
        keys, values, mask = cache.write_at(slot, k, v)
        attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
        return self.layer.finish(hidden[None], attended)[0]


class KVCache:
    """The draft layer's keys and values [1, Hkv, T, d], in buffers that double when full: a chained step
    writes its one row in place, where concatenating would copy the whole cache every step. Cut by
    moving the end. For decoding only (no autograd through the buffers). The captured chain
    (chain.py) `reserve`s the buffers ahead and writes its rows with `write_at`, at device positions."""

    def __init__(self):
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None
        self._slots: torch.Tensor | None = None  # 0..capacity-1 on the device, for `write_at`'s mask
        self.length = 0

    @property
    def capacity(self) -> int:
        """Rows the buffers hold before they grow (and move)."""
        return 0 if self._keys is None else self._keys.shape[2]

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The whole key and value buffers, rows past `length` included."""
        return None if self._keys is None or self._values is None else (self._keys, self._values)

    def reserve(self, capacity: int, heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        """Buffers of at least `capacity` rows now, keeping the rows held: a recorded graph reads them
        where they are, so they must not move while it is used."""
        if capacity <= self.capacity:
            return
        like = torch.empty(1, heads, 0, head_dim, dtype=dtype, device=device)
        self._keys = _grown(self._keys, like, capacity, self.length)
        self._values = _grown(self._values, like, capacity, self.length)

    def write_at(
        self, slot: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """k, v [1, Hkv, 1, d] written at row `slot` (a device tensor [1]) of the reserved buffers, the
        length unmoved. Returns the whole buffers and the mask [1, 1, 1, capacity] of the rows up to slot."""
        assert self._keys is not None and self._values is not None, "reserve the buffers first"
        self._keys.index_copy_(2, slot, k)
        self._values.index_copy_(2, slot, v)
        if self._slots is None or self._slots.shape[0] != self.capacity or self._slots.device != slot.device:
            self._slots = torch.arange(self.capacity, device=slot.device)
        return self._keys, self._values, (self._slots <= slot).view(1, 1, 1, -1)

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None or not self.length else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None or not self.length else self._values[:, :, : self.length]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.length, self.length + k.shape[2]
        if self._keys is None or self._values is None or end > self._keys.shape[2]:
            capacity = max(end, 2 * (0 if self._keys is None else self._keys.shape[2]), 256)
            self._keys, self._values = _grown(self._keys, k, capacity, start), _grown(self._values, v, capacity, start)
        self._keys[:, :, start:end], self._values[:, :, start:end] = k, v
        self.length = end
        return self._keys[:, :, :end], self._values[:, :, :end]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, max(0, length))


def _grown(buffer: torch.Tensor | None, like: torch.Tensor, capacity: int, keep: int) -> torch.Tensor:
    """A [1, H, capacity, d] buffer holding `buffer`'s first `keep` rows. The rest is zeros, not left
    uninitialized: `write_at`'s attention masks those rows, and a NaN there would survive the mask."""
    bigger = like.new_zeros(*like.shape[:2], capacity, like.shape[3])
    if buffer is not None:
        bigger[:, :, :keep] = buffer[:, :, :keep]
    return bigger


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


# --- the speculators format -------------------------------------------------------------------


def speculators_config(
    shape: Eagle3Shape,
    target_architectures: list[str],
    target_name: str | None,
    speculative_tokens: int,
    head_from_target: bool,
    extra: dict[str, Any] | None = None,
) -> dict:
    """config.json as speculators' Eagle3SpeculatorConfig writes it (a Llama layer config)."""
    layer_config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": shape.hidden_size,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": 1,
        "vocab_size": shape.target_vocab,
        "rms_norm_eps": shape.rms_norm_eps,
        "max_position_embeddings": shape.max_positions,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
    }
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": shape.draft_vocab,
        "eagle_aux_hidden_state_layer_ids": list(shape.aux_layers),
        "target_hidden_size": None,
        "norm_before_residual": shape.norm_before_residual,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "transformer_layer_config": layer_config,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "accept_tolerance": 0.0,
                    "verifier_accept_k": 1,
                }
            ],
            "verifier": {"name_or_path": target_name, "architectures": target_architectures},
        },
        # ours, which speculators and vLLM ignore: how to rebuild what was left out, and provenance
        "head_from_target": head_from_target,
        "specdec": extra or {},
    }


def shape_from_config(config: dict) -> Eagle3Shape:
    try:
        layer = config["transformer_layer_config"]
        rope = layer.get("rope_parameters") or {}
        return Eagle3Shape(
            hidden_size=int(layer["hidden_size"]),
            num_heads=int(layer["num_attention_heads"]),
            num_kv_heads=int(layer.get("num_key_value_heads") or layer["num_attention_heads"]),
            head_dim=int(layer.get("head_dim") or layer["hidden_size"] // layer["num_attention_heads"]),
            intermediate_size=int(layer["intermediate_size"]),
            target_vocab=int(layer["vocab_size"]),
            draft_vocab=int(config["draft_vocab_size"]),
            aux_layers=tuple(int(i) for i in config["eagle_aux_hidden_state_layer_ids"]),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", layer.get("rope_theta", 10000.0))),
            max_positions=int(layer.get("max_position_embeddings", 32768)),
            norm_before_residual=bool(config.get("norm_before_residual", False)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise Eagle3LoadError(f"not an EAGLE-3 config: {e!r}") from e


def read_config(folder: str | Path) -> dict:
    path = Path(folder) / CONFIG_JSON
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise Eagle3LoadError(f"cannot read {path}: {e}") from e
    if not isinstance(config, dict) or config.get("speculators_model_type") != "eagle3":
        raise Eagle3LoadError(f"{path} is not an EAGLE-3 speculators config")
    return config


def is_eagle3_draft(path: str | Path) -> bool:
    try:
        read_config(path)
    except Eagle3LoadError:
        return False
    return True


def save_eagle3(draft: Eagle3, folder: str | Path, config: dict, dtype: torch.dtype = torch.bfloat16) -> None:
    """Write `draft` as a speculators folder; the head is left out where config says it is the target's rows."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {
        name: (t.detach().to(dtype) if t.is_floating_point() else t.detach()).cpu().contiguous()
        for name, t in draft.state_dict().items()
        if not (config.get("head_from_target") and name == "lm_head.weight")
    }
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    (folder / CONFIG_JSON).write_text(json.dumps(config, indent=1) + "\n")


def check_target(shape: Eagle3Shape, target) -> None:
    config = target.config.get_text_config()
    problems = []
    if config.hidden_size != shape.hidden_size:
        problems.append(f"hidden size {config.hidden_size}, the draft's {shape.hidden_size}")
    vocab = target.get_output_embeddings().out_features
    if vocab != shape.target_vocab:
        problems.append(f"vocabulary {vocab}, the draft's {shape.target_vocab}")
    if max(shape.aux_layers) > config.num_hidden_layers:
        problems.append(f"{config.num_hidden_layers} layers, the draft reads layer {max(shape.aux_layers)}")
    if problems:
        raise Eagle3LoadError("the EAGLE-3 draft was made for another target: the target has " + "; ".join(problems))


def load_eagle3(folder: str | Path, target) -> Eagle3:
    """The draft in `folder`, for `target` (checked), on the target's device in the target's dtype."""
    config = read_config(folder)
    shape = shape_from_config(config)
    check_target(shape, target)
    if reason := missing_shipped_weights(folder):
        raise Eagle3LoadError(reason)
    try:
        state = load_file(str(Path(folder) / WEIGHTS))
    except (OSError, ValueError) as e:
        raise Eagle3LoadError(f"cannot read {Path(folder) / WEIGHTS}: {e}") from e
    draft = Eagle3(shape)
    head = target.get_output_embeddings()
    if "lm_head.weight" not in state:
        if not config.get("head_from_target"):
            raise Eagle3LoadError(f"{folder} has no lm_head.weight")
        ids = torch.arange(shape.draft_vocab) + state["d2t"].long()
        state["lm_head.weight"] = head.weight.detach()[ids.to(head.weight.device)].cpu()
    state = {k: v for k, v in state.items() if not k.startswith(("embed_tokens.", "verifier_"))}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise Eagle3LoadError(f"{folder}: weights missing {missing}, unexpected {unexpected}")
    dtype = head.weight.dtype
    return draft.to(device=head.weight.device, dtype=dtype).eval().requires_grad_(False)


def init_from_target(shape: Eagle3Shape, target, vocab_ids: torch.Tensor, seed: int = 0) -> Eagle3:
    """A fresh draft for `target`: small random layer weights, the head set to the target's rows."""
    torch.manual_seed(seed)
    draft = Eagle3(shape)
    std = 0.02
    for name, p in draft.named_parameters():
        if p.dim() == 2 and not name.startswith("lm_head"):
            torch.nn.init.normal_(
                p, std=std / math.sqrt(2) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
            )
    draft.set_vocabulary(vocab_ids, target.get_output_embeddings())
    return draft.to(target.get_output_embeddings().weight.device)
