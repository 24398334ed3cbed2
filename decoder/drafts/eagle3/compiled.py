"""The EAGLE-3 draft's layer step compiled once per machine and kept on disk, as the target's is
(decoder/compiled_step.py, whose cache protocol and package loading it shares).

Eager, a draft step is a hundred small operators around five products (norms, rotary, the cache's write,
attention, residuals); compiled, they fuse into a few loops around the products, which stay our kernels. The
graph takes the rows' embeddings and previous states, and the draft cache's buffers, reserved at a fixed
capacity, which it writes the new rows' keys and values into in place; how many rows they hold comes in as the
length of an empty tensor, so one graph serves every cache length and up to `max_rows` new rows (a round's
chained token, or the rows its accepted tokens added). The head (one product over the draft's vocabulary) and
a tree's rows (their own mask) run eagerly, as a longer catch-up after a prefill does. The draft's tokens are
proposals the target checks, so the compiled step need not equal the eager one bit for bit: what it changes is
at most which tokens are drafted, never what is committed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ... import compiled_step, torch_ops
from ...compiled_step import BuildReport
from . import model as eagle3_model
from .model import Eagle3, KVCache

log = logging.getLogger(__name__)

FORMAT = 1
# rows the cache's buffers hold for a compiled step: the target's compiled context and a round's rows past it
CAPACITY = compiled_step.CAPACITY + 64


class _Graph(torch.nn.Module):
    """(embeds [T, h], hidden [T, h], held [rows held, 0], keys, values [1, Hkv, CAPACITY, d]) -> the layer's
    output states [T, h], the new rows' keys and values written at rows held.. of the buffers."""

    def __init__(self, draft: Eagle3):
        super().__init__()
        self.draft = draft

    def forward(self, embeds, hidden, held, keys, values):
        draft = self.draft
        start, rows = held.shape[0], embeds.shape[0]
        # row t of the cache is at position t + 1 (Eagle3Drafter)
        cos, sin = draft.rotary(torch.arange(start + 1, start + rows + 1, device=embeds.device))
        q, k, v = draft.layer.qkv(embeds[None], hidden[None], cos, sin)
        end = start + rows
        keys[:, :, start:end].copy_(k)
        values[:, :, start:end].copy_(v)
        # each new row attends to the rows held and the new rows up to itself
        mask = torch.arange(end, device=q.device)[None, :] <= torch.arange(start, end, device=q.device)[:, None]
        attended = F.scaled_dot_product_attention(
            q, keys[:, :, :end], values[:, :, :end], attn_mask=mask, enable_gqa=True
        )
        return draft.layer.finish(hidden[None], attended)[0]


