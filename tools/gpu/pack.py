"""`python -m tools.gpu.pack` (from the repo root): the carry folder a lent GPU machine needs, cut into loads of
one device call each.

The GPU machine has no network and lacks some of our dependencies and the packaged target. Each call
to it carries the working tree plus a few git-ignored folders, 64 MiB in all, and what a call leaves
there survives only while the machine stays warm (about 30 s). So everything travels as LOADS, each a
folder `load-N/` that fits one call beside the tree, sent in back-to-back calls and unpacked by
`gpu/unpack.sh` (docs/gpu.md):

- the wheels the machine lacks, first (pinned to this environment's versions, with their missing
  dependencies);
- the target's GGUF in pieces, filling the loads, with `model.SHA256SUMS` over every piece and the
  whole file; the machine joins and converts it once. The first load brings `model-meta.tar.xz`, the
  converted model's metadata files and tensor map (decoder/gguf_safetensors.py), built here from the
  model as `convert_gguf` converts it (decoder/models.py): with it, the machine writes the same
  safetensors in seconds instead of parsing the GGUF's metadata through transformers for a minute;
- the dev cases (`--cases`) and a packed training corpus (`--splits`; tools/gpu/packed_text.py), in the room
  left over.

Each load also holds `load.json` (what it carries) and `SHA256SUMS` (its own files), so a broken
transfer fails in the call that brought it. `PLAN.md` and `plan.json` list the calls in order.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from speccomplete.harness.tiny_gguf import write_tiny_gguf

from .returns import sha256_file

# the shipped EAGLE-3 draft's record of the text its lendings trained on (tools/ratchet.py)
REPO = Path(__file__).resolve().parents[2]  # tools/gpu/ sits in the repo root
SHIPPED_LINEAGE = REPO / "decoder" / "weights" / "gemma3-270m-eagle3" / "lineage.json"

CALL_BYTES = 64 * 2**20  # what one device call may carry: the working tree and the carried folders
MARGIN_BYTES = 3 * 2**20  # room for the tree to grow between packing and the GPU session
META_BYTES = 16 * 2**10  # per load: load.json and the two checksum files
SMOKE_LOAD_BYTES = 40 * 2**10  # the CPU rehearsal: a tiny model in several loads

# What the GPU steps import that the machine lacks: the runtime (GGUF reading, the language server,
# the grammars) and the LSP tests. duckdb (24 MB) stays behind by default: only `specdec report` reads
# it, which runs here, and it would cost one more call.
DEFAULT_WHEELS = ("gguf", "pygls", "lsprotocol", "tree-sitter-language-pack", "pytest-lsp", "pytest-asyncio")
PINNED = {"tree-sitter-language-pack": "0.13.0"}  # 1.x downloads grammars at run time (pyproject.toml)
# The machine's Python packages, from the device image's list (read 2026-11-17): never carried.
MACHINE_PACKAGES = frozenset(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
    certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt
    jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba
    numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
    nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
    nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx
    onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
    orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
    pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
    scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
    sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
    tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
    wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split()
)
# Carried although the machine has them: cattrs 26 needs attrs >= 25.4, and the machine's version was never
# read (its wheel is 70 KB; a newer attrs keeps the old API).
CARRIED_ANYWAY = frozenset({"attrs"})
# The machine: CPython 3.12 on x86-64 Linux. Markers are evaluated for it, not for this interpreter.
MACHINE_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
MACHINE_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)


class PackError(ValueError):
    pass


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# --------------------------------------------------------------------------- wheels


def wheel_requirements(roots: list[str]) -> list[tuple[str, str]]:
    """(name, version) of `roots` and their dependencies, as installed here, less what the machine has."""
    from importlib import metadata

    from packaging.requirements import Requirement

    found: dict[str, str] = {}
    queue = [Requirement(root) for root in roots]
    while queue:
        requirement = queue.pop(0)
        name = normalized(requirement.name)
        if name in found or (name in MACHINE_PACKAGES and name not in CARRIED_ANYWAY):
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(MACHINE_MARKERS):
            continue
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise PackError(
                f"{name} is not installed here, so its version cannot be pinned: pip install {name}"
            ) from None
        version = distribution.version
        if name in PINNED and version != PINNED[name]:
            raise PackError(f"{name} {version} is installed here, but the project needs {PINNED[name]}")
        if not requirement.specifier.contains(version, prereleases=True):
            raise PackError(f"{name} {version} is installed here, but {requirement} is required")
        found[name] = version
        queue.extend(Requirement(r) for r in distribution.requires or ())
    return sorted(found.items())


def download_wheels(requirements: list[tuple[str, str]], cache: Path) -> list[Path]:
    """One wheel per requirement for the machine's Python and platform, kept in `cache` between packs."""
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", "-d", str(cache)]
    for platform in MACHINE_PLATFORMS:
        command += ["--platform", platform]
    subprocess.run(command + [f"{name}=={version}" for name, version in requirements], check=True)
    wheels = []
    for name, version in requirements:
        matches = [
            p
            for p in cache.glob("*.whl")
            if normalized(p.name.split("-")[0]) == name and p.name.split("-")[1] == version
        ]
        if len(matches) != 1:
            raise PackError(f"expected one wheel of {name}=={version} in {cache}, found {len(matches)}")
        wheels.append(matches[0])
    return wheels


