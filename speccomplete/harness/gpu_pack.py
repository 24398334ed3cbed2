"""`specdec gpu-pack`: the carry folder a lent GPU machine needs, cut into loads of one device call each.

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
- the dev cases (`--cases`) and a packed training corpus (`--splits`), in the room left over.

Each load also holds `load.json` (what it carries) and `SHA256SUMS` (its own files), so a broken
transfer fails in the call that brought it. `PLAN.md` and `plan.json` list the calls in order.
"""

from __future__ import annotations

import argparse
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

from .tiny_gguf import write_tiny_gguf

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
    from speccomplete.decoder.models import PACKAGED

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
    from speccomplete.decoder.gguf_safetensors import header_sha256, pack_meta, tensor_reader, write_meta

    archive = cache / MODEL_META
    stamp_file = cache / "model-meta.stamp.json"
    stamp = {
        "gguf_header_sha256": header_sha256(tensor_reader(gguf)),
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


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(2**22):
            digest.update(block)
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


def pack_corpus(args, room: int, out: Path, shard_sequences: int = 4096) -> dict | None:
    """As many corpus tokens as fit in `room` bytes (int32 tokens), up to --corpus-tokens, in shards of
    `shard_sequences`; None if none fit."""
    from transformers import AutoTokenizer

    from speccomplete.decoder.models import resolve
    from speccomplete.decoder.training.corpus import (
        Document,
        build_corpus,
        local_documents,
        parse_budgets,
        split_lists,
    )

    lists = split_lists(args.splits, "train", None)
    per_sequence = 4 * args.seq_len + 2  # int32 tokens and an int16 language label
    room -= 8 * 2**10  # manifest.json and the shards' headers
    sequences = min(parse_budgets(args.corpus_tokens, ["*"])["*"] // args.seq_len, room // per_sequence)
    per_language = sequences // len(lists) * args.seq_len
    if per_language < args.seq_len:
        print(f"gpu-pack: no corpus: {room} bytes left hold less than one sequence per language")
        return None
    tokenizer = AutoTokenizer.from_pretrained(resolve(args.corpus_tokenizer), trust_remote_code=False)
    documents: dict[str, Iterable[Document]] = {lang: local_documents(listing, lang) for lang, listing in lists.items()}
    return build_corpus(
        documents,
        tokenizer,
        out,
        {lang: per_language for lang in lists},
        args.seq_len,
        shard_sequences=shard_sequences,
        tokenizer_name=args.corpus_tokenizer,
        command="specdec gpu-pack",
    )


def add_corpus(args, loads: list[Load], folders: list[Path], room: int, staging: Path) -> dict | None:
    """Pack the corpus into the room the last load leaves and into --corpus-loads loads of its own.

    Shards are small (a sixteenth of a load), so the room a load cannot use is at most one shard;
    unpack.sh gathers every load's shards into one corpus folder.
    """
    per_sequence = 4 * args.seq_len + 2
    shard_sequences = max(1, room // 16 // per_sequence)
    shard = shard_sequences * per_sequence
    corpus_room = room - loads[-1].used + args.corpus_loads * room - (args.corpus_loads + 1) * shard
    shutil.rmtree(staging, ignore_errors=True)
    corpus = pack_corpus(args, corpus_room, staging, shard_sequences)
    if corpus is None:
        return None
    files = sorted(staging.glob("shard-*.safetensors")) + [staging / "manifest.json"]
    load = loads[-1]
    for file in files:
        size = file.stat().st_size
        if load.used + size > room:
            loads.append(load := Load())
            folders.append(folders[-1].with_name(f"load-{len(loads)}"))
        part = Part(f"corpus/{file.name}", file, size, kind="corpus")
        load.parts.append(part)
        copy_part(part, folders[len(loads) - 1] / part.dest)
    return corpus


# --------------------------------------------------------------------------- the command


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("gpu-pack", help="build the carry folder for a lent GPU machine: loads of one call each")
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
    p.add_argument("--splits", help="corpus file lists (<lang>.train.txt): pack a training corpus into the room left")
    p.add_argument(
        "--corpus-loads",
        type=int,
        default=0,
        help="loads of corpus alone after the model's (about 9M tokens each); 0: only the room the model leaves",
    )
    p.add_argument("--corpus-tokens", default="100M", help="at most this many corpus tokens (k and M suffixes)")
    p.add_argument("--corpus-tokenizer", default=None, help="model spec whose tokenizer packs the corpus")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--load-bytes", type=int, help="bytes per load (default: 64 MiB less the tree and a margin)")
    p.add_argument("--margin-bytes", type=int, default=MARGIN_BYTES)
    return p


def run(args) -> int:
    from speccomplete.decoder.models import DEFAULT_TARGET, convert_gguf, resolve

    out = Path(args.out).resolve()
    repo = Path(__file__).resolve().parents[2]  # speccomplete/harness/ sits in the repo root's speccomplete/
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
        tree = tree_bytes(repo)
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
    whole = sha256_of(gguf)
    model_sums = "".join(f"{digest}  {piece}\n" for piece, digest in piece_sums.items()) + f"{whole}  {gguf.name}\n"

    corpus = None
    if args.splits:
        args.corpus_tokenizer = args.corpus_tokenizer or DEFAULT_TARGET
        corpus = add_corpus(args, loads, folders, room, out / "cache" / "corpus")
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
        sums = "".join(f"{sha256_of(p)}  {p.relative_to(folder).as_posix()}\n" for p in files)
        (folder / "SHA256SUMS").write_text(sums)
        size = folder_bytes(folder)
        if size > budget:
            raise PackError(f"{folder.name} holds {size} bytes, over its budget of {budget}")
        carry = folder.relative_to(repo).as_posix() if folder.is_relative_to(repo) else str(folder)
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
        "corpus": None if corpus is None else {k: corpus[k] for k in ("tokens", "seq_len", "languages")},
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
        lines.append(f"Corpus: {corpus['tokens']} tokens in {corpus['seq_len']}-token sequences; {languages}.")
    return "\n".join(lines) + "\n"
