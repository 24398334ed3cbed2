"""The target model with its KV cache: feed tokens, get logits, roll back. Three ways to run it.

- `EagerTarget` (the CPU default): a cache that grows in place (kv_cache.PreallocatedLayer), and
  every forward pass has the shape of its input. Attention spans only the tokens held.
- `GraphTarget` (graph_target.py, the CUDA default): our own forward at fixed shapes, recorded as CUDA
  graphs directly; ring buffers for sliding-window layers; ready in seconds.
- `FixedShapeTarget` (`fixed`, and `compiled`: CUDA for a family graph_target.py does not run): a cache
  of fixed capacity at fixed addresses, and every forward pass of up to `max_rows` tokens padded to one
  row or to `max_rows` (row_buckets). Two shapes are what lets `torch.compile(mode="reduce-overhead")`
  capture each as a CUDA graph, as gpt-fast does, so a step is one graph launch instead of hundreds of
  kernel launches from Python. The write position is a device tensor read inside the graph; rolling back
  sets it, and nothing is copied. Padding rows write past the real end, where the causal mask hides them
  until real tokens overwrite them. A SelfDrafter's steps, which return hidden states instead of logits,
  get graphs of their own.

All know which tokens their cache holds, so any decoder may pick up where another left off, and
a request sharing a prefix with the last one feeds only the rest. With `taps` (an EAGLE-3 draft's
layer ids, drafts/eagle3/model.py) all also keep, for every token held, the target's states entering
those layers, taken from the same forward passes and cut back with the cache (`features`).

On the CPU fixed shapes do not pay: attention over the whole capacity costs more than over the
tokens held, and compiling gained nothing there (docs/benchmarks/README.md, decisions).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from . import compiled_step, graph_target, lean_forward
from .compiled_step import CompiledStep
from .graph_target import GraphTarget
from .kv_cache import (
    forward_hidden_tapped,
    forward_logits,
    forward_tapped,
    keep_first,
    keep_rows,
    lean_logits_tapped,
    new_cache,
)
from .lean_forward import ROW_BY_ROW_MAX
from .models import STEPS
from .step_shapes import TappedStates, row_buckets, verify_by_logits
from .tree import DraftTree

log = logging.getLogger(__name__)

# Tokens a fixed-shape cache holds unless the model's context window is shorter: a long editor
# prompt and its completion, in 75 MB of bf16 keys and values for Gemma-3-270M.
FIXED_CAPACITY = 4096


def context_window(config) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    return None


class EagerTarget:
    capacity: int | None = None  # grows as needed; the model's context window is the limit
    # False: eager steps run the model's own modules, so use_cpu_kernels packs their linears and int8 may run
    # (decoder/loader.py), and the drafters record no graphs for them (engine)
    records_graphs = False
    verify_greedy = verify_by_logits

    def __init__(self, model, taps: tuple[int, ...] = ()):
        self.model = model
        self.cache = new_cache()
        self.tokens: list[int] = []  # the tokens whose keys and values the cache holds, in order
        self.features = TappedStates(tuple(taps)) if taps else None
        # the same steps compiled (compiled_step.py), installed between two requests once built; None: eager
        self.compiled: CompiledStep | None = None

    def keep_states(self, taps: tuple[int, ...]) -> None:
        """From now on keep the states entering layers `taps` (an EAGLE-3 draft's); the cache is
        emptied, since the tokens it holds have none kept."""
        if self.features is None or self.features.taps != taps:
            self.features = TappedStates(taps)
            self.compiled = None  # built for other taps
            self.truncate(0)

    def forward(self, ids: list[int], keep: int) -> torch.Tensor:
        """Append `ids`; returns the logits of the last `keep` of them."""
        logits, states = self._append(
            ids,
            lambda compiled: compiled.logits(self.cache, ids, keep),
            lambda: forward_tapped(self.model, self.cache, ids, keep, self._taps()),
        )
        if self.features is not None:
            self.features.append(states)
        return logits

    def hidden(self, ids: list[int]) -> torch.Tensor:
        """Append `ids`; returns their final hidden states, the head not applied (drafts.SelfDrafter)."""
        hidden, states = self._append(
            ids,
            lambda compiled: compiled.hidden(self.cache, ids),
            lambda: forward_hidden_tapped(self.model, self.cache, ids, self._taps()),
        )
        if self.features is not None:
            self.features.append(states)
        return hidden

    def feed(self, ids: list[int]) -> None:
        """Append `ids` and compute no logits (a prefill's chunks before its last)."""
        self.hidden(ids)

    @property
    def runs_trees(self) -> bool:
        """Whether `forward_tree` runs here (the lean forward's families)."""
        return lean_forward.supports(self.model)

    def forward_tree(self, tree: DraftTree, root: int) -> torch.Tensor:
        """Append `root` (the last committed token) and the tree's nodes, each attending to the cache and its own
        ancestors (decoder/tree.py); returns the logits of every row. `keep_path` then keeps the accepted path."""
        ids = [root, *tree.tokens]
        shape = tree.shape(self.model.device)
        logits, states = self._append(
            ids,
            lambda compiled: compiled.logits(self.cache, ids, len(ids), shape),
            lambda: lean_logits_tapped(
                self.model, self.cache, torch.tensor([ids], device=self.model.device), len(ids), self._taps(), shape
            ),
        )
        if self.features is not None:
            self.features.append(states)
        return logits

    def tree_rows(self) -> int:
        """The most rows a tree's verify may have here: those the compiled step covers, when there is one (a
        longer feed would run eagerly, whose rows need not equal the compiled one-row steps bit for bit); else
        those attended row by row (lean_forward.ROW_BY_ROW_MAX)."""
        return self.compiled.max_rows if self.compiled is not None else ROW_BY_ROW_MAX

    def keep_path(self, start: int, rows: list[int]) -> None:
        """After `forward_tree` onto `start` tokens: hold those, then the tree rows `rows` (ascending; row 0 is
        the root), and nothing else."""
        kept = torch.tensor(rows, dtype=torch.long, device=self.model.device)
        keep_rows(self.cache, start, kept)
        if self.features is not None:
            self.features.keep_rows(start, kept)
        self.tokens[start:] = [self.tokens[start + row] for row in rows]

    def use_compiled(self, compiled: CompiledStep | None) -> None:
        """Run short feeds on `compiled` from now on (None: eagerly again); call it between two requests."""
        if compiled is not None and (compiled.model is not self.model or compiled.taps != self._taps()):
            raise ValueError("a compiled step runs the model and taps it was built for")
        self.compiled = compiled

    def _taps(self) -> tuple[int, ...]:
        return self.features.taps if self.features is not None else ()

    def _append(self, ids: list[int], run_compiled, run_eager):
        compiled = self.compiled
        try:
            if compiled is not None and compiled.covers(len(ids), self.cache):
                try:
                    out = run_compiled(compiled)
                except RuntimeError as e:  # the package refused the feed (it sets the cache's length only after)
                    log.warning("compiled step failed on %d rows; eager steps from now on: %s", len(ids), e)
                    self.compiled = None
                    out = run_eager()
            else:
                out = run_eager()
        except BaseException:
            self.truncate(0)  # a forward that raised may have written some layers and not others
            raise
        self.tokens += ids
        return out

    def truncate(self, length: int) -> None:
        """Forget every token past the first `length`."""
        del self.tokens[length:]
        if self.features is not None:
            self.features.truncate(length)
        if not self.tokens:
            self.cache = new_cache()  # also lets go of a long past prompt's buffers
        else:
            keep_first(self.cache, length)


class FixedLayer(CacheLayerMixin):
    """One layer's keys and values in buffers allocated once; every write starts at the shared `start`."""

    is_compileable = True
    is_sliding = False  # holds every position; a sliding window is applied by the attention mask

    def __init__(self, capacity: int, start: torch.Tensor):
        super().__init__()
        self.capacity = capacity
        self.start = start  # 0-dim long tensor on the model's device, shared by every layer

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.keys = key_states.new_zeros(*key_states.shape[:2], self.capacity, key_states.shape[3])
        self.values = value_states.new_zeros(*value_states.shape[:2], self.capacity, value_states.shape[3])
        if not torch.compiler.is_compiling():
            # a captured graph reads and writes these very buffers
            torch._dynamo.mark_static_address(self.keys)
            torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self.keys is not None and self.values is not None  # allocated by lazy_initialization
        where = self.start + torch.arange(key_states.shape[-2], device=self.start.device)
        self.keys.index_copy_(2, where, key_states)
        self.values.index_copy_(2, where, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, *args) -> tuple[int, int]:
        return self.capacity, 0  # attention spans the whole buffer; the causal mask hides what is past the end

    def get_seq_length(self) -> torch.Tensor:  # type: ignore[override]  # deliberately not the base's int
        return self.start  # a tensor, so a captured graph reads the position instead of baking it in

    def get_max_length(self) -> int:
        return self.capacity


class FixedShapeTarget:
    verify_greedy = verify_by_logits

    def __init__(self, model, capacity: int, max_rows: int, compile: bool = False, taps: tuple[int, ...] = ()):
        """capacity: the tokens the cache holds at most. max_rows: the most tokens a round feeds
        (γ + 1); a longer feed (a prefill) runs eagerly at its own shape.
        compile: capture each row count with torch.compile (CUDA graphs on CUDA).
        taps: layer ids whose input states every forward also keeps (`features`)."""
        if capacity < 1 or max_rows < 1:
            raise ValueError(f"need capacity >= 1 and max_rows >= 1, got {capacity} and {max_rows}")
        self.model = model
        self.capacity = capacity
        self.buckets = row_buckets(max_rows)
        self.start = torch.zeros((), dtype=torch.long, device=model.device)
        torch._dynamo.mark_static_address(self.start)
        layers = model.config.get_text_config().num_hidden_layers
        # room past the capacity for padding rows that start at its very end
        self.cache = Cache(layers=[FixedLayer(capacity + max_rows, self.start) for _ in range(layers)])
        with torch.inference_mode():  # allocate the buffers now, outside any graph (decoding runs in this mode)
            forward_logits(model, self.cache, [0], keep=1)
        self.tokens: list[int] = []  # the tokens whose keys and values the cache holds, in order
        self.features = TappedStates(tuple(taps)) if taps else None
        # compiled: the graphs run the stock weights, so nothing packs them (decoder/loader.py), and the drafters
        # record their own graphs beside them (engine); not compiled: as EagerTarget
        self.records_graphs = compile
        self._padded_logits, self._padded_hidden = self._logits_forward, self._hidden_forward
        if compile:
            graphs: dict[str, Any] = dict(mode="reduce-overhead", fullgraph=True, dynamic=False)
            self._padded_logits = torch.compile(self._logits_forward, **graphs)
            self._padded_hidden = torch.compile(self._hidden_forward, **graphs)

    def keep_states(self, taps: tuple[int, ...]) -> None:
        """EagerTarget.keep_states; compiled steps must be built with their taps (target_steps)."""
        if self.features is not None and self.features.taps == taps:
            return
        if self.records_graphs:
            raise ValueError(f"compiled target steps keep states of layers {taps} only if built with those taps")
        self.features = TappedStates(taps)
        self.truncate(0)

    def _logits_forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        taps = self.features.taps if self.features is not None else ()
        return forward_tapped(self.model, self.cache, input_ids, input_ids.shape[1], taps)

    def _hidden_forward(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        taps = self.features.taps if self.features is not None else ()
        return forward_hidden_tapped(self.model, self.cache, input_ids, taps)

    def forward(self, ids: list[int], keep: int) -> torch.Tensor:
        """Append `ids`; returns the logits of the last `keep` of them."""
        taps = self.features.taps if self.features is not None else ()
        if len(ids) > self.buckets[-1]:
            logits, states = self._append_unpadded(ids, lambda: forward_tapped(self.model, self.cache, ids, keep, taps))
        else:
            logits, states = self._append_padded(ids, self._padded_logits, keep)
        if self.features is not None:
            self.features.append(states)
        return logits

    def hidden(self, ids: list[int]) -> torch.Tensor:
        """Append `ids`; returns their final hidden states, the head not applied (drafts.SelfDrafter)."""
        taps = self.features.taps if self.features is not None else ()
        if len(ids) > self.buckets[-1] or not self.records_graphs:  # eager: the feed's own shape is cheapest
            hidden, states = self._append_unpadded(
                ids, lambda: forward_hidden_tapped(self.model, self.cache, ids, taps)
            )
        else:
            hidden, states = self._append_padded(ids, self._padded_hidden, len(ids))
        if self.features is not None:
            self.features.append(states)
        return hidden

    def feed(self, ids: list[int]) -> None:
        """Append `ids` and compute no logits (a prefill's chunks before its last); eagerly at their
        own shape, as a long prefill runs, so no graph is captured for them."""
        taps = self.features.taps if self.features is not None else ()
        _, states = self._append_unpadded(ids, lambda: forward_hidden_tapped(self.model, self.cache, ids, taps))
        if self.features is not None:
            self.features.append(states)

    def _append_unpadded(self, ids: list[int], run):
        self._start_at_end(len(ids))
        out = run()
        self.tokens += ids
        return out

    def _append_padded(self, ids: list[int], padded, keep: int):
        """Feed `ids` padded to a row bucket; `padded` returns (rows, tapped states or None): returns
        its rows for the last `keep` of them, and the states of every row fed."""
        n = len(ids)
        self._start_at_end(n)
        rows = next(b for b in self.buckets if b >= n)
        input_ids = torch.tensor([ids + ids[-1:] * (rows - n)], device=self.model.device)
        if self.records_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        rows, states = padded(input_ids)
        # copies: the next replay of a captured graph overwrites its outputs
        out = (rows[n - keep : n].clone(), None if states is None else states[:n].clone())
        self.tokens += ids
        return out

    def _start_at_end(self, n: int) -> None:
        if len(self.tokens) + n > self.capacity:
            raise ValueError(f"{len(self.tokens) + n} tokens do not fit a cache of {self.capacity}")
        self.start.fill_(len(self.tokens))

    def truncate(self, length: int) -> None:
        """Forget every token past the first `length`: the next forward writes over them (also
        over what a forward that raised may have written)."""
        del self.tokens[length:]
        if self.features is not None:
            self.features.truncate(length)

    @torch.inference_mode()  # as in decoding: a graph compiled outside it would be compiled again
    def warm_up(self, hidden: bool = False) -> None:
        """Run every row count once, so that compiling happens now and not in a user's first requests;
        hidden: the hidden-state steps too (a SelfDrafter's)."""
        for rows in self.buckets:
            self.forward([0] * rows, keep=1)
            self.truncate(0)
            if hidden:
                self.hidden([0] * rows)
                self.truncate(0)


# any of the three: what a decoder and its drafters run the target on
Steps = EagerTarget | FixedShapeTarget | GraphTarget


def steps_mode(mode: str, model) -> str:
    """Resolve auto: on CUDA our forward on recorded graphs where it runs the family (graph_target.py), else
    torch.compile's; eager elsewhere."""
    if mode not in STEPS:
        raise ValueError(f"unknown target steps {mode!r}; use {', '.join(STEPS)}")
    if mode == "auto" and model.device.type == "cuda":
        return "graphs" if graph_target.supports(model) else "compiled"
    return "eager" if mode == "auto" else mode


def target_steps(model, mode: str, max_rows: int, hidden: bool = False, taps: tuple[int, ...] = ()) -> Steps:
    """mode: one of STEPS. Graph and compiled steps record or compile their graphs here, one per row count
    (graphs: and per span), and with `hidden` (a drafter feeds the target's hidden-state steps) as many more
    for those. taps: layer ids whose input states the steps keep for an EAGLE-3 draft (Drafter.target_taps).
    Graph steps that `auto` chose and that fail to record give way to compiled ones, with a warning."""
    resolved = steps_mode(mode, model)
    if resolved == "eager" or (resolved == "compiled" and compiled_step.supports(model)):
        return EagerTarget(model, taps)  # on the CPU, compiled: eager until the loader compiles them (loader.py)
    capacity = min(context_window(model.config) or FIXED_CAPACITY, FIXED_CAPACITY)
    if resolved == "graphs":
        try:
            graphs = GraphTarget(model, capacity, max_rows, taps=taps)
            graphs.warm_up(hidden)
            return graphs
        except Exception:
            if mode != "auto":
                raise
            log.warning("graph steps failed to record; the target runs on compiled steps", exc_info=True)
            resolved = "compiled"
    steps = FixedShapeTarget(model, capacity, max_rows, compile=resolved == "compiled", taps=taps)
    if steps.records_graphs:
        steps.warm_up(hidden)
    return steps