# --------------------------------------------------------------------------- the model


def model_gguf(spec: str) -> tuple[str, Path]:
    """(name, GGUF path) of a packaged alias or a GGUF file; the name is the converted folder's on the machine."""
    from speccomplete.decoder.packaged import PACKAGED

    if spec in PACKAGED:
        return spec, PACKAGED[spec].gguf_path()
    path = Path(spec).expanduser()
    if not path.is_file():
        raise PackError(f"--model {spec!r} is neither a packaged alias ({', '.join(PACKAGED)}) nor a GGUF file")
    return path.stem, path


MODEL_META = "model-meta.tar.xz"  # in the first load; unpack.sh converts with it (decoder/gguf_safetensors.py)


def model_meta(gguf: Path, converted: Path, cache: Path) -> Path:
    """The meta the machine converts `gguf` with, as one .tar.xz built from `converted` (`convert_gguf`'s folder).

    Building it checks that a conversion with it reproduces `converted` tensor for tensor. It is kept in `cache`
    and built again only when the GGUF's header or the converted folder's files change.
    """
    from speccomplete.decoder.gguf_loading import gguf_reader
    from speccomplete.decoder.gguf_safetensors import header_sha256, pack_meta, write_meta

    archive = cache / MODEL_META
    stamp_file = cache / "model-meta.stamp.json"
    stamp = {
        "gguf_header_sha256": header_sha256(gguf_reader(gguf, elements=False)),
        "converted": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(converted.iterdir())},
    }
    if archive.is_file() and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        return archive
    stamp_file.unlink(missing_ok=True)
    meta = write_meta(converted, gguf, cache / "model-meta")
    pack_meta(meta, archive)
    shutil.rmtree(meta)
    stamp_file.write_text(json.dumps(stamp) + "\n")
    return archive


# --------------------------------------------------------------------------- loads


@dataclass
class Part:
    """One file of a load: a whole source file, or a byte range of one (a GGUF piece)."""

    dest: str  # path inside the load
    source: Path
    size: int
    offset: int = 0
    kind: str = "file"  # wheel, piece, cases, meta or corpus


@dataclass
class Load:
    parts: list[Part] = field(default_factory=list)

    @property
    def used(self) -> int:
        return sum(p.size for p in self.parts)


def plan_loads(
    wheels: list[Path], cases: Path | None, gguf: Path, room: int, min_piece: int, meta: Path | None = None
) -> tuple[list[Load], list[Part]]:
    """Wheels first (largest first, first fit), the cases and the model's meta in the first load, then GGUF pieces
    filling the rest.

    Returns the loads and the pieces in file order.
    """
    loads: list[Load] = []

    def fit(size: int) -> Load:
        for load in loads:
            if load.used + size <= room:
                return load
        loads.append(Load())
        return loads[-1]

    for wheel in sorted(wheels, key=lambda p: p.stat().st_size, reverse=True):
        size = wheel.stat().st_size
        if size > room:
            raise PackError(f"{wheel.name} ({size / 2**20:.1f} MiB) is larger than a load ({room / 2**20:.1f} MiB)")
        fit(size).parts.append(Part(f"whl/{wheel.name}", wheel, size, kind="wheel"))
    if cases is not None:
        size = cases.stat().st_size
        load = loads[0] if loads and loads[0].used + size <= room else fit(size)
        load.parts.append(Part("cases.jsonl", cases, size, kind="cases"))
    if meta is not None:  # in the first load it fits, so the machine has it when the last piece comes
        size = meta.stat().st_size
        load = loads[0] if loads and loads[0].used + size <= room else fit(size)
        load.parts.append(Part(MODEL_META, meta, size, kind="meta"))
    total = gguf.stat().st_size
    pieces: list[Part] = []
    offset = 0
    index = 0
    while offset < total:
        while index < len(loads) and room - loads[index].used < min(min_piece, total - offset):
            index += 1
        if index == len(loads):
            loads.append(Load())
        size = min(room - loads[index].used, total - offset)
        piece = Part(f"gguf/{gguf.name}.part-{len(pieces) + 1:03d}", gguf, size, offset, kind="piece")
        loads[index].parts.append(piece)
        pieces.append(piece)
        offset += size
    return loads, pieces


