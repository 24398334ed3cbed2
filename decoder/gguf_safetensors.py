"""A GGUF model straight to a safetensors folder, with no transformers model built: the tensors are read from the GGUF,
the rest comes from a META folder.

`convert_gguf` (decoder/models.py) loads a GGUF through transformers: it parses the metadata (the tokenizer's whole
vocabulary included: Gemma 3 has 262k tokens, scores and types), builds the model in fp32, converts the tokenizer and
saves both (docs/cpu.md, "What a start costs", has both ways' times). Here the metadata files
(config.json, tokenizer.json, ...) come from a META folder, and only the tensors are read from the GGUF: dequantized
(by the gguf package, or below for Q8_0 and Q5_0), renamed to transformers' names, and changed back as transformers'
GGUF loader changes them back (its tensor processors, transformers/modeling_gguf_pytorch_utils.py). The folder
written holds the same model.safetensors, tensor for tensor, and the same metadata files.

The META folder is built in one of two ways:
- `write_meta`, from a folder `convert_gguf` wrote, checked to convert to the same folder: the meta the packaged
  models ship (tools/model_meta.py) and the GPU carry's (tools/gpu/pack.py);
- `meta_from_gguf`, from the GGUF alone, for a GGUF we ship no meta for (a user's own): config and tokenizer as
  transformers makes them, the tensor map from transformers' names for the model's parameters.

The GPU carry uses it (tools/gpu/pack.py builds the meta, gpu/unpack.sh converts):

    python -m speccomplete.decoder.gguf_safetensors GGUF META OUT     META: a folder or its .tar.xz
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .gguf_loading import fast_gguf_loading, gguf_reader
from .packaged import WEIGHT_FILES

# The meta folder's own file: the GGUF -> safetensors tensor map. The others are copied into the output as they are.
TENSOR_MAP = "gguf_tensors.json"
# GGUF architectures whose tensors transformers changes back on loading (TENSOR_PROCESSORS in
# modeling_gguf_pytorch_utils.py): llama's q/k rows were permuted by llama.cpp's converter, and Gemma 2/3's and
# Nemotron's norm weights were stored as w + 1. Architectures with no processor there load unchanged.
PERMUTED_QK = frozenset({"llama"})
NORM_PLUS_ONE = frozenset({"gemma2", "gemma3", "nemotron"})
CHUNK_ELEMENTS = 2**20  # values a thread dequantizes at a time
# Architectures transformers reshapes, splits or merges tensors of (its legacy processors, and the newer loader of
# transformers/integrations/gguf): not done here, convert_gguf serves them.
UNSUPPORTED = frozenset(
    {"qwen2moe", "qwen3moe", "gpt_oss", "gpt-oss", "bloom", "t5", "t5encoder", "gpt2", "mamba", "lfm2", "minimax-m2"}
    | {"qwen35", "qwen35moe"}
)


class MetaMismatchError(ValueError):
    """The meta folder was built from another GGUF, or the GGUF holds what this converter cannot write."""


class UnhandledArchitectureError(MetaMismatchError):
    """The GGUF's architecture is one whose tensors transformers reshapes on loading: convert_gguf converts it."""


