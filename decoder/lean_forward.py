"""A lean forward pass for Llama-like decoders in fp32, for eager decoding (gpt-fast's model.py in spirit).

HF's forward is general, and a decode step pays for that on every call: it builds attention
masks and rotary embeddings through layers of helpers, each module call goes through hooks and
keyword plumbing, and each RMSNorm is six operations. This forward runs the same modules'
weights, and the packed products of kernels.py where they are packed, through a few calls a
layer: `F.rms_norm`, rotary tables made once a forward, one mask per window for a multi-token
feed, and SDPA over grouped keys and values. Its logits equal HF's (tests/decoder/test_lean_forward.py),
and a step costs less, the more so the more layers a model has (docs/cpu.md).

The families it runs (decoder/families.py, one record each) differ in a few facts, read from their record or
from the modules themselves: the kind of norm, Gemma's norms after attention and MLP, a sliding window per layer or
for the whole model, soft-capped attention logits (Gemma 2: attended by hand, since SDPA cannot cap).
Biases (Qwen2's q, k and v; StarCoder2's everywhere), q and k norms (Qwen3, Gemma-3), the MLP (gated, or
StarCoder2's plain GELU), Gemma's embedding scale and Gemma 2's final soft-cap are the modules' and the
head's own (kv_cache.head_logits), called as they are.

decoder/compiled_step.py compiles this same forward for short feeds; traced, its attention is one opaque
operator a layer (`attend_tree_rows`, a chain being a tree of one path), so that the graph has no branch on
the cache's length.

Only what it was checked against runs here: fp32, rotary embeddings fixed at load ("default" or
"linear"), attention soft-capping only where the family's was checked (Gemma 2), causal attention, and
the model's own forward (not replaced on the instance, no hooks on it or on the parts it recomputes).
Anything else keeps HF's forward.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from transformers.cache_utils import Cache

from . import attend_rows, torch_ops
from .families import BY_MODEL, Family
from .tree import paths_of

if TYPE_CHECKING:
    from .tree import TreeShape

_FIXED_ROPE = {"default", "linear"}


def family_of(model) -> Family | None:
    """The facts of `model`'s family (a causal LM), None for a family this forward does not run."""
    return BY_MODEL.get(type(getattr(model, "base_model", None)).__name__)


def supports(model, dtypes: tuple[torch.dtype, ...] = (torch.float32,)) -> bool:
    """Whether `model` (a causal LM; any other module: False) runs on this forward; `dtypes`: the
    weights it takes (decoder/graph_target.py runs the same families in bf16 too)."""
    family = family_of(model)
    if family is None or model in _HF_ONLY or model.dtype not in dtypes:
        return False
    if model not in _REPLACED:
        _REPLACED[model] = tuple(_replaced_modules(model))
    if _customized(model) or any(map(_customized, _REPLACED[model])):
        return False
    config = model.config
    if getattr(config, "attn_logit_softcapping", None) and not family.attention_softcap:
        return False
    if getattr(config, "use_bidirectional_attention", False):
        return False
    rope = model.base_model.rotary_emb.rope_type
    return all(kind in _FIXED_ROPE for kind in (rope.values() if isinstance(rope, dict) else [rope]))


def attend_row_by_row(model) -> None:
    """Attend for each row of a short feed (a verify) separately, over exactly the keys a one-row step
    at its position sees, so its result is the step's bit for bit. Batched attention sums in another
    order (about 1e-7 apart), harmless in fp32 but not before int8 activations, where it can move a
    value across a rounding step (kernels.Int8Linear); loaders set it for int8 targets."""
    _ROW_BY_ROW.add(model)


# a feed of at most this many rows attends row by row (a verify is 2 to γ+1 rows); a prefill attends batched
ROW_BY_ROW_MAX = 32
_ROW_BY_ROW: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
EACH_ROW = "each row"  # the attention "mask" of a feed attended row by row


def keep_hf_forward(model) -> None:
    """Run `model` on HF's forward whatever it is (the bench's ablation row for this forward)."""
    _HF_ONLY.add(model)


_HF_ONLY: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def _replaced_modules(model):
    """The modules below `model` whose forward this one stands in for (it calls the projections, MLPs and
    embeddings as they are). Not `model` itself: held in _REPLACED's value, it would keep its own key, and so the
    model, alive for good."""
    base = model.base_model
    yield from (module for module in (base, base.rotary_emb, base.norm) if module is not model)
    for layer in base.layers:
        yield from (layer, layer.self_attn)
        for owner, names in ((layer, _LAYER_NORMS), (layer.self_attn, ("q_norm", "k_norm"))):
            yield from (norm for norm in (getattr(owner, name, None) for name in names) if norm is not None)


