"""The target's CPU step compiled once per machine and kept on disk (AOTInductor, Inductor's C++ backend).

An eager step is ~1,600 small operators (norms, rotary, activation quantization, residuals), each paying
dispatch; compiled, they fuse into a few loops around the products, which stay our kernels, called as
operators from C++ where they are built (torch_ops.py), else through Python (kernels.opaque_linear). The step
is exported (torch.export) and compiled ahead of time into a package of C++ code, kept in a folder under the
model cache keyed by what makes the code valid: torch's version, the CPU's ISA, the model, its weights'
format, the row counts, the thread count and the modules traced. Building takes a minute or two, so it never
happens on a request: a build in the background (the server runs `specdec precompile` in a process of its own)
or ahead. A later start loads the package (a second: no tracing) and hands it the model's own weights (no copy
on disk or in memory). The steps (target_steps.EagerTarget) switch to it between two requests; until then they
run eagerly.

The graph takes the cache's buffers (grown to CAPACITY tokens) as inputs and writes the new rows' keys and
values into them in place; how many tokens they hold comes in as the length of an empty tensor, a shape, so
that one graph serves every cache length. One graph, of the final hidden states, for any row count up to
`max_rows` (a dynamic dimension) covers a step, every verify width and the self draft's steps; the head runs
eagerly after it (one opaque product). The same code for every feed is what keeps speculation exact: a
verify's rows are bit-equal to one-row steps (checked at an entry's first load, and again whenever its package
changes; a graph specialized to one row reduced a wide model's rows in another order), and the self draft's
hidden states, whose keys and values the verify keeps, are the ones a logits step would have made (two graphs
fused them differently). Attention is one opaque operator a layer (torch_ops' attend_rows, or
lean_forward.attend_tree_rows), each row as a one-row step, so the graph never branches on the cache's length.
A draft tree's verify (decoder/tree.py) is the same graph: each row comes with its depth and its parent row, a
chain's being its index and the row before. A feed past `max_rows` (a prefill) runs eagerly.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

import torch
from transformers.cache_utils import Cache

from . import int8_rows, lean_forward, torch_ops
from .kv_cache import (
    PreallocatedLayer,
    head_logits,
    lean_hidden_tapped,
    lean_logits_tapped,
    new_cache,
    reserve,
    set_length,
)
from .tree import DraftTree, TreeShape

log = logging.getLogger(__name__)

# the entries' layout: a new one keys every entry anew
FORMAT = 5
PACKAGE = "step.pt2"  # an entry's one package
CHECKED = "checked"  # the digest of the package that passed check_verify_rows here (_checked)
# tokens a cache's buffers hold while a compiled step appends to them: a graph takes them at this size; a
# longer context runs eagerly
CAPACITY = 4096

R = TypeVar("R")  # what a package loads as


def supports(model) -> bool:
    """Compiled steps run the lean forward (lean_forward.py) on the CPU."""
    return model.device.type == "cpu" and lean_forward.supports(model)


class CompiledStepError(RuntimeError):
    """A built or loaded step that cannot serve: its verify rows differ from its one-row steps."""


@dataclass
class BuildReport:
    """What a build or a load cost, for the log, `specdec precompile` and docs/cpu.md."""

    path: Path
    loaded: bool  # True: from the cache folder; False: compiled from nothing (or a stale, corrupt entry)
    seconds: float
    bytes: int


class _Buffers:
    """The cache a graph sees: each layer's key and value buffers, filled up to `start`, written in place."""

    def __init__(self, keys: list[torch.Tensor], values: list[torch.Tensor], start):
        self.keys, self.values, self.start = keys, values, start

    def get_seq_length(self, layer_idx: int = 0):
        return self.start

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        end = self.start + key_states.shape[-2]
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[:, :, self.start : end].copy_(key_states)
        values[:, :, self.start : end].copy_(value_states)
        return keys[:, :, :end], values[:, :, :end]


class _Graph(torch.nn.Module):
    """What the package runs: (input_ids [1, T], depths [T], parents [T], held [tokens held, 0], keys, values) ->
    the final hidden states of every row, and the tapped states where there are taps."""

    def __init__(self, model, taps: tuple[int, ...]):
        super().__init__()
        self.model, self.taps = model, taps

    def forward(self, input_ids, depths, parents, held, keys, values):
        cache = cast(Cache, _Buffers(keys, values, held.shape[0]))  # all of a Cache the lean forward asks for
        out, states = lean_hidden_tapped(self.model, cache, input_ids, self.taps, TreeShape(depths, parents, None))
        return (out, states) if self.taps else (out,)