def read_scalar(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def gguf_architecture(reader) -> str:
    return str(read_scalar(reader, "general.architecture"))


def gguf_names(config, architecture: str):
    """The model of `config` on the meta device, in fp32, and its GGUF tensor name -> transformers name map, as
    transformers' loader maps them (get_gguf_hf_weights_map, within fast_gguf_loading: its name map built once)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())
    with fast_gguf_loading():
        return model, get_gguf_hf_weights_map(model, processor)


def hf_tensor_map(converted: Path, reader) -> dict[str, str]:
    """GGUF tensor name -> transformers name (gguf_names), for the tensors of the converted folder's
    model.safetensors."""
    from safetensors import safe_open
    from transformers import AutoConfig

    _, gguf_to_hf = gguf_names(AutoConfig.from_pretrained(converted), gguf_architecture(reader))
    with safe_open(str(converted / "model.safetensors"), framework="numpy") as saved:
        saved_names = set(saved.keys())
    mapped = {t.name: gguf_to_hf[t.name] for t in reader.tensors if gguf_to_hf.get(t.name) in saved_names}
    missing = saved_names - set(mapped.values())
    if missing:
        raise MetaMismatchError(f"{converted} holds tensors no GGUF tensor maps to: {sorted(missing)[:5]}")
    return mapped


def header_sha256(reader) -> str:
    """The hash of everything before the tensor data: the metadata (vocabulary included) and the tensor table."""
    return hashlib.sha256(memoryview(reader.data[: reader.data_offset])).hexdigest()


def write_meta(converted: str | Path, gguf: str | Path, meta: str | Path) -> Path:
    """Build the META folder from a folder `convert_gguf` wrote from `gguf`: its metadata files and the tensor map.

    Runs where transformers is at hand (it maps the names). Then it converts `gguf` with the new meta and checks
    the result equals `converted` tensor for tensor, so a meta that would convert wrongly is never written.
    """
    from safetensors import safe_open

    converted, meta = Path(converted), Path(meta)
    if not (converted / "model.safetensors").is_file():
        raise MetaMismatchError(f"{converted} has no single model.safetensors (sharded folders are not handled)")
    reader = gguf_reader(gguf, elements=False)
    architecture = gguf_architecture(reader)
    if architecture in UNSUPPORTED:
        raise UnhandledArchitectureError(f"GGUF architecture {architecture!r} is not handled here: use convert_gguf")
    names = hf_tensor_map(converted, reader)
    with safe_open(str(converted / "model.safetensors"), framework="numpy") as saved:
        slices = {name: saved.get_slice(name) for name in saved.keys()}
        header_metadata = saved.metadata()
    tensors = {}
    for tensor in reader.tensors:
        if tensor.name in names:
            hf_name = names[tensor.name]
            if slices[hf_name].get_dtype() != "F32":
                raise MetaMismatchError(
                    f"{hf_name} is {slices[hf_name].get_dtype()} in {converted}; only F32 is written"
                )
            tensors[tensor.name] = {"hf": hf_name, "shape": list(slices[hf_name].get_shape())}
    shutil.rmtree(meta, ignore_errors=True)
    meta.mkdir(parents=True)
    for file in sorted(converted.iterdir()):
        if file.is_file() and file.name not in WEIGHT_FILES:
            shutil.copy2(file, meta / file.name)
    tensor_map = {
        "gguf_architecture": architecture,
        "gguf_header_sha256": header_sha256(reader),
        "safetensors_metadata": header_metadata,
        "tensors": tensors,
    }
    (meta / TENSOR_MAP).write_text(json.dumps(tensor_map, indent=1) + "\n")
    with tempfile.TemporaryDirectory(dir=meta.parent, prefix=f".{meta.name}-check-") as check:
        differing = differing_tensors(converted, convert_with_meta(gguf, meta, Path(check) / "model"))
    if differing:
        shutil.rmtree(meta)
        raise MetaMismatchError(f"converting with the meta does not reproduce {converted}: {differing[:5]} differ")
    return meta


def meta_from_gguf(gguf: str | Path, meta: str | Path) -> Path:
    """Build the META folder from the GGUF alone, for one we ship no meta for (a user's own): the config, generation
    config and tokenizer as transformers makes them from the GGUF's metadata (in fast_gguf_loading), and the tensor
    map from transformers' GGUF names for the model's parameters, the model built on the meta device.

    No reference conversion checks it (that would be the conversion it stands in for), so it is built only for
    architectures whose tensors transformers loads as stored or changes back as `hf_weights` does; others raise
    UnhandledArchitectureError. A GGUF that lacks a tensor the model has, or holds one of another shape, raises
    MetaMismatchError: transformers would fill the first with random values.
    tests/decoder/test_gguf_safetensors.py checks that it converts as transformers does, file for file.
    """
    from transformers import AutoConfig, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    gguf, meta = Path(gguf), Path(meta)
    reader = gguf_reader(gguf, elements=False)
    architecture = gguf_architecture(reader)
    if architecture in UNSUPPORTED or (
        architecture in TENSOR_PROCESSORS and architecture not in PERMUTED_QK | NORM_PLUS_ONE
    ):
        raise UnhandledArchitectureError(f"GGUF architecture {architecture!r} is not handled here: use convert_gguf")
    with fast_gguf_loading():
        config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model, gguf_to_hf = gguf_names(config, architecture)
    # what save_pretrained writes: each tensor once (a tied head is its embedding)
    saved = {
        name: list(tensor.shape)
        for name, tensor in remove_tied_weights_from_state_dict(model.state_dict(), model).items()
    }
    tensors = {}
    for tensor in reader.tensors:
        hf_name = gguf_to_hf.get(tensor.name)
        if hf_name in saved:
            shape = [int(d) for d in reversed(tensor.shape)]
            if shape != saved[hf_name]:
                raise MetaMismatchError(f"{tensor.name} is {shape} in {gguf.name}; {hf_name} is {saved[hf_name]}")
            tensors[tensor.name] = {"hf": hf_name, "shape": shape}
    missing = set(saved) - {entry["hf"] for entry in tensors.values()}
    if missing:
        raise MetaMismatchError(f"no tensor of {gguf.name} is the model's {sorted(missing)[:5]}")
    with staged_folder(meta) as tmp:
        # as convert_gguf saves them: its architectures, and no quantization claimed for the fp32 weights
        model.config.architectures = [type(model).__name__]
        model.config.quantization_config = None
        model.config.save_pretrained(tmp)
        if model.can_generate():
            model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        tensor_map = {
            "gguf_architecture": architecture,
            "gguf_header_sha256": header_sha256(reader),
            "safetensors_metadata": {"format": "pt"},
            "tensors": tensors,
        }
        (tmp / TENSOR_MAP).write_text(json.dumps(tensor_map, indent=1) + "\n")
    return meta


def differing_tensors(expected: Path, actual: Path) -> list[str]:
    """The names of the tensors of model.safetensors in `expected` that `actual` lacks or holds otherwise."""
    from safetensors import safe_open

    differing = []
    with (
        safe_open(str(expected / "model.safetensors"), framework="numpy") as want,
        safe_open(str(actual / "model.safetensors"), framework="numpy") as got,
    ):
        if set(want.keys()) != set(got.keys()):
            return sorted(set(want.keys()) ^ set(got.keys()))
        for name in want.keys():
            a, b = want.get_tensor(name), got.get_tensor(name)
            if a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b):
                differing.append(name)
    return differing


def pack_meta(meta: str | Path, archive: str | Path) -> Path:
    """The meta folder as one .tar.xz (Gemma's tokenizer.json alone is tens of MB, and compresses well)."""
    meta, archive = Path(meta), Path(archive)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz") as tar:
        for file in sorted(meta.iterdir()):
            tar.add(file, arcname=file.name, recursive=False)
    return archive


def unpack_meta(archive: str | Path, folder: str | Path) -> Path:
    """The meta archive's files (plain files, no folders: pack_meta's) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:xz") as tar:
        for member in tar.getmembers():
            # checked here rather than by extractall's filter=, which Pythons before 3.11.4 lack
            if not member.isfile() or Path(member.name).name != member.name:
                raise MetaMismatchError(f"{archive} holds {member.name!r}, not a plain file of the meta")
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            (folder / member.name).write_bytes(source.read())
    return folder


def undo_llama_permutation(weights: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves each head's q/k rows for its rotary layout; this puts them back
    (transformers' LlamaTensorProcessor._reverse_permute_weights)."""
    half = weights.shape[0] // heads // 2
    return weights.reshape(heads, half, 2, *weights.shape[1:]).swapaxes(2, 1).reshape(weights.shape)


def dequantize_q8_0(rows: np.ndarray, out: np.ndarray) -> None:
    """Q8_0 blocks (an fp16 scale, 32 int8 values) into `out` in fp32: gguf.dequantize's values, bit for bit."""
    blocks = rows.reshape(-1, 34)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    np.multiply(blocks[:, 2:].view(np.int8), scale, out=out.reshape(-1, 32), dtype=np.float32)


def dequantize_q5_0(rows: np.ndarray, out: np.ndarray) -> None:
    """Q5_0 blocks (an fp16 scale, the 32 high bits, 16 bytes of low nibbles) into `out` in fp32, as gguf.dequantize
    gives them: value i is (low nibble i | high bit i << 4) - 16, the first 16 nibbles low, the next high."""
    blocks = rows.reshape(-1, 22)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    high = (blocks[:, 2:6].copy().view(np.uint32) >> np.arange(32, dtype=np.uint32)).astype(np.int32) & 1
    nibbles = blocks[:, 6:].astype(np.int32)
    values = (np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=1) | (high << 4)) - 16
    np.multiply(values, scale, out=out.reshape(-1, 32), dtype=np.float32)


# gguf's own numpy is slower on these two (Gemma-3-270M's embedding is Q8_0: most of a first start's conversion,
# docs/cpu.md "What a start costs"); whole-block arithmetic gives the same values, with no torch to import.
FAST_DEQUANTIZERS = {"Q8_0": dequantize_q8_0, "Q5_0": dequantize_q5_0}


def dequantize_all(tensors: list, threads: int | None = None) -> list[np.ndarray]:
    """The tensors in fp32, as gguf.dequantize gives them, a few rows at a time on a pool of threads: Q8_0 and Q5_0
    here, the other types by gguf.

    numpy lets go of the GIL in the arithmetic, so the threads run side by side; a GGUF block never spans two
    rows, so rows dequantized apart come out as they would together.
    """
    from gguf import GGMLQuantizationType, dequantize

    outputs: list[np.ndarray] = []
    chunks: list[tuple[np.ndarray, np.ndarray, GGMLQuantizationType]] = []
    for tensor in tensors:
        shape = tuple(int(d) for d in reversed(tensor.shape))
        if tensor.tensor_type == GGMLQuantizationType.F32:
            outputs.append(tensor.data.reshape(shape))
            continue
        rows = tensor.data.reshape(-1, tensor.data.shape[-1])
        out = np.empty((rows.shape[0], tensor.n_elements // rows.shape[0]), np.float32)
        step = max(1, CHUNK_ELEMENTS // out.shape[1])
        for i in range(0, len(rows), step):
            chunks.append((rows[i : i + step], out[i : i + step], tensor.tensor_type))
        outputs.append(out.reshape(shape))

    def dequantize_chunk(chunk) -> None:
        rows, out, tensor_type = chunk
        fast = FAST_DEQUANTIZERS.get(tensor_type.name)
        if fast is not None:
            fast(rows, out)
        else:
            out[...] = dequantize(rows, tensor_type)

    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        for _ in pool.map(dequantize_chunk, chunks):
            pass
    return outputs


def hf_weights(name: str, weights: np.ndarray, architecture: str, heads: int | None, kv_heads: int | None):
    """A dequantized GGUF tensor changed back as transformers' tensor processor for `architecture` does."""
    if architecture in PERMUTED_QK and heads is not None and kv_heads is not None:
        if ".attn_q." in name:
            weights = undo_llama_permutation(weights, heads)
        elif ".attn_k." in name:
            weights = undo_llama_permutation(weights, kv_heads)
    if architecture in NORM_PLUS_ONE and "norm.weight" in name:
        weights = weights - 1
    return np.ascontiguousarray(weights, dtype=np.float32)


def convert_with_meta(gguf: str | Path, meta: str | Path, out: str | Path) -> Path:
    """Write `out`, a safetensors folder `load_model` takes, from `gguf` and the META folder (or its .tar.xz).

    The folder appears whole or not at all: it is written beside `out` and renamed into place. A meta built from
    another GGUF (its metadata or tensor table differ) fails with MetaMismatchError before anything is written.
    """
    from safetensors.numpy import save_file

    gguf, meta, out = Path(gguf), Path(meta), Path(out)
    with staged_folder(out) as tmp:
        if meta.is_file():
            meta = unpack_meta(meta, tmp)
        else:
            for file in sorted(meta.iterdir()):
                if file.is_file():
                    shutil.copy2(file, tmp / file.name)
        tensor_map = json.loads((tmp / TENSOR_MAP).read_text())
        (tmp / TENSOR_MAP).unlink()  # the meta's own file: the output folder is what convert_gguf writes
        reader = gguf_reader(gguf, elements=False)
        if header_sha256(reader) != tensor_map["gguf_header_sha256"]:
            raise MetaMismatchError(f"the meta was built from another GGUF than {gguf} (their headers differ)")
        architecture = tensor_map["gguf_architecture"]
        heads = read_scalar(reader, f"{architecture}.attention.head_count")
        kv_heads = read_scalar(reader, f"{architecture}.attention.head_count_kv")
        found = {t.name: t for t in reader.tensors}
        names = list(tensor_map["tensors"])
        tensors = {}
        for name, weights in zip(names, dequantize_all([found[name] for name in names])):
            expected = tensor_map["tensors"][name]
            weights = hf_weights(name, weights, architecture, heads, kv_heads)
            if list(weights.shape) != expected["shape"]:
                raise MetaMismatchError(f"{name} came out {list(weights.shape)}, expected {expected['shape']}")
            tensors[expected["hf"]] = weights
        save_file(tensors, tmp / "model.safetensors", metadata=tensor_map["safetensors_metadata"])
    return out


@contextlib.contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A scratch folder beside `out`, renamed to `out` when the block ends well and removed when it fails, so
    `out` appears whole or not at all. If `out` appeared meanwhile (a concurrent conversion won), it is kept."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(tmp)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m speccomplete.decoder.gguf_safetensors GGUF META OUT", file=sys.stderr)
        return 2
    convert_with_meta(*args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