# model -> its _replaced_modules, which packing leaves in place (weakly keyed: a model dropped is freed)
_REPLACED: weakref.WeakKeyDictionary[torch.nn.Module, tuple[torch.nn.Module, ...]] = weakref.WeakKeyDictionary()
_LAYER_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


def _customized(module) -> bool:
    """A forward replaced on the instance, or hooked: what it does is no longer the class's."""
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return "forward" in vars(module) or any(not _records_outputs(hook) for hook in hooks)


def _records_outputs(hook) -> bool:
    """transformers' own output-recording hook: installed by the first forward asked for hidden states
    (an EAGLE-3 draft's features on HF's forward) and left in place, it records only while HF's own
    forward collects and never changes an output, so it is no reason to give up this forward."""
    return getattr(hook, "__module__", "") == "transformers.utils.output_capturing"


def lean_hidden(
    model,
    cache: Cache,
    input_ids: torch.Tensor,
    taps: tuple[int, ...] = (),
    tapped: list | None = None,
    tree: TreeShape | None = None,
) -> torch.Tensor:
    """Append `input_ids` [1, T] to `cache` (whose layers hold only real tokens); returns the final
    hidden states [T, hidden], as `model.base_model(...).last_hidden_state[0]` would.

    taps: layer ids whose input states [T, hidden] are appended to `tapped` as they go by (id k:
    the state entering layer k; the number of layers: the final, normed, states),
    as HF's output_hidden_states[k] holds them. An EAGLE-3 draft reads them (drafts/eagle3/model.py).
    tree: the rows are a draft tree's (decoder/tree.py): each at its depth's position, attending to the
    cache and its own ancestors; the cache then holds every row, in the tree's order (kv_cache.keep_rows)."""
    base = model.base_model
    family = BY_MODEL[type(base).__name__]
    rows = input_ids.shape[1]
    start = cache.get_seq_length()
    end = start + rows
    positions = torch.arange(start, end, device=input_ids.device) if tree is None else start + tree.depths
    rotary = rotary_tables(base.rotary_emb, positions)
    masks = {}  # window -> [T, end] bool, True where a row may attend; none for one row or row by row
    x = base.embed_tokens(input_ids[0])
    # Traced (compiled_step.py), rows attend row by row through one opaque call a layer, so that the graph
    # neither unrolls its rows nor branches on their count or the cache's length. (The flag is global: an
    # eager feed beside a build attends row by row too, the same numbers as a one-row step's; a prefill
    # stays batched.)
    traced = torch.compiler.is_compiling() and rows <= ROW_BY_ROW_MAX
    row_by_row = traced or (1 < rows <= ROW_BY_ROW_MAX and model in _ROW_BY_ROW)
    for index, layer in enumerate(base.layers):
        if index in taps and tapped is not None:
            tapped.append(x)
        attention = layer.self_attn
        window = layer_window(model, family, attention)
        if not row_by_row and rows > 1 and window not in masks:
            masks[window] = _causal_mask(positions, end, window, tree)
        cos, sin = rotary[None] if None in rotary else rotary[attention.layer_type]
        mask: torch.Tensor | str | TreeRows | None = masks.get(window)
        if row_by_row:
            mask = EACH_ROW if tree is None and not traced else TreeRows(start, _parents(tree, rows, x.device))
        h = _attention(attention, cache, _norm(layer.input_layernorm, x, family), cos, sin, mask, window, end, family)
        if family.sandwich:  # norms after attention and after the MLP too
            x = x + _norm(layer.post_attention_layernorm, h, family)
            h = layer.mlp(_norm(layer.pre_feedforward_layernorm, x, family))
            x = x + _norm(layer.post_feedforward_layernorm, h, family)
        else:
            x = x + h
            x = x + layer.mlp(_norm(layer.post_attention_layernorm, x, family))
    x = _norm(base.norm, x, family)
    if len(base.layers) in taps and tapped is not None:
        tapped.append(x)
    return x


def layer_window(model, family: Family, attention) -> int | None:
    """The tokens a layer's attention looks back over (None: all of them)."""
    window = getattr(model.config, "sliding_window", None) if family.window_in_config else None
    return getattr(attention, "sliding_window", window)


def _norm(norm, x: torch.Tensor, family: Family) -> torch.Tensor:
    # Gemma scales by 1 + w, Llama by w, StarCoder2 centres too and adds a bias; all in fp32, which the model is
    if family.norm == "1+w":
        return F.rms_norm(x, (x.shape[-1],), 1.0 + norm.weight, norm.eps)
    if family.norm == "layer":
        return F.layer_norm(x, (x.shape[-1],), norm.weight, norm.bias, norm.eps)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.variance_epsilon)