class CompiledStep:
    """The lean forward's logits and hidden-state steps, compiled for feeds of up to `max_rows` rows."""

    def __init__(self, model, max_rows: int, threads: int, taps: tuple[int, ...], runner):
        self.model = model
        self.max_rows = max_rows
        self.threads = threads  # the graph's thread count: compiled into it (cpu_threads.IdleCores moves it)
        self.taps = taps
        self._runner = runner  # an AOTICompiledModel
        # the EAGLE-3 draft's own compiled step (drafts/eagle3/compiled.py), which the drafter on these steps runs
        self.draft_step: object | None = None

    def covers(self, rows: int, cache) -> bool:
        """Whether a feed of `rows` onto `cache` runs compiled: short feeds onto a cache that holds tokens and
        has room for them within CAPACITY, at the thread count it was built for (a prefill, the first write
        into an empty cache, a context past CAPACITY, and a step while other work leaves fewer cores
        idle run eagerly)."""
        held = cache.get_seq_length()
        return (
            rows <= self.max_rows
            and 0 < held <= CAPACITY - rows
            and torch.get_num_threads() == self.threads
            and _buffers(cache) is not None
        )

    def logits(
        self, cache, ids: list[int], keep: int, tree: TreeShape | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Append `ids` to `cache`: the logits of the last `keep` and the tapped states of all (None without
        taps): the graph's hidden states, then the head eagerly, as the self draft's verify applies it.
        tree: the rows are a draft tree's (decoder/tree.py); None: a chain."""
        hidden, states = self.hidden(cache, ids, tree)
        return head_logits(self.model, self.model.get_output_embeddings(), hidden[len(ids) - keep :]), states

    def hidden(self, cache, ids: list[int], tree: TreeShape | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        buffers = _buffers(cache)
        assert buffers is not None  # covers()
        held = cache.get_seq_length()
        keys, values = buffers
        shape = tree or _chain(len(ids))
        # the package's own loader, flat tensors in and out: the wrapper's call re-reads its pytree specs each call
        out = self._runner.loader.boxed_run(
            [torch.tensor([ids]), shape.depths, shape.parents, torch.empty(held, 0), *keys, *values]
        )
        set_length(cache, held + len(ids))
        return out[0], (out[1] if self.taps else None)

    def check_verify_rows(self) -> None:
        """Raise CompiledStepError unless a verify's logits are its one-row steps', bit for bit (what makes
        speculation on this step token-identical to its AR)."""
        with torch.inference_mode():
            cache = _scratch_cache(self.model, self.taps)
            ids = list(range(1, self.max_rows + 1))
            verify, _ = self.logits(cache, ids, keep=len(ids))
            set_length(cache, 8)
            one_by_one = torch.cat([self.logits(cache, [token], keep=1)[0] for token in ids])
        if not torch.equal(verify, one_by_one):
            raise CompiledStepError("the compiled step's verify rows differ from its one-row steps")
        self._check_tree_rows()

    def _check_tree_rows(self) -> None:
        """The same for a draft tree's verify: each row is the one-row step at the end of its path."""
        tree = DraftTree.of_paths([[1, 2, 3], [1, 4], [5]])
        if len(tree) + 1 > self.max_rows:
            return
        with torch.inference_mode():
            cache = _scratch_cache(self.model, self.taps)
            ids = [6, *tree.tokens]
            verify, _ = self.logits(cache, ids, keep=len(ids), tree=tree.shape())
            for row in range(len(ids)):
                set_length(cache, 8)
                for token in [ids[r] for r in tree.path_rows(row)]:
                    step, _ = self.logits(cache, [token], keep=1)
                if not torch.equal(verify[row], step[0]):
                    raise CompiledStepError("the compiled step's tree rows differ from its one-row steps")


@functools.cache
def _chain(rows: int) -> TreeShape:
    """A chain of `rows` as the graph takes it."""
    return TreeShape.chain(rows)


def _buffers(cache) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """Every layer's key and value buffers, grown to CAPACITY; None where the cache has none of that size
    (not yet written, or grown past it)."""
    reserve(cache, CAPACITY)
    layers = cache.layers
    if not layers or not all(
        isinstance(layer, PreallocatedLayer) and layer.is_initialized and layer.capacity == CAPACITY for layer in layers
    ):
        return None
    return [layer.key_buffer for layer in layers], [layer.value_buffer for layer in layers]


def _scratch_cache(model, taps: tuple[int, ...]):
    """A cache holding 8 tokens, its buffers at CAPACITY: what a graph is exported and checked on."""
    cache = new_cache()
    with torch.inference_mode():
        lean_logits_tapped(model, cache, torch.zeros((1, 8), dtype=torch.long), 1, taps)
    reserve(cache, CAPACITY)
    return cache


def _compile(model, taps: tuple[int, ...], max_rows: int, folder: Path) -> None:
    """Export and compile the graph into `folder`, at the calling thread's thread count."""
    cache = _scratch_cache(model, taps)
    keys, values = _buffers(cache) or ([], [])
    layers = len(keys)
    rows = torch.export.Dim("rows", min=1, max=max_rows)
    held = torch.export.Dim("held", min=1, max=CAPACITY - max_rows)
    chain = TreeShape.chain(max_rows)
    example = (
        torch.zeros((1, max_rows), dtype=torch.long),
        chain.depths,
        chain.parents,
        torch.empty(8, 0),
        keys,
        values,
    )
    with torch.no_grad():
        program = torch.export.export(
            _Graph(model, taps),
            example,
            dynamic_shapes=(
                {1: rows},
                {0: rows},
                {0: rows},
                {0: held},
                [None] * layers,
                [None] * layers,
            ),
            strict=False,
        )
    torch._inductor.aoti_compile_and_package(
        program,
        package_path=str(folder / PACKAGE),
        # the weights stay the model's: handed to the package at load (_load)
        inductor_configs={"aot_inductor.package_constants_in_so": False},
    )


def _package_digest(path: Path) -> str:
    return hashlib.blake2b((path / PACKAGE).read_bytes(), digest_size=16).hexdigest()


def _checked(path: Path, digest: str) -> bool:
    """Whether the entry's package, of `digest`, passed check_verify_rows on this machine: its digest in the entry's
    CHECKED record. Whether a verify's rows are its one-row steps' is a property of the package's code at the
    entry's key (its torch, ISA, model, row counts and threads), so a package passed once passes again; the
    digest makes a package rewritten since (a rebuild, a corrupt write) checked anew."""
    try:
        return (path / CHECKED).read_text(encoding="utf-8").strip() == digest
    except OSError:
        return False


def _record_checked(path: Path, digest: str) -> None:
    try:
        (path / CHECKED).write_text(digest + "\n", encoding="utf-8")
    except OSError as e:  # a read-only cache: each load checks it again
        log.warning("could not record the compiled step's check in %s: %s", path, e)


def _tensor_at(module: torch.nn.Module, fqn: str) -> torch.Tensor:
    tensor = functools.reduce(getattr, fqn.split("."), module)
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"the package asks for {fqn}, which the model has no tensor at")
    return tensor


def load_package(graph: torch.nn.Module, folder: Path):
    """The package in `folder`, given `graph`'s own tensors (the model's) as its constants."""
    runner = _open_package(folder / PACKAGE)
    _remove_extracted_packages()
    constants = {fqn: _tensor_at(graph, fqn) for fqn in runner.get_constant_fqns()}
    runner.load_constants(constants, check_full_update=True, user_managed=True)
    return runner


def _open_package(path: Path):
    """The package's runner. `aoti_load_package` first works out this machine's vector ISA by building probe
    libraries and loading each in a child Python (six, about a second), only to warn where the package was built
    for another; an entry's key holds the ISA already, so the package's own loader is called directly where this
    torch has it."""
    try:
        from torch.export.pt2_archive._package import AOTICompiledModel

        return AOTICompiledModel(torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1))
    except (ImportError, AttributeError, TypeError):  # another torch's internals
        return torch._inductor.aoti_load_package(str(path))


