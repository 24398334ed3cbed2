"""The target's CPU step compiled once per machine and kept on disk (torch.compile, Inductor's C++ backend).

An eager step is ~1,600 small operators (norms, rotary, activation quantization, residuals), each paying
dispatch; compiled, they fuse into a few loops around the products, which stay the packed kernels
(kernels.opaque_linear). Compiling takes minutes, so it never happens on a request: a build in the
background (the server) or ahead (`specdec precompile`) compiles every row count the decoder feeds, and
keeps torch's compile caches (`torch.compiler.save_cache_artifacts`) in one file under the model cache,
keyed by what makes the code valid: torch's version, the CPU's ISA, the model, its weights' format, the
row counts and the modules traced. A later start loads that file and compiles again from the caches,
which skips Inductor's C++ builds but not dynamo's tracing. The steps (target_steps.EagerTarget) switch to
it between two requests; until then they run eagerly.

Row counts: one graph for one row and one for any count up to `max_rows` (a dynamic dimension) cover a
step and every verify width. Attention is one opaque operator a layer (lean_forward.attend_each_row),
each row as a one-row step, so the graphs neither unroll rows nor branch on the cache's length. The
hidden-state steps (the self draft's) are compiled for their one row; a longer feed of them, and any
feed past `max_rows` (a prefill), runs eagerly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import lean_forward
from .kv_cache import keep_first, lean_hidden_tapped, lean_logits_tapped, new_cache, reserve

log = logging.getLogger(__name__)

# the entries' layout: a new one keys every entry anew
FORMAT = 2
# tokens a cache holds while a compiled step appends to it: its buffers are grown to this once, so that no graph
# sees their size change (a graph guards on it); a longer context runs eagerly
CAPACITY = 4096


def supports(model) -> bool:
    """Compiled steps run the lean forward (lean_forward.py) on the CPU."""
    return model.device.type == "cpu" and lean_forward.supports(model)


@dataclass
class BuildReport:
    """What a build or a load cost, for the log, `specdec precompile` and docs/cpu.md."""

    path: Path
    loaded: bool  # True: from the cache file; False: compiled from nothing (or a stale, corrupt entry)
    seconds: float
    bytes: int


class CompiledStep:
    """The lean forward's logits and hidden-state steps, compiled for feeds of up to `max_rows` rows."""

    max_hidden_rows = 1

    def __init__(self, model, max_rows: int, threads: int, taps: tuple[int, ...] = ()):
        self.model = model
        self.max_rows = max_rows
        self.threads = threads  # the graphs' thread count: they guard on it (cpu_threads.IdleCores moves it)
        self.taps = taps
        # one row, and the rest: two graphs a function, on code objects every model compiled here shares
        torch._dynamo.config.cache_size_limit += 2
        self._logits = torch.compile(_every_row_logits, dynamic=True)
        self._hidden = torch.compile(lean_hidden_tapped, dynamic=True)
        # once warmed up, a shape the build did not see would compile on a request: raise instead
        self._stance = "default"

    def covers(self, rows: int, cache, hidden: bool = False) -> bool:
        """Whether a feed of `rows` onto `cache` runs compiled: short feeds onto a cache that holds tokens and
        has room for them within CAPACITY, at the thread count it was built for (a prefill, the first write
        into an empty cache, a context past CAPACITY, and a step while other work leaves fewer cores
        idle run eagerly)."""
        held = cache.get_seq_length()
        return (
            rows <= (self.max_hidden_rows if hidden else self.max_rows)
            and 0 < held <= CAPACITY - rows
            and torch.get_num_threads() == self.threads
        )

    def logits(self, cache, ids: list[int], keep: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append `ids` to `cache`: the logits of the last `keep` and the tapped states of all (None without
        taps). The graph applies the head to every row, so that `keep` is no shape of it."""
        out, states = self._run(self._logits, cache, ids)
        return out[len(ids) - keep :], states

    def hidden(self, cache, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self._run(self._hidden, cache, ids)

    def _run(self, compiled, cache, ids: list[int]):
        reserve(cache, CAPACITY)  # eagerly, once a cache: no graph sees a buffer's size change
        with torch.compiler.set_stance(self._stance):
            return compiled(self.model, cache, torch.tensor([ids]), self.taps)

    def warm_up(self, hidden: bool) -> None:
        """Run every graph once on a scratch cache, so that compiling (or loading) happens now: on a short
        cache, then on one longer than every sliding window, where nothing may compile again. It sets the
        calling thread's intra-op threads to the step's (a fresh thread starts from whatever count another
        thread set last)."""
        torch.set_num_threads(self.threads)
        with torch.inference_mode():
            for held in (8, min(_past_every_window(self.model), CAPACITY - self.max_rows)):
                cache = new_cache()
                lean_logits_tapped(self.model, cache, torch.zeros((1, held), dtype=torch.long), 1, self.taps)
                for rows in sorted({1, min(2, self.max_rows), self.max_rows}):
                    self.logits(cache, [0] * rows, keep=rows)
                    keep_first(cache, held)
                    if hidden and rows <= self.max_hidden_rows:
                        self.hidden(cache, [0] * rows)
                        keep_first(cache, held)
                self._stance = "fail_on_recompile"  # the long cache: the short one's graphs must serve it


def _past_every_window(model) -> int:
    """A cache length past every layer's sliding window (and past the cache's first buffer)."""
    family = lean_forward.family_of(model)
    assert family is not None  # supports(model)
    windows = [lean_forward.layer_window(model, family, layer.self_attn) for layer in model.base_model.layers]
    return max([w for w in windows if w] + [512]) + 8


def _every_row_logits(model, cache, input_ids: torch.Tensor, taps: tuple[int, ...]):
    return lean_logits_tapped(model, cache, input_ids, input_ids.shape[1], taps)


def entry_key(model, quantization: str, max_rows: int, hidden: bool, threads: int, taps: tuple[int, ...]) -> str:
    """What a cache entry is valid for: torch, the CPU's ISA, the model's config and weights, their
    format, the feeds compiled and the thread count."""
    from .kernels import int8_full_range, weight_sample

    facts = {
        "format": FORMAT,
        "code": _code_digest(),
        "torch": torch.__version__,
        "isa": torch.backends.cpu.get_cpu_capability(),
        "vnni": int8_full_range(),
        "config": model.config.to_json_string(use_diff=False),
        "weights": weight_sample(model.get_input_embeddings().weight),
        "quantization": quantization,
        "max_rows": max_rows,
        "hidden": hidden,
        "threads": threads,
        "taps": list(taps),
    }
    return hashlib.blake2b(json.dumps(facts, sort_keys=True).encode(), digest_size=12).hexdigest()


def _code_digest() -> str:
    """The modules a compiled step traces: an edit to one keys every entry anew."""
    from . import kernels, kv_cache

    digest = hashlib.blake2b(digest_size=8)
    for module in (lean_forward, kernels, kv_cache):
        digest.update(Path(module.__file__ or "").read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def entry_path(key: str) -> Path:
    from .models import cache_root

    return cache_root() / "compiled" / f"{key}.bin"


def build_or_load(
    model, quantization: str, max_rows: int, hidden: bool, threads: int | None = None, taps: tuple[int, ...] = ()
) -> tuple[CompiledStep, BuildReport]:
    """The compiled step for `model` at `threads` intra-op threads (default: the caller's count): from the
    cache file where one is valid, else compiled from nothing and the file written. A corrupt entry is logged,
    removed and rebuilt. Slow (seconds warm, minutes cold): never call it on a request's path."""
    began = time.perf_counter()
    threads = threads or torch.get_num_threads()
    path = entry_path(entry_key(model, quantization, max_rows, hidden, threads, taps))
    loaded = False
    if path.exists():
        try:
            # None where torch cannot read it (it logs why): a truncated write, another torch's format
            loaded = torch.compiler.load_cache_artifacts(path.read_bytes()) is not None
        except Exception as e:
            log.debug("load_cache_artifacts raised", exc_info=e)
        if not loaded:
            log.warning("compiled step cache %s is unreadable; compiling it again", path)
            path.unlink(missing_ok=True)
    step = CompiledStep(model, max_rows, threads, taps)
    step.warm_up(hidden)
    # what this process compiled or loaded; written unless the entry already holds exactly that
    artifacts = torch.compiler.save_cache_artifacts()
    if artifacts is not None and not (loaded and path.read_bytes() == artifacts[0]):
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_bytes(artifacts[0])
        partial.replace(path)  # whole or not at all
    size = path.stat().st_size if path.exists() else 0
    report = BuildReport(path, loaded, time.perf_counter() - began, size)
    log.info(
        "compiled step %s in %.1f s (%s, %.1f MB)",
        "loaded" if loaded else "built",
        report.seconds,
        path,
        size / 1e6,
    )
    return step, report