def rotary_tables(rotary, positions: torch.Tensor) -> dict:
    """cos and sin [T, 1, head_dim] per layer type (None: the model has one kind of layer)."""
    if isinstance(rotary.rope_type, dict):
        kinds = {
            kind: (getattr(rotary, f"{kind}_inv_freq"), getattr(rotary, f"{kind}_attention_scaling"))
            for kind in rotary.rope_type
        }
    else:
        kinds = {None: (rotary.inv_freq, rotary.attention_scaling)}
    tables = {}
    for kind, (inv_freq, scaling) in kinds.items():
        freqs = positions[:, None].float() * inv_freq.float()
        angles = torch.cat((freqs, freqs), dim=-1)[:, None]
        tables[kind] = (angles.cos() * scaling, angles.sin() * scaling)
    return tables


def _causal_mask(positions: torch.Tensor, end: int, window: int | None, tree: TreeShape | None = None) -> torch.Tensor:
    queries = positions[:, None]
    if tree is None:
        keys = torch.arange(end, device=positions.device)[None]
        mask = keys <= queries
    else:  # the cache before the tree, then the tree's rows: a row's ancestors and itself
        start = end - positions.shape[0]
        keys = torch.cat([torch.arange(start, device=positions.device), positions])[None]
        assert tree.ancestors is not None, "a batched tree feed needs its ancestors"
        cached = torch.ones(len(positions), start, dtype=torch.bool, device=positions.device)
        mask = torch.cat([cached, tree.ancestors], 1)
    return mask & (queries - keys < window) if window else mask


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _attention(
    attention,
    cache: Cache,
    h: torch.Tensor,
    cos,
    sin,
    mask: torch.Tensor | str | TreeRows | None,
    window: int | None,
    end: int,
    family: Family,
) -> torch.Tensor:
    """mask: [T, end] for a batched feed, None for one row, EACH_ROW (attend_row_by_row), TreeRows (a tree's
    rows, row by row)."""
    rows, head_dim = h.shape[0], attention.head_dim
    if (projections := getattr(attention, "projections", None)) is not None:  # q, k and v as one product (int8)
        q, k, v = (p.view(rows, -1, head_dim) for p in projections(h))
    else:
        q = attention.q_proj(h).view(rows, -1, head_dim)
        k = attention.k_proj(h).view(rows, -1, head_dim)
        v = attention.v_proj(h).view(rows, -1, head_dim)
    if hasattr(attention, "q_norm"):  # Qwen3 and Gemma-3 normalize each head's queries and keys
        q, k = _norm(attention.q_norm, q, family), _norm(attention.k_norm, k, family)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    keys, values = cache.update(k.transpose(0, 1)[None], v.transpose(0, 1)[None], attention.layer_idx)
    queries = q.transpose(0, 1)[None]
    scaling, cap = attention.scaling, getattr(attention, "attn_logit_softcapping", None)
    if mask is EACH_ROW:  # each row as the one-row step at its position: its own keys, no mask
        out = _attend_each_row(queries, keys, values, window, end, scaling, cap)
    elif isinstance(mask, TreeRows):  # the same, each at the end of its path; traced: one opaque operator
        attend = _attend_traced if torch.compiler.is_compiling() else _attend_tree_rows
        out = attend(queries, keys, values, window, mask.start, scaling, cap, mask.parents)
    else:
        out = _attend(queries, keys, values, cast(torch.Tensor | None, mask), window, end, scaling, cap)
    return attention.o_proj(out[0].transpose(0, 1).reshape(rows, -1))


def _attend(queries, keys, values, mask, window: int | None, end: int, scale: float, cap: float | None) -> torch.Tensor:
    """SDPA of `queries` over the first `end` keys; with no mask (one row), only the last `window` of them, on the
    attention rows kernel (attend_rows.py) where it runs."""
    if mask is None and attend_rows.usable(queries, keys):
        return attend_rows.attend(queries, keys, values, end - 1, [-1], window, scale, cap)
    start = end - window if mask is None and window and end > window else 0
    keys, values = keys[:, :, start:end], values[:, :, start:end]
    if cap:
        return softcapped_attention(queries, keys, values, mask, scale, cap)
    return F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)