def _remove_extracted_packages() -> None:
    """Remove the folders that the package loader extracted for this process: its library is mapped by now,
    and the loader removes them only if it is destroyed, which a process that exits or is stopped skips, so
    each start would leave its few MB in the temporary folder. Linux: read from /proc/self/maps."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            mapped = {line.split(maxsplit=5)[-1].strip() for line in f if "/aotinductor_" in line}
    except OSError:
        return
    for library in mapped:
        head, _, tail = library.partition("/aotinductor_")
        folder = Path(f"{head}/aotinductor_{tail.split('/')[0]}")
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)


def entry_key(model, quantization: str, max_rows: int, threads: int, taps: tuple[int, ...]) -> str:
    """What a cache entry is valid for: torch, the CPU's ISA, the model's config and weights, their
    format, the feeds compiled and the thread count."""
    from .kernels import Int8Linear, int8_full_range, weight_sample

    # which of our operators the graph calls from C++ (torch_ops.py); asking registers them, as a package that
    # calls them needs before it loads
    operators = [torch_ops.int8_rows_op(), torch_ops.attend_rows_op()]
    # the int8 products the model's linears were built for (a package names the buffers its kernel reads)
    int8_kernels = sorted({m.kernel for m in model.modules() if isinstance(m, Int8Linear)})
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
        "threads": threads,
        "taps": list(taps),
        "operators": operators,
        "int8_kernels": int8_kernels,
        "int8_rows": int8_rows.in_use(),
    }
    return hashlib.blake2b(json.dumps(facts, sort_keys=True).encode(), digest_size=12).hexdigest()


def _code_digest() -> str:
    """The modules a compiled step traces: an edit to one keys every entry anew."""
    from . import kv_cache, tree

    return code_digest(lean_forward, kv_cache, tree)


def code_digest(*traced) -> str:
    """The `traced` modules, the products' (kernels, operators) and this one's: an edit to one keys an entry anew."""
    from . import kernels

    digest = hashlib.blake2b(digest_size=8)
    for module in (*traced, kernels, torch_ops, int8_rows):
        digest.update(Path(module.__file__ or "").read_bytes())
    # the C++ operators, and the int8 kernels whose weight layout a package holds as constants
    for source in (torch_ops.SOURCE, *(variant.source for variant in int8_rows.VARIANTS)):
        digest.update(source.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def _remove_abandoned_builds(path: Path) -> None:
    """Remove the partial folders of builds of `path` whose process is gone (a server that stopped terminates
    its build) or is this one."""
    for partial in path.parent.glob(f"{path.name}.*.part"):
        pid = partial.name.removeprefix(f"{path.name}.").removesuffix(".part")
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(partial, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def load_or_build(
    path: Path, load: Callable[[Path], R], compile_into: Callable[[Path], None], build: Callable[[], None] | None
) -> tuple[R, bool]:
    """The package at the entry `path`, loaded (`load`), and whether it was there: where it is not, or cannot be
    loaded (a truncated write, a file another torch wrote, a model that changed: logged and removed), it is
    written first, by `build` (another process) or here by `compile_into` into a scratch folder that becomes the
    entry whole or not at all."""
    if path.exists():
        try:
            return load(path), True
        except Exception as e:
            log.warning("compiled step cache %s is unreadable (%s); compiling it again", path, e)
            shutil.rmtree(path, ignore_errors=True)
    if build is not None:
        build()
    else:
        _remove_abandoned_builds(path)
        from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

        partial = path.with_name(f"{path.name}.{os.getpid()}.part")
        partial.mkdir(parents=True)
        # Inductor's own cache (hundreds of MB a build) in the scratch folder, gone with it, rather than
        # in the temporary folder, which is memory on many systems, for as long as the machine is up
        with temporary_cache_dir(str(partial / "inductor")):
            compile_into(partial)
        shutil.rmtree(partial / "inductor")
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)  # whole or not at all
    return load(path), False


def entry_path(key: str) -> Path:
    """The folder of an entry's package."""
    from .models import cache_root

    return cache_root() / "compiled" / key


