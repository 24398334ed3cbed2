"""Resolve a model spec (packaged alias, local directory or HF id) and load it, safetensors only.

A packaged GGUF is dequantized once into a safetensors directory under the user cache
(``$XDG_CACHE_HOME/specdec/models/<alias>``); every later start loads that in about a second.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from . import packaged
from .gguf_loading import fast_gguf_loading
from .gguf_safetensors import UnhandledArchitectureError, convert_with_meta, meta_from_gguf, staged_folder
from .packaged import (
    PACKAGED,
    ModelError,
    ModelNotFoundError,
    cache_root,
    has_weights,
    packaged_folder,
    shipped_meta,
)

log = logging.getLogger(__name__)

# The default target is a packaged model (decoder/packaged.py); the defaults are read from here.
DEFAULT_TARGET = packaged.DEFAULT_TARGET

# Prompt lookup where the context repeats, else the target's own draft through a head cut to the
# shipped draft's vocabulary (drafts.SelfDrafter). Chosen by measurement (docs/benchmarks/README.md):
# on the CPU the shipped trained draft (`ngram+auto`) costs more than it returns.
DEFAULT_DRAFT = "ngram+self"
# The most drafts of a round's draft tree (decoder/tree.py), where the draft proposes trees; 0: chains. Chosen by
# measurement (docs/cpu.md, "Draft trees").
DEFAULT_TREE_NODES = 0
# How the target runs (decoder/target_steps.py); auto is graphs on CUDA (compiled for a family graphs do not
# run) and eager on the CPU.
STEPS = ("auto", "eager", "fixed", "compiled", "graphs")


class VocabularyMismatchError(ModelError):
    pass


class OutOfMemoryError(ModelError):
    pass


# Seconds a Hugging Face id waits to hear from the hub before it is looked for in the local cache
# alone: unreachable, huggingface_hub retries each file five times with backoff (~23 s), and a
# mistyped draft took 51 s to be reported.
HUB_PROBE_TIMEOUT = 3.0


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """Whether the Hugging Face hub answers within `timeout` seconds; False at once in offline mode
    (HF_HUB_OFFLINE). Asked through huggingface_hub's own session, so its proxies apply."""
    from huggingface_hub import constants, get_session

    if constants.is_offline_mode():
        return False
    answers: list[bool] = []

    def probe() -> None:
        try:
            get_session().head(constants.ENDPOINT, timeout=timeout)
            answers.append(True)  # any answer, even an error status, means the hub can be asked
        except Exception:  # no network, no name resolution, a timeout: the HTTP library's own errors
            answers.append(False)

    # in a thread, since a name lookup that hangs is bounded by no timeout
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return answers == [True]


Progress = Callable[[float, str], None]  # (fraction done, 0..1; what is happening): a first run's progress bar


def resolve(spec: str, progress: Progress | None = None) -> str:
    """Turn a model spec into something `from_pretrained` can load: a local directory or a hub id.
    A packaged alias is converted on first use, saying how far it got through `progress`."""
    if spec in PACKAGED:
        return str(_converted_dir(spec, progress))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():  # what llama.cpp users have: converted once, like an alias
        return str(_converted_dir(spec, progress))
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} is a directory but has no config.json")
        return str(path)
    if path.exists() or spec.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"model path {spec!r} is neither a model directory nor a .gguf file")
    if spec.count("/") > 1 or not spec.strip():
        raise ModelNotFoundError(
            f"unknown model {spec!r}: use a packaged alias ({', '.join(PACKAGED)}), a local directory, "
            "a .gguf file or a HF id"
        )
    return spec  # a hub id; from_pretrained says whether it is reachable


def packaged_gguf(spec: str) -> Path:
    """The GGUF file of a packaged alias, or `spec` itself when it is a .gguf file (for llama.cpp)."""
    if spec in PACKAGED:
        return PACKAGED[spec].gguf_path()
    path = Path(spec).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise ModelNotFoundError(
        f"llama.cpp runs GGUF files: {spec!r} is neither a packaged alias ({', '.join(PACKAGED)}) nor a .gguf file;"
        " set the gguf option"
    )