def _attend_each_row(queries, keys, values, window: int | None, end: int, scale: float, cap: float | None):
    """Each of the T rows of `queries` [1, heads, T, d] over its own keys, as a one-row step at its position."""
    rows = queries.shape[2]
    if attend_rows.usable(queries, keys):  # a chain: each row's path is the rows up to it
        return attend_rows.attend(queries, keys, values, end - rows, [*range(-1, rows - 1)], window, scale, cap)
    return torch.cat(
        [
            _attend(queries[:, :, row : row + 1], keys, values, None, window, end - rows + row + 1, scale, cap)
            for row in range(rows)
        ],
        dim=2,
    )


@dataclass(frozen=True)
class TreeRows:
    """The "mask" of rows attended row by row, each at the end of its path: the cache held `start` tokens before
    them, and parents[row] is the row before it on its path (-1: none). A chain's parents are row - 1."""

    start: int
    parents: torch.Tensor


def _parents(tree: TreeShape | None, rows: int, device) -> torch.Tensor:
    return tree.parents if tree is not None else torch.arange(rows, device=device) - 1


def _attend_tree_rows(queries, keys, values, window: int | None, start: int, scale: float, cap, parents):
    """Each row of `queries` [1, heads, T, d] as the one-row step at the end of its path (decoder/tree.py): the
    path's keys and values are put in place right after the cache's `start` tokens, where that step finds them,
    the row attends over exactly those, and the rows are put back as they were. So a row's result is that step's
    bit for bit (attend_row_by_row), for the price of copying a few rows; a chain's paths are in place already.
    The attention rows kernel, where it runs, reads each path where it lies instead."""
    if attend_rows.usable(queries, keys):
        return attend_rows.attend(queries, keys, values, start, parents.tolist(), window, scale, cap)
    rows = queries.shape[2]
    placed = list(range(rows))  # the row whose keys and values sit at start + i
    saved: tuple[torch.Tensor, torch.Tensor] | None = None
    out = []
    for row, path in enumerate(paths_of(parents.tolist())):
        end = start + len(path)
        if placed[: len(path)] != path:
            if saved is None:
                saved = keys[:, :, start : start + rows].clone(), values[:, :, start : start + rows].clone()
            index = torch.tensor(path, device=keys.device)
            keys[:, :, start:end] = saved[0].index_select(2, index)
            values[:, :, start:end] = saved[1].index_select(2, index)
            placed[: len(path)] = path
        out.append(_attend(queries[:, :, row : row + 1], keys, values, None, window, end, scale, cap))
    if saved is not None:
        keys[:, :, start : start + rows] = saved[0]
        values[:, :, start : start + rows] = saved[1]
    return torch.cat(out, dim=2)


def _attend_traced(queries, keys, values, window: int | None, start, scale: float, cap, parents):
    """_attend_tree_rows as one operator in a compiled graph: the attention rows kernel's, called from C++, where
    it runs; else attend_tree_rows, through Python."""
    if torch_ops.attend_rows_op() and attend_rows.usable(queries, keys):
        return torch.ops.specdec.attend_rows(queries, keys, values, start, parents, window, scale, cap)
    return attend_tree_rows(queries, keys, values, window, start, scale, cap, parents)


# Not marked as mutating: the keys and values it moves are put back before it returns, so nothing else sees them.
@torch.library.custom_op("specdec::attend_tree_rows", mutates_args=())
def attend_tree_rows(
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    window: int | None,
    start: int,
    scale: float,
    cap: float | None,
    parents: torch.Tensor,
) -> torch.Tensor:
    """_attend_tree_rows as one operator, which a compiled graph calls as it is instead of unrolling its rows."""
    return _attend_tree_rows(queries, keys, values, window, start, scale, cap, parents)


@attend_tree_rows.register_fake
def _(queries, keys, values, window, start, scale, cap, parents):
    return queries.new_empty(queries.shape)  # contiguous, as torch.cat makes it


def softcapped_attention(queries, keys, values, mask: torch.Tensor | None, scale: float, cap: float) -> torch.Tensor:
    """HF's eager attention with logits soft-capped, cap * tanh(logits / cap) (Gemma 2), which SDPA cannot
    do. Each group of query heads is multiplied by its key-value head as it lies, not by copies of it."""
    batch, heads, rows, head_dim = queries.shape
    kv_heads = keys.shape[1]
    grouped = queries.view(batch, kv_heads, heads // kv_heads, rows, head_dim)
    logits = torch.matmul(grouped, keys[:, :, None].transpose(-1, -2)) * scale
    logits = torch.tanh(logits / cap) * cap
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(logits, dim=-1)
    return torch.matmul(weights, values[:, :, None]).reshape(batch, heads, rows, head_dim)