def build_or_load(
    model,
    quantization: str,
    max_rows: int,
    threads: int | None = None,
    taps: tuple[int, ...] = (),
    build: Callable[[], None] | None = None,
) -> tuple[CompiledStep, BuildReport]:
    """The compiled step for `model` at `threads` intra-op threads (default: the caller's count): from the
    cache folder where one is valid, else compiled from nothing and the folder written. A corrupt or
    unloadable entry is logged, removed and rebuilt. Slow (a second warm, minutes cold): never call it on a
    request's path. Raises CompiledStepError for a step whose verify rows are not its one-row steps.

    build: writes the entry in another process (`specdec precompile` for the same model and settings). Tracing
    patches torch process-wide, so a build here breaks whatever else runs the model meanwhile (the server's
    decodes); loading traces nothing."""
    began = time.perf_counter()
    # plain decoding feeds one row; export takes no row dimension from 1 to 1, so its graph takes up to two
    max_rows = max(max_rows, 2)
    threads = threads or torch.get_num_threads()
    torch.set_num_threads(threads)  # compiled into the graph; a fresh thread has whatever count was set last
    path = entry_path(entry_key(model, quantization, max_rows, threads, taps))
    graph = _Graph(model, taps)
    runner, loaded = load_or_build(
        path, lambda folder: load_package(graph, folder), lambda folder: _compile(model, taps, max_rows, folder), build
    )
    step = CompiledStep(model, max_rows, threads, taps, runner)
    digest = _package_digest(path)
    if not _checked(path, digest):
        step.check_verify_rows()
        _record_checked(path, digest)
    size = sum(f.stat().st_size for f in path.iterdir())
    report = BuildReport(path, loaded, time.perf_counter() - began, size)
    log.info(
        "compiled step %s in %.1f s (%s, %.1f MB)",
        "loaded" if loaded else "built",
        report.seconds,
        path,
        size / 1e6,
    )
    return step, report