class CompiledDraftStep:
    """Eagle3.step for chains (no mask), compiled for up to `max_rows` new rows onto a cache reserved at CAPACITY."""

    def __init__(self, draft: Eagle3, max_rows: int, threads: int, runner):
        self.draft = draft
        self.max_rows = max_rows
        self.threads = threads  # compiled into the graph
        self._runner = runner

    def reserve(self, cache: KVCache) -> None:
        """Grow `cache`'s buffers to the graph's capacity (they never shrink): call it before the rows go in."""
        shape = self.draft.shape
        cache.reserve(CAPACITY, shape.num_kv_heads, shape.head_dim, self.draft.dtype, self.draft.device)

    def covers(self, rows: int, cache: KVCache) -> bool:
        """Whether `rows` new rows onto `cache` run compiled: few enough, room for them in buffers of the graph's
        capacity, at the thread count it was built for."""
        return (
            rows <= self.max_rows
            and cache.capacity == CAPACITY
            and cache.length + rows <= CAPACITY
            and torch.get_num_threads() == self.threads
        )

    def step(self, embeds: torch.Tensor, hidden: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Eagle3.step's rows [T, h] appended to `cache` at positions length + 1.. (the caller checks `covers`)."""
        buffers = cache.buffers
        assert buffers is not None
        held = cache.length
        out = self._runner.loader.boxed_run(
            [embeds.contiguous(), hidden.contiguous(), torch.empty(held, 0), buffers[0], buffers[1]]
        )
        cache.length = held + embeds.shape[0]
        return out[0]


def _compile(draft: Eagle3, max_rows: int, folder: Path) -> None:
    """Export and compile the graph into `folder`, at the calling thread's thread count."""
    shape, h = draft.shape, draft.shape.hidden_size
    buffers = [torch.zeros(1, shape.num_kv_heads, CAPACITY, shape.head_dim, dtype=draft.dtype) for _ in range(2)]
    rows = torch.export.Dim("rows", min=1, max=max_rows)
    held = torch.export.Dim("held", min=1, max=CAPACITY - max_rows)
    example = (torch.zeros(max_rows, h, dtype=draft.dtype), torch.zeros(max_rows, h, dtype=draft.dtype))
    with torch.no_grad():
        program = torch.export.export(
            _Graph(draft),
            (*example, torch.empty(8, 0), *buffers),
            dynamic_shapes=({0: rows}, {0: rows}, {0: held}, None, None),
            strict=False,
        )
    torch._inductor.aoti_compile_and_package(
        program,
        package_path=str(folder / compiled_step.PACKAGE),
        # the weights stay the draft's: handed to the package at load
        inductor_configs={"aot_inductor.package_constants_in_so": False},
    )


def entry_key(draft: Eagle3, quantization: str, max_rows: int, threads: int) -> str:
    """What a cache entry is valid for: torch, the CPU's ISA, the draft's shape and weights, their format, the
    feeds compiled and the thread count."""
    from ...kernels import Int8Linear, weight_sample

    # whether the products are our operator called from C++ (torch_ops.py); asking registers it, as a package
    # that calls it needs before it loads
    operators = [torch_ops.int8_rows_op()]
    facts = {
        "format": FORMAT,
        "code": compiled_step.code_digest(eagle3_model),
        "draft_code": hashlib.blake2b(Path(__file__).read_bytes(), digest_size=8).hexdigest(),
        "torch": torch.__version__,
        "isa": torch.backends.cpu.get_cpu_capability(),
        "shape": repr(draft.shape),
        "weights": weight_sample(draft.norm.weight) + weight_sample(draft.layer.hidden_norm.weight),
        "quantization": quantization,
        "operators": operators,
        "int8_kernels": sorted({m.kernel for m in draft.modules() if isinstance(m, Int8Linear)}),
        "max_rows": max_rows,
        "threads": threads,
        "capacity": CAPACITY,
    }
    return "eagle3-" + hashlib.blake2b(json.dumps(facts, sort_keys=True).encode(), digest_size=12).hexdigest()


def build_or_load(
    draft: Eagle3, quantization: str, max_rows: int, threads: int | None = None, build=None
) -> tuple[CompiledDraftStep, BuildReport]:
    """The draft's compiled step, from the cache folder where one is valid, else compiled and the folder
    written (compiled_step.load_or_build); `build`: what writes it in another process. Slow the first time
    (tens of seconds): never on a request's path."""
    began = time.perf_counter()
    max_rows = max(max_rows, 2)  # export takes no row dimension from 1 to 1
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    path = compiled_step.entry_path(entry_key(draft, quantization, max_rows, threads))
    graph = _Graph(draft)
    runner, loaded = compiled_step.load_or_build(
        path,
        lambda folder: compiled_step.load_package(graph, folder),
        lambda folder: _compile(draft, max_rows, folder),
        build,
    )
    size = sum(f.stat().st_size for f in path.iterdir())
    report = BuildReport(path, loaded, time.perf_counter() - began, size)
    log.info("compiled draft step %s in %.1f s (%s)", "loaded" if loaded else "built", report.seconds, path)
    return CompiledDraftStep(draft, max_rows, threads, runner), report