def copy_part(part: Part, dest: Path) -> str:
    """Write the part to dest and return its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with open(part.source, "rb") as src, open(dest, "wb") as out:
        src.seek(part.offset)
        left = part.size
        while left:
            block = src.read(min(left, 2**22))
            if not block:
                raise PackError(f"{part.source} ended early while cutting {part.dest}")
            digest.update(block)
            out.write(block)
            left -= len(block)
    return digest.hexdigest()


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def tree_bytes(repo: Path) -> int:
    """What travels with every call: tracked and untracked-but-not-ignored files."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=repo, check=True, capture_output=True
    ).stdout
    total = 0
    for name in listing.decode().split("\0"):
        if name and os.path.lexists(repo / name):
            total += os.lstat(repo / name).st_size
    return total


INDEX_BYTES = 64 * 2**10  # per load: room kept for the packed corpus's packed.json
FILE_OVERHEAD = 256  # per corpus file: its line in the load's SHA256SUMS and its name in packed.json


def add_corpus(
    args, loads: list[Load], folders: list[Path], room: int, staging: Path, seen_before: dict[str, int]
) -> dict | None:
    """Pack source text, xz-compressed, into the room the last load leaves and into --corpus-loads loads of its own.

    Per language a seeded sample of its file lists, balanced by text bytes: a dev chunk of --corpus-dev-bytes
    first, then train chunks from the language with the least text so far, each chunk in the first load it fits,
    until a chunk fits nowhere or the estimated tokens reach --corpus-tokens. The machine tokenizes it
    (`specdec corpus --packed`, run by unpack.sh once the model is there). Returns plan.json's `corpus` entry.
    """
    import time

    from transformers import AutoTokenizer

    from speccomplete.decoder.models import resolve
    from speccomplete.decoder.training.corpus import Document, documents_at, parse_budgets, split_lists
    from speccomplete.decoder.training.packed import PACKED_INDEX, encode_texts

    from .packed_text import (
        CHUNK_TEXT_BYTES,
        balanced_chunks,
        compress_documents,
        compressed_chunks,
        packed_file_name,
        packed_index,
        record_packed_file,
        sampled_documents,
        sampled_paths,
        text_bytes,
        text_chunks,
    )

    started = time.monotonic()
    shutil.rmtree(staging, ignore_errors=True)  # the token shards of older packs
    train_lists = split_lists(args.splits, "train", None)
    has_dev = any(Path(args.splits).glob("*.dev.txt"))
    dev_lists = split_lists(args.splits, "dev", None) if has_dev else {}
    dev_lists = {lang: path for lang, path in dev_lists.items() if lang in train_lists}
    tokenizer = AutoTokenizer.from_pretrained(resolve(args.corpus_tokenizer), trust_remote_code=False)
    # Every load keeps room for packed.json (it goes into the corpus's last load, so it arrives last) and for
    # each file's line in the load's SHA256SUMS.
    index_room = min(INDEX_BYTES, room // 8)
    free = [room - loads[-1].used - index_room] + [room - index_room] * args.corpus_loads
    first_load = len(loads) - 1
    chunk_bytes = min(CHUNK_TEXT_BYTES, room // 4)
    token_cap = parse_budgets(args.corpus_tokens, ["*"])["*"]
    index = packed_index(args.seq_len, args.corpus_seed, args.corpus_tokenizer)
    splits: dict[str, dict[str, dict]] = index["splits"]
    splits.update(train={}, dev={})
    bytes_per_token: dict[str, dict[str, float]] = {"train": {}, "dev": {}}
    used_slots: set[int] = set()

    def place(split: str, language: str, number: int, documents: list, data: bytes) -> bool:
        """Into the first load with room for it; False if none has."""
        slot = next((i for i, left in enumerate(free) if len(data) + FILE_OVERHEAD <= left), None)
        if slot is None:
            return False
        free[slot] -= len(data) + FILE_OVERHEAD
        used_slots.add(slot)
        while first_load + slot >= len(loads):
            loads.append(Load())
            folders.append(folders[-1].with_name(f"load-{len(loads)}"))
        name = packed_file_name(split, language, number)
        dest = folders[first_load + slot] / "corpus" / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
        loads[first_load + slot].parts.append(Part(f"corpus/{name}", dest, len(data), kind="corpus"))
        record_packed_file(index, split, language, name, documents, len(data))
        return True

    def measure(split: str, language: str, documents: list) -> None:
        """Text bytes per token (framing included), on up to 256 KiB of the split's first chunk of the language."""
        sample = next(text_chunks(documents, 256 * 2**10))
        tokens = sum(len(ids) + 2 for ids in encode_texts(tokenizer, [d.text for d in sample]))
        bytes_per_token[split][language] = sum(text_bytes(d) for d in sample) / tokens

    # dev first: small, and the trainers' per-language dev fitness wants every language
    for language, listing in dev_lists.items():
        sample = next(text_chunks(sampled_documents(listing, language, args.corpus_seed), args.corpus_dev_bytes), None)
        if sample is None:
            continue
        if place("dev", language, 0, sample, compress_documents(sample)):
            measure("dev", language, sample)
        else:
            print(f"gpu-pack: no room for the dev sample of {language}")
    estimate = 0.0
    # Each language's files in the seeded order, past the ones earlier lendings' packs took (--seen): new text
    order = {lang: sampled_paths(listing, lang, args.corpus_seed) for lang, listing in train_lists.items()}
    seen = {lang: min(seen_before.get(lang, 0), len(paths)) for lang, paths in order.items()}
    position = {lang: {path: i for i, path in enumerate(paths)} for lang, paths in order.items()}
    taken = dict(seen)  # each language's files taken up to, earlier lendings' included
    unseen_documents: dict[str, Iterable[Document]] = {
        lang: documents_at(paths[seen[lang] :], lang) for lang, paths in order.items()
    }
    chunks = balanced_chunks(unseen_documents, chunk_bytes)
    with contextlib.closing(compressed_chunks(chunks, workers=os.cpu_count() or 1)) as packed_chunks:
        for language, number, documents, data in packed_chunks:
            if language not in bytes_per_token["train"]:
                measure("train", language, documents)
            tokens = sum(text_bytes(d) for d in documents) / bytes_per_token["train"][language]
            if estimate + tokens > token_cap or not place("train", language, number, documents, data):
                break
            estimate += tokens
            taken[language] = position[language][documents[-1].source] + 1
    if not splits["train"]:
        print("gpu-pack: no corpus: no train chunk fits the room left")
        return None

    if not splits["dev"]:
        del splits["dev"]
    index["bytes_per_token"] = {lang: round(v, 3) for lang, v in sorted(bytes_per_token["train"].items())}
    data = (json.dumps(index, indent=1) + "\n").encode()
    last = max(used_slots)
    if len(data) > free[last] + index_room:
        raise PackError(f"{PACKED_INDEX} ({len(data)} bytes) does not fit the room kept for it ({index_room})")
    dest = folders[first_load + last] / "corpus" / PACKED_INDEX
    dest.write_bytes(data)
    loads[first_load + last].parts.append(Part(f"corpus/{PACKED_INDEX}", dest, len(data), kind="corpus"))

    def total(split: str, key: str) -> int:
        return sum(row[key] for row in splits.get(split, {}).values())

    text = total("train", "text_bytes") + total("dev", "text_bytes")
    compressed = total("train", "bytes") + total("dev", "bytes")
    return {
        "format": "jsonl.xz",
        "seq_len": args.seq_len,
        "seed": args.corpus_seed,
        "tokenizer": args.corpus_tokenizer,
        "languages": sorted(splits["train"]),
        "text_bytes": text,
        "bytes": compressed,
        "ratio": round(text / compressed, 2),
        "tokens_estimate": round(estimate),
        "dev_tokens_estimate": round(
            sum(row["text_bytes"] / bytes_per_token["dev"][lang] for lang, row in splits.get("dev", {}).items())
        ),
        "loads": [folders[first_load + slot].name for slot in sorted(used_slots)],
        "pack_seconds": round(time.monotonic() - started, 1),
        # what the ratchet records in the draft's lineage, and the next pack skips (--seen)
        "files_taken": taken,
        "files_seen_before": seen,
        "unseen": {
            lang: {
                "files": len(paths) - taken[lang],
                "tokens_estimate": round(
                    sum(_size(path) for path in paths[taken[lang] :]) / bytes_per_token["train"][lang]
                )
                if lang in bytes_per_token["train"]
                else None,
            }
            for lang, paths in sorted(order.items())
        },
        "per_language": {
            lang: {
                "documents": row["documents"],
                "text_bytes": row["text_bytes"],
                "bytes": row["bytes"],
                "files": len(row["files"]),
                "tokens_estimate": round(row["text_bytes"] / bytes_per_token["train"][lang]),
                "dev_text_bytes": splits.get("dev", {}).get(lang, {}).get("text_bytes", 0),
            }
            for lang, row in sorted(splits["train"].items())
        },
    }


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def seen_files(lineage_path: Path | None, seed: int) -> dict[str, int]:
    """Per language, how far into the seeded file order (--corpus-seed) the lendings of a draft's lineage took
    text (tools/ratchet.py records each pack's `files_taken`); empty without a lineage or for another seed."""
    if lineage_path is None or not lineage_path.is_file():
        return {}
    seen: dict[str, int] = {}
    for lending in json.loads(lineage_path.read_text()).get("lendings", []):
        corpus = lending.get("corpus") or {}
        if corpus.get("seed") == seed:
            for language, files in corpus.get("files_taken", {}).items():
                seen[language] = max(seen.get(language, 0), files)
    return seen


# --------------------------------------------------------------------------- the command


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.gpu.pack",
        description="the carry folder a lent GPU machine needs, in loads of one call each",
    )
    p.add_argument(
        "--out",
        default=".carry",
        help="carry folder (default: .carry): git-ignored and inside the repo, so that `carry` can name its loads",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="the CPU rehearsal: tiny loads, no downloads, a tiny random GGUF unless --model is given",
    )
    p.add_argument("--model", help="packaged alias or GGUF file to carry (default: the default target)")
    p.add_argument(
        "--no-meta",
        action="store_true",
        help="carry no model meta: the machine converts the GGUF through transformers (a minute, not seconds)",
    )
    p.add_argument("--wheels", default=",".join(DEFAULT_WHEELS), help="comma-separated roots; dependencies follow")
    p.add_argument("--no-wheels", action="store_true", help="carry no wheels")
    p.add_argument("--cases", help="a cases file to carry in the first load")
    p.add_argument(
        "--splits",
        help="corpus file lists (<lang>.train.txt, <lang>.dev.txt): pack source text, xz-compressed, into the room "
        "left; the machine tokenizes it",
    )
    p.add_argument(
        "--corpus-loads",
        type=int,
        default=0,
        help="loads of corpus alone after the model's; 0: only the room the model leaves",
    )
    p.add_argument(
        "--corpus-tokens", default="100M", help="at most about this many train tokens (estimated; k and M suffixes)"
    )
    p.add_argument(
        "--corpus-tokenizer", default=None, help="model spec whose tokenizer estimates the tokens (default: the target)"
    )
    p.add_argument("--corpus-seed", type=int, default=0, help="seed of the per-language samples")
    p.add_argument(
        "--seen",
        type=Path,
        default=SHIPPED_LINEAGE,
        help="a draft's lineage.json (tools/ratchet.py): skip the text its lendings saw (default: the shipped "
        "EAGLE-3 draft's; --seen '' takes text from the start)",
    )
    p.add_argument(
        "--corpus-dev-bytes", type=int, default=256 * 2**10, help="dev text per language, from <lang>.dev.txt"
    )
    p.add_argument("--seq-len", type=int, default=512, help="sequence length the machine tokenizes the corpus into")
    p.add_argument("--load-bytes", type=int, help="bytes per load (default: 64 MiB less the tree and a margin)")
    p.add_argument("--margin-bytes", type=int, default=MARGIN_BYTES)
    return p


def run(args) -> int:
    from speccomplete.decoder.models import DEFAULT_TARGET, convert_gguf, resolve

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("load-*"), out / "PLAN.md", out / "plan.json"]:  # only what a pack writes
        if old.is_dir():
            shutil.rmtree(old)
        elif old.exists():
            old.unlink()

    tree = None
    if args.load_bytes:
        budget = args.load_bytes
    elif args.smoke:
        budget = SMOKE_LOAD_BYTES
    else:
        tree = tree_bytes(REPO)
        budget = CALL_BYTES - tree - args.margin_bytes
    room = budget - min(META_BYTES, budget // 8)
    if room <= 0:
        raise PackError(f"no room for a load: the tree takes {tree} of the {CALL_BYTES} bytes a call carries")

    if args.smoke and not args.model:
        name, gguf = "tiny-llama", write_tiny_gguf(out / "cache" / "tiny-llama.gguf")
    else:
        name, gguf = model_gguf(args.model or DEFAULT_TARGET)
    meta = None
    if not args.no_meta:
        if args.smoke and not args.model:  # converted beside the tiny GGUF: it is written anew by every pack
            shutil.rmtree(out / "cache" / "tiny-llama", ignore_errors=True)
            converted = convert_gguf(gguf, out / "cache" / "tiny-llama")
        else:  # the cached conversion, made on first use like any start's
            converted = Path(resolve(args.model or DEFAULT_TARGET))
        meta = model_meta(gguf, converted, out / "cache" / "meta" / name)
    wheels: list[Path] = []
    requirements: list[tuple[str, str]] = []
    if not (args.no_wheels or args.smoke):
        requirements = wheel_requirements([w for w in args.wheels.split(",") if w])
        wheels = download_wheels(requirements, out / "cache" / "whl")
    cases = Path(args.cases) if args.cases else None
    loads, pieces = plan_loads(wheels, cases, gguf, room, min_piece=max(room // 16, 1), meta=meta)

    folders = [out / f"load-{number}" for number in range(1, len(loads) + 1)]
    piece_sums = {}
    for folder, load in zip(folders, loads):
        for part in load.parts:
            digest = copy_part(part, folder / part.dest)
            if part.kind == "piece":
                piece_sums[Path(part.dest).name] = digest
    whole = sha256_file(gguf)
    model_sums = "".join(f"{digest}  {piece}\n" for piece, digest in piece_sums.items()) + f"{whole}  {gguf.name}\n"

    corpus = None
    if args.splits:
        args.corpus_tokenizer = args.corpus_tokenizer or DEFAULT_TARGET
        seen = seen_files(args.seen if str(args.seen) not in ("", ".") else None, args.corpus_seed)
        corpus = add_corpus(args, loads, folders, room, out / "cache" / "corpus", seen)
    else:
        print("gpu-pack: no training corpus packed (this machine has none): give --splits DIR to pack one")

    pack_id = hashlib.sha256(model_sums.encode() + str(sorted(p.name for p in wheels)).encode()).hexdigest()[:16]
    rows = []
    for number, (folder, load) in enumerate(zip(folders, loads), 1):
        info = {
            "pack": pack_id,
            "load": number,
            "loads": len(loads),
            "model": {"name": name, "file": gguf.name, "bytes": gguf.stat().st_size, "pieces": len(pieces)},
            "wheels": [Path(p.dest).name for p in load.parts if p.kind == "wheel"],
            "pieces": [Path(p.dest).name for p in load.parts if p.kind == "piece"],
            "cases": any(p.kind == "cases" for p in load.parts),
            "meta": any(p.kind == "meta" for p in load.parts),
            "corpus": any(p.kind == "corpus" for p in load.parts),
        }
        (folder / "load.json").write_text(json.dumps(info, indent=1) + "\n")
        if info["pieces"]:
            (folder / "gguf" / "model.SHA256SUMS").write_text(model_sums)
        # Last, the load's own checksums over everything in it: unpack.sh checks them before anything else.
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        sums = "".join(f"{sha256_file(p)}  {p.relative_to(folder).as_posix()}\n" for p in files)
        (folder / "SHA256SUMS").write_text(sums)
        size = folder_bytes(folder)
        if size > budget:
            raise PackError(f"{folder.name} holds {size} bytes, over its budget of {budget}")
        carry = folder.relative_to(REPO).as_posix() if folder.is_relative_to(REPO) else str(folder)
        rows.append({"name": folder.name, "bytes": size, "carry": [carry], "command": f"bash gpu/unpack.sh {carry}"})
        rows[-1].update((k, info[k]) for k in ("wheels", "pieces", "cases", "meta", "corpus"))

    plan = {
        "pack": pack_id,
        "call_bytes": CALL_BYTES,
        "tree_bytes": tree,
        "margin_bytes": None if tree is None else args.margin_bytes,
        "load_bytes": budget,
        "model": {"name": name, "file": gguf.name, "bytes": gguf.stat().st_size, "sha256": whole},
        "wheels": [f"{n}=={v}" for n, v in requirements],
        "corpus": corpus,
        "loads": rows,
    }
    (out / "plan.json").write_text(json.dumps(plan, indent=1) + "\n")
    (out / "PLAN.md").write_text(plan_markdown(plan))
    print(plan_markdown(plan), end="")
    return 0


def plan_markdown(plan: dict) -> str:
    mib = 2**20
    lines = [
        "# The GPU carry: one device call per load, in this order",
        "",
        f"Pack {plan['pack']}. Model {plan['model']['name']} ({plan['model']['file']}, "
        f"{plan['model']['bytes'] / mib:.1f} MiB, sha256 {plan['model']['sha256'][:16]}...).",
        f"Each load holds at most {plan['load_bytes'] / mib:.2f} MiB"
        + (
            f": {plan['call_bytes'] / mib:.0f} MiB a call, less the working tree ({plan['tree_bytes'] / mib:.2f} MiB "
            f"when packed) and a margin of {plan['margin_bytes'] / mib:.0f} MiB. Repack if the tree grew by more."
            if plan["tree_bytes"] is not None
            else "."
        ),
        "Files stay on the machine only while it is warm (about 30 s after a call): make the calls back to "
        "back. If the machine is taken back, start again from load-1.",
        "",
        "| call | load | MiB | carries | carry | command |",
        "|---|---|---|---|---|---|",
    ]
    for number, row in enumerate(plan["loads"], 1):
        what = []
        if row["wheels"]:
            what.append(f"{len(row['wheels'])} wheels")
        if row["pieces"]:
            what.append(f"GGUF pieces {', '.join(p.rsplit('-', 1)[-1] for p in row['pieces'])}")
        if row["cases"]:
            what.append("cases")
        if row.get("meta"):
            what.append("model meta")
        if row["corpus"]:
            what.append("corpus")
        lines.append(
            f"| {number} | {row['name']} | {row['bytes'] / mib:.2f} | {'; '.join(what)} | "
            f"`{json.dumps(row['carry'])}` | `{row['command']}` |"
        )
    lines += ["", f"Wheels: {', '.join(plan['wheels']) or 'none'}."]
    corpus = plan["corpus"]
    if corpus is None:
        lines.append("Corpus: none.")
    else:
        languages = ", ".join(corpus["languages"])
        lines.append(
            f"Corpus: {corpus['text_bytes'] / 1e6:.1f} MB of source text, xz-compressed to {corpus['bytes'] / mib:.2f} "
            f"MiB (ratio {corpus['ratio']}) in {', '.join(corpus['loads'])}; "
            f"about {corpus['tokens_estimate'] / 1e6:.1f}M "
            f"train tokens and {corpus['dev_tokens_estimate'] / 1e3:.0f}k dev tokens by {corpus['tokenizer']} "
            f"(estimated here; unpack.sh tokenizes it into {corpus['seq_len']}-token sequences once the model is in); "
            f"{len(corpus['languages'])} languages: {languages}."
        )
        unseen = corpus.get("unseen") or {}
        if unseen:
            skipped = sum(corpus.get("files_seen_before", {}).values())
            lines += [
                "",
                f"New text: {skipped} files that earlier lendings took are skipped (--seen). Left unseen after this "
                "pack, per language (files, estimated tokens); a language near 0 runs out at the next lending:",
                "",
                "| language | files | tokens |",
                "|---|---|---|",
                *(f"| {lang} | {row['files']} | {row['tokens_estimate'] or '?'} |" for lang, row in unseen.items()),
            ]
            out = [lang for lang, row in unseen.items() if row["files"] == 0]
            if out:
                lines += ["", f"Ran out of unseen text: {', '.join(out)} (a later lending repeats their text)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return run(parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
