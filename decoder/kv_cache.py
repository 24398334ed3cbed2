"""The KV cache: preallocated per layer, so appending writes in place and rolling back moves an end.

HF's DynamicLayer appends with torch.cat, which copies the layer's whole history on every
forward pass (13% of a profiled Gemma-3 step on the CPU). Here each layer owns a buffer that
doubles when full; the model sees views of its filled part, so attention spans only real
tokens, and crop (rejected drafts, or a new request sharing a prefix) costs nothing. Measured
on the CPU with sleeping OpenMP threads (the server's setting), a step got 6% faster and a
5-token verify 16%; with spinning threads it was a tie (docs/benchmarks/README.md).
Semantics are DynamicLayer's: every layer keeps its full history, sliding-window layers
included (their window is applied by the attention mask), so any crop is possible.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers.cache_utils import Cache, DynamicLayer

from . import lean_forward

if TYPE_CHECKING:
    from .tree import TreeShape

_FIRST_CAPACITY = 512  # tokens; a buffer doubles past it


class PreallocatedLayer(DynamicLayer):
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.length = 0
        self._key_buffer = self._bigger(None, key_states, _FIRST_CAPACITY)
        self._value_buffer = self._bigger(None, value_states, _FIRST_CAPACITY)
        self.is_initialized = True

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int) -> None:
        self._key_buffer = self._bigger(self._key_buffer, key_states, capacity)
        self._value_buffer = self._bigger(self._value_buffer, value_states, capacity)

    def reserve(self, tokens: int) -> None:
        """Room for `tokens` in all (initialized layers only: a buffer's shape comes from its first write)."""
        if self.is_initialized and tokens > self._key_buffer.shape[-2]:
            capacity = max(2 * self._key_buffer.shape[-2], tokens)
            self._grow(self._key_buffer, self._value_buffer, capacity)

    def _bigger(self, old: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
        """A buffer of `capacity` tokens shaped like `like`, holding `old`'s filled part if there is one."""
        new = like.new_empty(*like.shape[:2], capacity, like.shape[3])
        if old is not None:
            new[:, :, : self.length] = old[:, :, : self.length]
        return new

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            self._grow(key_states, value_states, max(2 * self._key_buffer.shape[-2], end))
        self._key_buffer[:, :, self.length : end] = key_states
        self._value_buffer[:, :, self.length : end] = value_states
        self._set_length(end)
        return self.keys, self.values

    def _set_length(self, length: int) -> None:
        self.length = length
        self.keys = self._key_buffer[:, :, :length]
        self.values = self._value_buffer[:, :, :length]

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    @property
    def capacity(self) -> int:
        """Tokens the buffers hold room for."""
        return self._key_buffer.shape[-2]

    @property
    def key_buffer(self) -> torch.Tensor:
        """The whole key buffer, past the filled part too: what a compiled step writes into (compiled_step.py)."""
        return self._key_buffer

    @property
    def value_buffer(self) -> torch.Tensor:
        return self._value_buffer

    def keep_rows(self, start: int, rows: torch.Tensor) -> None:
        """Hold the first `start` tokens and then the rows at `start + rows` (ascending), in that order: a draft
        tree's accepted path after its verify (decoder/tree.py)."""
        if self.is_initialized:
            kept = start + rows
            end = start + rows.numel()
            self._key_buffer[:, :, start:end] = self._key_buffer.index_select(2, kept)
            self._value_buffer[:, :, start:end] = self._value_buffer.index_select(2, kept)
            self._set_length(end)

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last -tokens_to_remove tokens (DynamicLayer's convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative count of tokens to remove, got {tokens_to_remove}")
        if self.is_initialized and tokens_to_remove:
            self._set_length(max(0, self.length + tokens_to_remove))

    def reset(self) -> None:
        if self.is_initialized:
            self._set_length(0)


def new_cache() -> Cache:
    """An empty cache; layers are added as the model first writes to them (any layer indices)."""
    return Cache(layer_class_to_replicate=PreallocatedLayer)


def keep_first(cache: Cache, length: int) -> None:
    """Forget everything `cache` holds past its first `length` tokens (nothing if it holds fewer)."""
    cached = cache.get_seq_length()
    if cached > length:
        cache.crop(length - cached)


def keep_rows(cache: Cache, start: int, rows: torch.Tensor) -> None:
    """PreallocatedLayer.keep_rows in every layer of `cache`."""
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer):
            layer.keep_rows(start, rows)


def set_length(cache: Cache, length: int) -> None:
    """Every layer of `cache` holds its buffers' first `length` tokens: after a compiled step wrote into them."""
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer):
            layer._set_length(length)


def forward_logits(model, cache: Cache, ids: list[int] | torch.Tensor, keep: int) -> torch.Tensor:
    """One forward pass that appends `ids` to `cache`; returns logits for the last `keep` positions.

    `ids` may already be a tensor on the model's device: a token just drafted need not visit the host.
    """
    return forward_tapped(model, cache, ids, keep, ())[0]


def forward_tapped(
    model, cache: Cache, ids: list[int] | torch.Tensor, keep: int, taps: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """forward_logits that also returns the states entering layers `taps` (an EAGLE-3 draft's
    features: drafts/eagle3/model.py), concatenated, [len(ids), len(taps) * hidden]; None without taps.
    The same pass: nothing is computed twice."""
    input_ids = _input_ids(model, ids)
    if _runs_lean(model, cache):
        return lean_logits_tapped(model, cache, input_ids, keep, taps)
    out = model(
        input_ids=input_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=keep,
        output_hidden_states=bool(taps),
    )
    features = torch.cat([out.hidden_states[k][0] for k in taps], dim=-1) if taps else None
    return out.logits[0, -keep:], features


def forward_hidden_tapped(
    model, cache: Cache, ids: list[int] | torch.Tensor, taps: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """forward_logits without the head: the final hidden states of `ids`, [len(ids), hidden], and the states
    entering layers `taps`, as forward_tapped returns them (None without taps)."""
    input_ids = _input_ids(model, ids)
    if _runs_lean(model, cache):
        return lean_hidden_tapped(model, cache, input_ids, taps)
    out = model.base_model(input_ids=input_ids, past_key_values=cache, use_cache=True, output_hidden_states=bool(taps))
    features = torch.cat([out.hidden_states[k][0] for k in taps], dim=-1) if taps else None
    return out.last_hidden_state[0], features


def lean_logits_tapped(
    model, cache: Cache, input_ids: torch.Tensor, keep: int, taps: tuple[int, ...], tree: TreeShape | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """forward_tapped on the lean forward (what compiled_step.py compiles); with `tree`, the rows are a draft
    tree's (lean_forward.lean_hidden)."""
    hidden, tapped = lean_hidden_tapped(model, cache, input_ids, taps, tree)
    return head_logits(model, model.get_output_embeddings(), hidden[-keep:]), tapped


def lean_hidden_tapped(
    model, cache: Cache, input_ids: torch.Tensor, taps: tuple[int, ...], tree: TreeShape | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    tapped: list[torch.Tensor] = []
    hidden = lean_forward.lean_hidden(model, cache, input_ids, taps, tapped, tree)
    return hidden, (torch.cat(tapped, dim=-1) if taps else None)


def reserve(cache: Cache, tokens: int) -> None:
    """Grow every layer's buffers of `cache` (initialized) to hold `tokens` now, before a compiled step."""
    for layer in cache.layers:
        if isinstance(layer, PreallocatedLayer):
            layer.reserve(tokens)


def _input_ids(model, ids: list[int] | torch.Tensor) -> torch.Tensor:
    """[1, len(ids)] on the model's device; a device tensor stays where it is."""
    return ids.view(1, -1) if isinstance(ids, torch.Tensor) else torch.tensor([ids], device=model.device)


def _runs_lean(model, cache: Cache) -> bool:
    """The lean forward needs layers that hold only real tokens (ours): fixed-shape caches (target_steps.py)
    get HF's forward, whose overhead torch.compile removes there. Not a question of whether torch is
    compiling: that flag is global, and a build in another thread (compiled_step.py) sets it."""
    return getattr(cache, "layer_class_to_replicate", None) is PreallocatedLayer and lean_forward.supports(model)


def head_logits(model, head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """Logits of final hidden states through `head` (the model's own, or rows of it), as the model's
    forward makes them: Gemma-2/3 soft-cap theirs."""
    logits = head(hidden)
    cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits
