"""The target on CUDA graphs: our own forward at fixed shapes, recorded once per shape (the CUDA default).

`GraphTarget` has the steps interface of target_steps.py (forward, hidden, feed, truncate, tokens,
features) and runs the lean forward's families (lean_forward.py) in the model's own dtype (bf16 on CUDA),
at batch 1, the way gpt-fast and vLLM run a decode step:

- **One product for q, k and v, one for gate and up.** Each layer's weights are concatenated once; the
  modules' own weights become views into them, so nothing is held twice.
- **A static cache.** Every layer's keys and values live in buffers allocated once. A layer that slides
  over a window of W tokens keeps a ring of W + `extra` slots, written at position mod size: a feed of at
  most `extra` rows overwrites only positions no query of it or of any later feed looks at, even after a
  rollback. A full-attention layer keeps capacity + `extra` slots. Beside the buffers, each slot's position
  (-1: empty) is a device tensor, written with the keys: masks are built from it inside the graph.
- **Attention over the held length.** Full layers attend over a `span` of slots, the smallest of a few
  sizes (`span_buckets`) that holds the feed, not over the whole capacity; the ring layers over their ring.
  The masks are SDPA's `attn_mask`, so its memory-efficient kernel runs, and the query heads that share a
  key-value head are folded into its rows (no key copies for grouped-query attention).
- **Recorded shapes.** A feed of up to `max_rows` tokens is padded to one row or to `max_rows`
  (target_steps.row_buckets) and runs as the `cuda_graphs.Captured` of its (row count, span): one graph
  launch a step. The token ids and the write position are device tensors the graphs read. Padding rows write
  past the real end and are overwritten before anything attends to them; rolling back moves the end and
  copies nothing (a ring's room: up to `extra` positions back from the furthest written). A longer feed (a
  prefill) runs eagerly, the same function, in chunks of `extra` rows. On the CPU the graphs run eagerly
  too, on the same buffers: the tests drive this very code.

Its logits are those of the model's forward in its dtype up to rounding (the norms accumulate in float32,
as HF's do, but multiply by their weight in the model's dtype). A step is few kernels: the queries and keys
of a layer are normed and rotated as one tensor, and the masks and slots are made once a step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import lean_forward
from .cuda_graphs import Captured
from .families import Family
from .kv_cache import head_logits
from .sampling import accept_greedy, verdict
from .step_shapes import TappedStates, row_buckets, verify_by_logits

# Rows beyond the last held token that a ring layer keeps room for: the longest eager feed (a prefill's
# chunk; engine.PREFILL_CHUNK is the same) and at least a verify's rows.
PREFILL_ROWS = 128
# The smallest span a full-attention layer attends over; spans double from it up to the whole buffer.
FIRST_SPAN = 512


def supports(model) -> bool:
    """Whether `model` runs here: a family of the lean forward, in float32, bf16 or float16, on the stock
    linears (not packed for the CPU: decoder/kernels.py)."""
    if not lean_forward.supports(model, dtypes=(torch.float32, torch.bfloat16, torch.float16)):
        return False
    return all(
        type(getattr(owner, name, None)) is torch.nn.Linear
        for layer in model.base_model.layers
        for owner, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj")), (layer.mlp, ("gate_proj", "up_proj")))
        for name in names
        if hasattr(owner, name) or owner is layer.self_attn
    )


def span_buckets(slots: int, first: int = FIRST_SPAN) -> tuple[int, ...]:
    """The spans a full-attention layer attends over: `first` doubling, then the whole buffer."""
    spans = []
    span = first
    while span < slots:
        spans.append(span)
        span *= 2
    return (*spans, slots)


class _Norm:
    """A layer's norm as its family computes it: one kernel, which accumulates in float32 whatever the
    dtype; its weight (Gemma's 1 + w made once, in float32) held in the model's dtype."""

    def __init__(self, module, family: Family):
        self.layer = family.norm == "layer"
        weight = module.weight.detach().float()
        self.weight = (1.0 + weight if family.norm == "1+w" else weight).to(module.weight.dtype)
        self.bias = module.bias.detach() if self.layer else None
        self.eps = getattr(module, "eps", None) or getattr(module, "variance_epsilon", None) or 1e-6

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer:
            return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _merged(*linears: torch.nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The linears' weights (and biases) as one product; each linear's own now views its rows of it."""
    # the same kind of tensor as the weights (made under inference mode or not), which the views replace
    with torch.inference_mode(linears[0].weight.is_inference()):
        weight = torch.cat([linear.weight.detach() for linear in linears])
        biases = [linear.bias for linear in linears]
        bias = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
    if any(b is not None for b in biases) and bias is None:
        raise ValueError("some of the merged projections have a bias and some do not")
    row = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = weight[row : row + rows]
        if bias is not None:
            linear.bias.data = bias[row : row + rows]
        row += rows
    return weight, bias


class _Layer:
    """One decoder layer as this forward runs it."""

    def __init__(self, model, layer, family: Family):
        attention = layer.self_attn
        self.attention = attention
        self.window = lean_forward.layer_window(model, family, attention)
        self.head_dim = attention.head_dim
        self.q_width = attention.q_proj.weight.shape[0]
        self.kv_width = attention.k_proj.weight.shape[0]
        self.qkv, self.qkv_bias = _merged(attention.q_proj, attention.k_proj, attention.v_proj)
        self.heads, self.kv_heads = self.q_width // self.head_dim, self.kv_width // self.head_dim
        # Qwen3's and Gemma-3's per-head norms of queries and keys, applied to both at once: a weight per head
        self.qk_norm: tuple[torch.Tensor, float] | None = None
        if hasattr(attention, "q_norm"):
            q_norm, k_norm = _Norm(attention.q_norm, family), _Norm(attention.k_norm, family)
            if q_norm.eps != k_norm.eps:
                raise ValueError("queries and keys normed with different eps")
            weight = torch.cat([q_norm.weight.expand(self.heads, -1), k_norm.weight.expand(self.kv_heads, -1)])
            self.qk_norm = (weight, q_norm.eps)
        self.layer_type = getattr(attention, "layer_type", None)
        self.softcap = getattr(attention, "attn_logit_softcapping", None)
        self.input_norm = _Norm(layer.input_layernorm, family)
        self.post_attention_norm = _Norm(layer.post_attention_layernorm, family)
        if family.sandwich:
            self.pre_mlp_norm = _Norm(layer.pre_feedforward_layernorm, family)
            self.post_mlp_norm = _Norm(layer.post_feedforward_layernorm, family)
        mlp = layer.mlp
        self.mlp = mlp
        self.gate_up = None
        if hasattr(mlp, "gate_proj") and hasattr(mlp, "up_proj"):
            self.gate_up, self.gate_up_bias = _merged(mlp.gate_proj, mlp.up_proj)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.gate_up is None:  # StarCoder2's plain MLP
            return self.mlp(h)
        gate, up = F.linear(h, self.gate_up, self.gate_up_bias).chunk(2, dim=-1)
        return self.mlp.down_proj(self.mlp.act_fn(gate) * up)


class StaticCache:
    """Every layer's keys and values [kv_heads, slots, head_dim], and per slot count the position each
    slot holds (-1: none yet)."""

    def __init__(self, layers: list[_Layer], capacity: int, extra: int, dtype: torch.dtype, device):
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.positions: dict[int, torch.Tensor] = {}  # slot count -> [slots] long
        for layer in layers:
            full = capacity + extra
            slots = min(full, layer.window + extra) if layer.window else full
            kv_heads = layer.kv_width // layer.head_dim
            self.keys.append(torch.zeros(kv_heads, slots, layer.head_dim, dtype=dtype, device=device))
            self.values.append(torch.zeros(kv_heads, slots, layer.head_dim, dtype=dtype, device=device))
            self.positions.setdefault(slots, torch.full((slots,), -1, dtype=torch.long, device=device))
        self.full_slots = capacity + extra


class GraphTarget:
    """Target steps on recorded CUDA graphs (eager elsewhere): see the module's docstring."""

    # True, on the CPU too (its graphs run eagerly there): its own forward runs each layer's concatenated weights
    # (the modules' are views into them), so nothing packs them (decoder/loader.py), and the drafters record
    # their own graphs beside it (engine)
    records_graphs = True

    def __init__(
        self,
        model,
        capacity: int,
        max_rows: int,
        taps: tuple[int, ...] = (),
        chunk: int = PREFILL_ROWS,
        first_span: int = FIRST_SPAN,
    ):
        """capacity: the tokens the cache holds at most. max_rows: the most tokens a round feeds (γ + 1).
        taps: layer ids whose input states every forward also keeps (`features`). chunk: the rows of an
        eager feed's pieces. first_span: the smallest span (span_buckets; tests make both small)."""
        if capacity < 1 or max_rows < 1:
            raise ValueError(f"need capacity >= 1 and max_rows >= 1, got {capacity} and {max_rows}")
        if not supports(model):
            raise ValueError(f"graph steps run the families of docs/models.md; not {type(model).__name__}")
        family = lean_forward.family_of(model)
        assert family is not None  # supports() said so
        self.model = model
        self.family = family
        self.capacity = capacity
        self.buckets = row_buckets(max_rows)
        self.extra = max(max_rows, chunk)
        self.device = model.device
        base = model.base_model
        with torch.no_grad():
            self.layers = [_Layer(model, layer, family) for layer in base.layers]
            self.final_norm = _Norm(base.norm, family)
        self.cache = StaticCache(self.layers, capacity, self.extra, model.dtype, self.device)
        full = any(keys.shape[1] == self.cache.full_slots for keys in self.cache.keys)
        self.spans = span_buckets(self.cache.full_slots, first_span) if full else (self.cache.full_slots,)
        self.rings = any(keys.shape[1] < self.cache.full_slots for keys in self.cache.keys)
        self.written = 0  # the end of the positions written since the cache was last empty, padding included
        self.ids = torch.zeros(self.extra, dtype=torch.long, device=self.device)
        self.start = torch.zeros((), dtype=torch.long, device=self.device)
        self.drafted = torch.zeros((), dtype=torch.long, device=self.device)  # real drafts in a verdict's feed
        # a verdict comes back through pinned memory: one copy, then one wait
        self._verdict_host = torch.zeros(2 + self.extra, dtype=torch.float64, pin_memory=self.device.type == "cuda")
        self.tokens: list[int] = []  # the tokens whose keys and values the cache holds, in order
        self.features = TappedStates(tuple(taps)) if taps else None
        self.graphs: dict[tuple[str, int, int], Captured] = {}  # (kind, rows, span) -> its graph

    def keep_states(self, taps: tuple[int, ...]) -> None:
        """From now on keep the states entering layers `taps`; the cache is emptied and the graphs,
        which return the states they were recorded with, are recorded again when next used."""
        if self.features is not None and self.features.taps == taps:
            return
        self.features = TappedStates(taps)
        self.graphs.clear()
        self.truncate(0)

    @torch.inference_mode()
    def warm_up(self, hidden: bool = False) -> None:
        """Record every graph now, so that no user request waits for one: every row count at every span,
        for logits, for greedy verdicts and, with `hidden` (a SelfDrafter's steps), for hidden states."""
        for kind in ("logits", "verdict", "hidden") if hidden else ("logits", "verdict"):
            for rows in self.buckets:
                for span in self.spans:
                    self._graph(kind, rows, span)

    def verify_greedy(self, ids: list[int]) -> list[float]:
        """Append `ids` (the last committed token and the drafts after it) and decide the round greedily,
        inside the step's graph: sampling.verdict's values, [n, token, log-probabilities...], read back
        through pinned memory once."""
        n = len(ids)
        if n > self.buckets[-1]:
            return verify_by_logits(self, ids)
        self.drafted.fill_(n - 1)
        out, states = self._replay("verdict", ids)
        self._keep(ids, None, None if states is None else states[:n].clone())
        host = self._verdict_host[: out.shape[0]]
        host.copy_(out, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()
        return host[: 2 + n].tolist()

    def forward(self, ids: list[int], keep: int) -> torch.Tensor:
        """Append `ids`; returns the logits of the last `keep` of them."""
        return self._append(ids, keep, "logits")

    def hidden(self, ids: list[int]) -> torch.Tensor:
        """Append `ids`; returns their final hidden states, the head not applied (drafts.SelfDrafter)."""
        return self._append(ids, len(ids), "hidden")

    def feed(self, ids: list[int]) -> None:
        """Append `ids` and compute no logits (a prefill's chunks before its last)."""
        self._append(ids, 0, "hidden")

    def truncate(self, length: int) -> None:
        """Forget every token past the first `length`: the next feed writes over them. A ring holds the
        window before `length` only if no more than `extra` positions past it were written since: cut
        back further, the steps forget everything (`tokens` says what they hold; the engine feeds the rest)."""
        if self.rings and length < self.written - self.extra:
            length = 0
        if length == 0:
            self.written = 0
        del self.tokens[length:]
        if self.features is not None:
            self.features.truncate(length)

    def _append(self, ids: list[int], keep: int, kind: str) -> torch.Tensor:
        """Feed `ids` after the held tokens; returns the rows ("logits" or "hidden") of the last `keep`
        (copies: a graph's outputs are overwritten by its next replay) and keeps the tapped states."""
        n = len(ids)
        if n > self.buckets[-1]:  # a prefill: eagerly, at its own shape, `extra` rows at a time
            self._check_room(n)
            kept = []
            for begin in range(0, n, self.extra):
                piece = ids[begin : begin + self.extra]
                wanted = begin + len(piece) > n - keep  # the piece holds some of the last `keep` rows
                out = self._eager(piece, kind == "logits" and wanted)
                if wanted:
                    kept.append(out[max(0, n - keep - begin) :])
            return torch.cat(kept) if kept else out[:0]
        out, states = self._replay(kind, ids)
        return self._keep(ids, out[n - keep : n].clone(), None if states is None else states[:n].clone())

    def _replay(self, kind: str, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the graph of `kind` on `ids` padded to a row count; returns its outputs (not yet copied)."""
        n = len(ids)
        self._check_room(n)
        rows = next(bucket for bucket in self.buckets if bucket >= n)
        self.ids[:rows].copy_(torch.tensor(ids + ids[-1:] * (rows - n)))  # from pageable memory: no device sync
        self.start.fill_(len(self.tokens))
        self.written = max(self.written, len(self.tokens) + rows)
        return self._graph(kind, rows, self._span(len(self.tokens) + rows))()

    def _check_room(self, n: int) -> None:
        if n < 1:
            raise ValueError("nothing to feed")
        if len(self.tokens) + n > self.capacity:
            raise ValueError(f"{len(self.tokens) + n} tokens do not fit a cache of {self.capacity}")

    def _eager(self, ids: list[int], logits: bool) -> torch.Tensor:
        self.start.fill_(len(self.tokens))
        self.written = max(self.written, len(self.tokens) + len(ids))
        ids_tensor = torch.tensor(ids, device=self.device)
        out, states = self._forward(ids_tensor, self._span(len(self.tokens) + len(ids)), logits)
        return self._keep(ids, out, states)

    def _keep(self, ids: list[int], out, states: torch.Tensor | None):
        self.tokens += ids
        if self.features is not None and states is not None:
            self.features.append(states)
        return out

    def _span(self, end: int) -> int:
        return next(span for span in self.spans if span >= end)

    def _graph(self, kind: str, rows: int, span: int) -> Captured:
        key = (kind, rows, span)
        if key not in self.graphs:
            with torch.inference_mode():
                self.graphs[key] = Captured(lambda: self._run(kind, rows, span), self.device)
        return self.graphs[key]

    def _run(self, kind: str, rows: int, span: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """What the graph of `kind` computes: a forward of the first `rows` ids; for a verdict, also the
        greedy decision over its real drafts (`drafted`), as sampling.verdict's tensor."""
        out, states = self._forward(self.ids[:rows], span, logits=kind != "hidden")
        if kind == "verdict":
            drafts = self.ids[1:rows]
            out = verdict(out, drafts, accept_greedy(out, drafts, self.drafted))
        return out, states

    def _forward(self, ids: torch.Tensor, span: int, logits: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Write `ids` [rows] at positions start.. into the cache; returns their logits (or final hidden
        states) [rows, ...] and the tapped states [rows, len(taps) * hidden] (None without taps)."""
        rows = ids.shape[0]
        positions = self.start + torch.arange(rows, device=self.device)
        where = {slots: positions % slots for slots in self.cache.positions}  # slot count -> the rows' slots
        for slots, held in self.cache.positions.items():
            held.index_copy_(0, where[slots], positions)
        rotary = {
            kind: (cos.to(self.model.dtype), sin.to(self.model.dtype))
            for kind, (cos, sin) in lean_forward.rotary_tables(self.model.base_model.rotary_emb, positions).items()
        }
        masks: dict[tuple[int, int | None, int], torch.Tensor] = {}  # (span, window, group) -> its mask
        taps = self.features.taps if self.features is not None else ()
        tapped = []
        x = self.model.base_model.embed_tokens(ids)
        for index, layer in enumerate(self.layers):
            if index in taps:
                tapped.append(x)
            slots = self.cache.keys[index].shape[1]
            attended = span if slots == self.cache.full_slots else slots
            key = (attended, layer.window, layer.heads // layer.kv_heads)
            if key not in masks:
                held = self.cache.positions[slots][:attended]
                mask = (held[None] >= 0) & (held[None] <= positions[:, None])
                if layer.window:
                    mask &= positions[:, None] - held[None] < layer.window
                masks[key] = mask.repeat(key[2], 1)
            cos, sin = rotary[None] if None in rotary else rotary[layer.layer_type]
            h = self._attention(index, layer, layer.input_norm(x), cos, sin, where[slots], masks[key], attended)
            if self.family.sandwich:
                x = x + layer.post_attention_norm(h)
                x = x + layer.post_mlp_norm(layer.feed_forward(layer.pre_mlp_norm(x)))
            else:
                x = x + h
                x = x + layer.feed_forward(layer.post_attention_norm(x))
        x = self.final_norm(x)
        if len(self.layers) in taps:
            tapped.append(x)
        out = head_logits(self.model, self.model.get_output_embeddings(), x) if logits else x
        return out, (torch.cat(tapped, dim=-1) if taps else None)

    def _attention(self, index: int, layer: _Layer, h, cos, sin, slots, mask, attended: int) -> torch.Tensor:
        """slots: where each row's keys go in this layer's buffers; mask: [group * rows, attended], the
        rows' mask repeated for the query heads of a key-value head."""
        rows, head_dim = h.shape[0], layer.head_dim
        qkv = F.linear(h, layer.qkv, layer.qkv_bias)
        # queries and keys as one tensor of heads: normed and rotated together
        qk = qkv[:, : layer.q_width + layer.kv_width].view(rows, layer.heads + layer.kv_heads, head_dim)
        v = qkv[:, layer.q_width + layer.kv_width :].view(rows, layer.kv_heads, head_dim)
        if layer.qk_norm is not None:
            weight, eps = layer.qk_norm
            qk = F.rms_norm(qk, (head_dim,), None, eps) * weight
        qk = lean_forward.rotate(qk, cos, sin)
        q, k = qk[:, : layer.heads], qk[:, layer.heads :]
        keys, values = self.cache.keys[index], self.cache.values[index]
        keys.index_copy_(1, slots, k.transpose(0, 1))
        values.index_copy_(1, slots, v.transpose(0, 1))
        keys, values = keys[:, :attended], values[:, :attended]
        kv_heads = layer.kv_heads
        group = layer.heads // kv_heads
        if layer.softcap:
            out = lean_forward.softcapped_attention(
                q.transpose(0, 1)[None], keys[None], values[None], mask[:rows], layer.attention.scaling, layer.softcap
            )[0].transpose(0, 1)
        else:
            # the `group` query heads of a key-value head as rows of one: [kv_heads, group * rows, head_dim]
            grouped = q.view(rows, kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(kv_heads, group * rows, -1)
            out = F.scaled_dot_product_attention(
                grouped[None], keys[None], values[None], attn_mask=mask, scale=layer.attention.scaling
            )[0]
            out = out.view(kv_heads, group, rows, head_dim).permute(2, 0, 1, 3)
        return layer.attention.o_proj(out.reshape(rows, -1))