def _converted_dir(spec: str, progress: Progress | None = None) -> Path:
    """The cached conversion of a packaged alias or a GGUF file; a file's folder is named by its resolved
    path, size and mtime, so an edited or replaced file is converted again. A packaged alias's GGUF is looked for
    only when it is converted: finding it checks the file's sha256 (half a second)."""
    if spec in PACKAGED:
        out = packaged_folder(spec)
    else:
        file = Path(spec).expanduser().resolve()
        stat = file.stat()
        key = hashlib.sha256(f"{file}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:12]
        out = cache_root() / "models" / f"{file.stem}-{key}"
    ahead = packaged.CONVERTING_AHEAD.pop(spec, None)
    if has_weights(out):
        if ahead is not None:
            ahead.poll()  # its folder is in place, so it has exited or is about to: reaped here or by subprocess
        return out
    if ahead is not None:
        name = Path(spec).name  # the GGUF's own name would mean finding it (its sha256 checked) for a label
        with _ConversionProgress(progress or (lambda fraction, message: None), name, CONVERT_WITH_META_SECONDS):
            try:
                ahead.wait(packaged.CONVERT_AHEAD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                ahead.kill()
                ahead.wait()
        if has_weights(out):
            return out
        log.warning("converting %s ahead failed (exit %s); converting it here", spec, ahead.returncode)
    gguf = packaged_gguf(spec)
    meta = shipped_meta(spec)
    if meta is not None:
        try:
            return _convert_with_meta(gguf, meta, out, progress)
        except Exception as e:  # a package that changed its GGUF: its own metadata still converts it
            log.warning("the shipped meta of %s does not fit %s (%s)", spec, gguf, e)
    try:
        return convert_with_own_meta(gguf, out, progress)
    except UnhandledArchitectureError as e:  # its tensors are reshaped on loading: transformers converts it
        log.info("%s: %s", gguf.name, e)
    log.info("converting %s (%s) to safetensors once, through transformers", spec, gguf.name)
    return convert_gguf(gguf, out, progress)


def _convert_with_meta(gguf: Path, meta: Path, out: Path, progress: Progress | None) -> Path:
    log.info("converting %s to safetensors once, with its shipped meta", gguf.name)
    with _ConversionProgress(progress or (lambda fraction, message: None), gguf.name, CONVERT_WITH_META_SECONDS):
        convert_with_meta(gguf, meta, out)
    return out


def convert_with_own_meta(gguf: Path, out: Path, progress: Progress | None = None) -> Path:
    """Convert a GGUF we ship no meta for with a meta built from its own metadata (gguf_safetensors.meta_from_gguf);
    UnhandledArchitectureError where its architecture is not handled there."""
    log.info("converting %s to safetensors once, with a meta built from its own metadata", gguf.name)
    out.parent.mkdir(parents=True, exist_ok=True)
    with (
        _ConversionProgress(
            progress or (lambda fraction, message: None), gguf.name, CONVERT_WITH_OWN_META_SECONDS
        ) as phases,
        tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-meta-") as scratch,
    ):
        meta = meta_from_gguf(gguf, Path(scratch) / "meta")
        phases.begin("tensors")
        convert_with_meta(gguf, meta, out)
    return out


# Where a conversion through transformers spends its time (Gemma-3-270M, docs/cpu.md "What a start costs"): the
# weights (the metadata parsed, the tensors dequantized), the tokenizer, and saving. It reports nothing while it
# works, so the bar moves by these expected times and waits short of a phase's end until the phase is done.
CONVERT_SECONDS = {"weights": 14.0, "tokenizer": 5.0, "saving": 3.0}
# The same with the shipped meta: only the tensors are read, dequantized and saved.
CONVERT_WITH_META_SECONDS = {"tensors": 6.0}
# A GGUF we ship no meta for, of an architecture whose tensors need no reshaping: the meta is built from its own
# metadata (config, tokenizer, tensor map; a fresh process's time, the modeling code's imports included), then the
# same.
CONVERT_WITH_OWN_META_SECONDS = {"metadata": 13.0, "tensors": 6.0}


class _ConversionProgress:
    """Reports a conversion's progress every half second from a daemon thread, phase by phase."""

    def __init__(self, progress: Progress, name: str, phases: dict[str, float] = CONVERT_SECONDS):
        self.progress, self.name, self.phases = progress, name, phases
        self.total = sum(phases.values())
        self.done_before, self.phase, self.started = 0.0, "", time.monotonic()
        self.finished = threading.Event()
        self.thread = threading.Thread(target=self._tick, name="specdec-convert-progress", daemon=True)

    def __enter__(self) -> _ConversionProgress:
        self.begin(next(iter(self.phases)))
        self.thread.start()
        return self

    def begin(self, phase: str) -> None:
        if self.phase:
            self.done_before += self.phases[self.phase]
        self.phase, self.started = phase, time.monotonic()
        self.report()

    def report(self) -> None:
        expected = self.phases[self.phase]
        within = min(0.95, (time.monotonic() - self.started) / expected)  # never claims a phase done early
        self.progress((self.done_before + within * expected) / self.total, f"converting {self.name}: {self.phase}")

    def _tick(self) -> None:
        while not self.finished.wait(0.5):
            self.report()

    def __exit__(self, *exc) -> None:
        self.finished.set()
        self.thread.join()
        if exc[0] is None:
            self.progress(1.0, f"converted {self.name}")


def convert_gguf(gguf: str | Path, out: str | Path, progress: Progress | None = None) -> Path:
    """Dequantize a GGUF file (model and tokenizer) into a safetensors folder `out` that `load_model` takes.

    The folder appears whole or not at all: it is written beside `out` and renamed into place.
    """
    gguf, out = Path(gguf), Path(out)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with _ConversionProgress(progress or (lambda fraction, message: None), gguf.name) as phases, fast_gguf_loading():
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        phases.begin("tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        phases.begin("saving")
        # The weights are dequantized to fp32; saving must not claim a GGUF quantization.
        # PreTrainedModel declares no hf_quantizer (it is set at load), so mypy falls back to Module.__getattr__'s type.
        model.hf_quantizer = None  # type: ignore[assignment]
        model.config.quantization_config = None
        with staged_folder(out) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    return out


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """bf16 on CUDA; fp32 on CPU.

    On the reference CPU (no AMX) a bf16 verify costs 2.75x a bf16 step and oneDNN packing is fp32
    only, so bf16 loses there (docs/cpu.md, "Number formats"); fp32 also keeps single-token and
    multi-token forwards numerically close enough that greedy speculation stays token-identical to AR.
    """
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {
            "float32": torch.float32,
            "fp32": torch.float32,
            "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16,
            "float16": torch.float16,
            "fp16": torch.float16,
        }[dtype]
    except KeyError:
        raise ModelError(f"unknown dtype {dtype!r}; use auto, float32, bfloat16 or float16") from None


def parameter_count(config) -> int:
    """A causal LM's parameters (tied ones once), counted on the meta device: no memory taken."""
    from transformers import AutoModelForCausalLM  # slow to import: only where it is used

    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def available_bytes(device: torch.device) -> int | None:
    """Memory free for a model on `device` (on the CPU, MemAvailable: page cache counts as free); None: unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _weight_bytes(model_dir: Path, dtype: torch.dtype) -> int | None:
    files = list(model_dir.glob("*.safetensors"))
    if not files:
        return None
    from safetensors import safe_open

    elements = 0
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                elements += math.prod(f.get_slice(name).get_shape())
    return elements * torch.finfo(dtype).bits // 8


# What a tokenizer_config.json may hold for `_plain_tokenizer` to read its folder: special tokens, limits, sides
# and the names the loader itself writes. Anything else (added tokens' flags, a class's own options such as
# Llama's `legacy`, custom code) goes through transformers' whole loading.
_PLAIN_TOKENIZER_KEYS = {
    "tokenizer_class", "backend", "is_local", "local_files_only", "name_or_path", "model_max_length", "padding_side",
    "truncation_side", "clean_up_tokenization_spaces", "model_input_names", "chat_template",
}  # fmt: skip
_TOKENIZER_BOOKKEEPING = {"tokenizer_class", "backend", "is_local", "local_files_only", "name_or_path"}


def _plain_tokenizer(folder: Path):
    """The folder's tokenizer, its class built straight from tokenizer.json, where its tokenizer_config.json
    holds only special tokens and plain settings (the packaged models' do); None otherwise. The same tokenizer as
    AutoTokenizer's (tests/integration/test_packaged_tokenizers.py), without its parsing the file three more
    times in Python: about 1.7 s less on Gemma-3's 262k tokens (docs/cpu.md, "What a start costs")."""
    build = _plain_tokenizer_build(folder)
    return _built_tokenizer(build, folder) if build else None


def _plain_tokenizer_build(folder: Path) -> Callable[[], Any] | None:
    """How `_plain_tokenizer` builds the folder's tokenizer, or None. The class is resolved (its module imported)
    here, so that the build, mostly the file's parse, may run on another thread: transformers' lazy modules are
    not made for imports from two threads at once, and the model's load imports beside it."""
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    config_file, tokenizer_file = folder / "tokenizer_config.json", folder / "tokenizer.json"
    if not (config_file.is_file() and tokenizer_file.is_file()) or (folder / "special_tokens_map.json").exists():
        return None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
        plain = all(
            key in _PLAIN_TOKENIZER_KEYS or (key.endswith("_token") and isinstance(value, str))
            for key, value in config.items()
        )
        tokenizer_class = tokenizer_class_from_name(config.get("tokenizer_class") or "PreTrainedTokenizerFast")
        if not plain or tokenizer_class is None:
            return None
        settings = {key: value for key, value in config.items() if key not in _TOKENIZER_BOOKKEEPING}
        if (template := folder / "chat_template.jinja").is_file():  # where transformers saves it apart
            settings["chat_template"] = template.read_text(encoding="utf-8")
        return lambda: tokenizer_class(tokenizer_file=str(tokenizer_file), name_or_path=str(folder), **settings)
    except Exception as e:  # transformers' own loading decides, and says what is wrong
        log.debug("tokenizer in %s: the plain way failed (%s); loading it through AutoTokenizer", folder, e)
        return None


def _built_tokenizer(build: Callable[[], Any], folder: Path):
    try:
        return build()
    except Exception as e:  # transformers' own loading decides, and says what is wrong
        log.debug("tokenizer in %s: the plain way failed (%s); loading it through AutoTokenizer", folder, e)
        return None


def load_model(spec: str, device: str = "auto", dtype: str = "auto", progress: Progress | None = None):
    """Load a causal LM and its tokenizer: safetensors only, never remote code. `progress` hears how a
    first use's conversion goes (resolve), then that the weights are read."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where = resolve(spec, progress)
    if progress is not None:
        progress(1.0, f"reading the weights of {spec}")
    dev = pick_device(device)
    dt = pick_dtype(dtype, dev)
    local = Path(where)
    if local.is_dir():
        need, have = _weight_bytes(local, dt), available_bytes(dev)
        if need and have and need > have:
            raise OutOfMemoryError(
                f"{spec} needs about {need / 2**30:.1f} GiB on {dev} but only {have / 2**30:.1f} GiB is free; "
                "pick a smaller model, a lower-precision dtype or another device"
            )
    cache_only = not local.is_dir() and not hub_reachable()
    build = _plain_tokenizer_build(local) if local.is_dir() else None
    # A plain tokenizer's file is parsed in Rust with the GIL let go: beside the weights' load, not after it.
    with ThreadPoolExecutor(1, thread_name_prefix="specdec-tokenizer") as pool:
        plain = pool.submit(_built_tokenizer, build, local) if build else None
        try:
            model = AutoModelForCausalLM.from_pretrained(
                where, dtype=dt, use_safetensors=True, trust_remote_code=False, local_files_only=cache_only
            )
            tokenizer = (plain.result() if plain else None) or AutoTokenizer.from_pretrained(
                where, trust_remote_code=False, local_files_only=cache_only
            )
        except torch.OutOfMemoryError as e:
            raise OutOfMemoryError(f"out of memory loading {spec} on {dev}: {e}") from e
        except (OSError, ValueError) as e:
            why = "the Hugging Face hub cannot be reached and it is not in the local cache" if cache_only else e
            raise ModelNotFoundError(
                f"cannot load model {spec!r} ({where}): {why}. Use a packaged alias ({', '.join(PACKAGED)}), "
                "a local directory with safetensors, a .gguf file, or a reachable HF id"
            ) from e
    try:
        # transformers decorates `to` with functools.wraps, whose stub loses the method binding of self.
        model.to(dev)  # type: ignore[arg-type]
    except torch.OutOfMemoryError as e:
        raise OutOfMemoryError(f"out of memory moving {spec} to {dev}: {e}") from e
    model.eval().requires_grad_(False)
    return model, tokenizer


def check_same_vocabulary(target_tokenizer, draft_tokenizer, what: str = "draft") -> None:
    """Speculation compares token ids, so both models must share one vocabulary."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        # same-sized vocabularies can differ too, so say how many entries differ
        differ = len(target_vocab.items() ^ draft_vocab.items()) // 2 or 1
        raise VocabularyMismatchError(
            f"the {what} tokenizer differs from the target's: {len(draft_vocab)} vs {len(target_vocab)} tokens, "
            f"{differ} of them mapped differently; speculative decoding needs both models to share one vocabulary"
        )
