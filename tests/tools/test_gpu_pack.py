"""The GPU carry's CPU rehearsal: `python -m tools.gpu.pack --smoke`, then gpu/unpack.sh for every load, in order.

The smoke pack carries a tiny random llama GGUF (no downloads), cut into several loads, its meta (the
metadata files and tensor map of its conversion here), the dev cases and a small corpus; unpacking must
check, join and convert it with the meta into the model transformers' conversion gives, which `load_model`
takes. Without the meta (--no-meta), unpacking converts through transformers.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.tiny_models import tiny_llama
from helpers.tokenizers import make_byte_tokenizer

from speccomplete.decoder.gguf_safetensors import differing_tensors
from speccomplete.decoder.models import load_model
from speccomplete.decoder.training.corpus import Shards
from speccomplete.decoder.training.packed import read_packed_file
from tools.gpu.pack import Part, main, plan_loads, wheel_requirements
from tools.gpu.packed_text import sampled_paths

REPO = Path(__file__).resolve().parents[2]
UNPACK = REPO / "gpu" / "unpack.sh"
CASES = REPO / "docs" / "examples" / "cases.jsonl"


def smoke_splits(tmp: Path) -> Path:
    """File lists of two languages: train files of random-ish lines (text that compresses about as little as
    code, so the packed corpus spans loads) and a dev file each."""
    rng = random.Random(0)
    splits = tmp / "splits"
    splits.mkdir()
    for lang, suffix in (("python", "py"), ("rust", "rs")):
        for split, files in (("train", 6), ("dev", 1)):
            paths = []
            for n in range(files):
                source = tmp / f"{lang}-{split}-{n}.{suffix}"
                source.write_text(
                    "".join(f"value_{rng.randrange(10**6)} = f({rng.randrange(10**4)}) + 0.{i}\n" for i in range(400))
                )
                paths.append(f"{source}\n")
            (splits / f"{lang}.{split}.txt").write_text("".join(paths))
    return splits


def smoke_gpu_pack(tmp: Path, out: Path, *more: str) -> None:
    tokenizer_dir = tmp / "tokenizer"
    if not tokenizer_dir.exists():
        tiny_llama().config.save_pretrained(tokenizer_dir)  # a model folder: `resolve` wants its config.json
        make_byte_tokenizer().save_pretrained(tokenizer_dir)
    splits = tmp / "splits" if (tmp / "splits").exists() else smoke_splits(tmp)
    argv = [
        "--smoke",
        "--out",
        str(out),
        "--cases",
        str(CASES),
        "--splits",
        str(splits),
        "--corpus-loads",
        "1",
    ]
    corpus = ["--corpus-tokenizer", str(tokenizer_dir), "--seq-len", "32", "--corpus-dev-bytes", "2000"]
    # the text the shipped draft's lendings saw (its lineage) is the repository's, not this pack's inputs'
    assert main([*argv, *corpus, "--seen", "", *more]) == 0


@pytest.fixture(scope="module")
def smoke_pack(tmp_path_factory) -> Path:
    """A smoke pack with the cases and a corpus that spans the model's last load and one of its own: the
    tokenizer and the split lists are built here."""
    tmp = tmp_path_factory.mktemp("pack")
    smoke_gpu_pack(tmp, tmp / "carry")
    return tmp / "carry"


def unpack(load: Path | str, root: Path, out: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPU_ROOT=str(root), OUT=str(out), PYTHON=sys.executable)
    return subprocess.run(["bash", str(UNPACK), str(load)], env=env, capture_output=True, text=True, timeout=120)


def test_loads_fit_and_pieces_hash_to_the_model(smoke_pack):
    plan = json.loads((smoke_pack / "plan.json").read_text())
    loads = plan["loads"]
    assert len(loads) >= 3  # the tiny model does not fit one smoke load: the pieces span loads
    for row in loads:
        folder = smoke_pack / row["name"]
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        assert size == row["bytes"] <= plan["load_bytes"]
        assert row["command"] == f"bash gpu/unpack.sh {row['carry'][0]}"
    assert loads[0]["cases"] and (smoke_pack / "load-1" / "cases.jsonl").read_bytes() == CASES.read_bytes()
    assert loads[0]["meta"] and (smoke_pack / "load-1" / "model-meta.tar.xz").is_file()
    corpus = plan["corpus"]
    assert loads[-1]["corpus"] and corpus["tokens_estimate"] > 0 and corpus["languages"] == ["python", "rust"]
    assert loads[-2]["corpus"] and loads[-2]["pieces"] and not loads[-1]["pieces"]  # the corpus spans two loads
    assert corpus["loads"] == [loads[-2]["name"], loads[-1]["name"]] and corpus["text_bytes"] > corpus["bytes"]
    # language-balanced by bytes: the two languages' text differs by less than a chunk
    python, rust = (corpus["per_language"][lang]["text_bytes"] for lang in ("python", "rust"))
    assert abs(python - rust) < max(python, rust) / 2
    # packed.json comes in the corpus's last load, so the machine has every file once it has the index
    assert (smoke_pack / loads[-1]["name"] / "corpus" / "packed.json").exists()
    assert sorted(p.name for p in (smoke_pack / loads[-2]["name"] / "corpus" / "dev").iterdir()) == [
        "python.0000.jsonl.xz",
        "rust.0000.jsonl.xz",
    ]
    pieces = sorted(smoke_pack.glob("load-*/gguf/*.part-*"), key=lambda p: p.name)
    whole = b"".join(p.read_bytes() for p in pieces)
    assert len(whole) == plan["model"]["bytes"]
    assert hashlib.sha256(whole).hexdigest() == plan["model"]["sha256"]
    sums = dict(
        reversed(line.split("  "))
        for line in (smoke_pack / "load-1" / "gguf" / "model.SHA256SUMS").read_text().splitlines()
    )
    assert all(sums[p.name] == hashlib.sha256(p.read_bytes()).hexdigest() for p in pieces)
    assert sums[plan["model"]["file"]] == plan["model"]["sha256"]


def test_unpack_every_load_converts_a_loadable_model(smoke_pack, tmp_path):
    root, out = tmp_path / "gpu", tmp_path / "out"
    plan = json.loads((smoke_pack / "plan.json").read_text())
    for row in plan["loads"]:
        done = unpack(row["carry"][0], root, out)
        assert done.returncode == 0, done.stdout + done.stderr
    report = (out / "unpack.txt").read_text()
    assert "sha256 OK" in report and "converted to" in report and f"done: all {len(plan['loads'])} loads" in report
    model_dir = root / "models" / plan["model"]["name"]
    # converted with the carried meta, into what transformers' conversion here gave (the meta's source)
    assert "with the carried meta in" in report and "falling back" not in report
    reference = smoke_pack / "cache" / "tiny-llama"
    assert differing_tensors(reference, model_dir) == []
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(p.name for p in reference.iterdir())
    model, tokenizer = load_model(str(model_dir), device="cpu")
    assert model.config.vocab_size == len(tokenizer) == 259
    assert tokenizer("def f").input_ids == list(b"def f")
    # env.sh points later steps at the model, the cases and the corpus, and at our package in this repo
    env = (root / "env.sh").read_text()
    assert f"SPECDEC_TARGET={model_dir}" in env and f"SPECDEC_CASES={root / 'cases.jsonl'}" in env
    # the packed text was tokenized on the "machine" into train/ and dev/, with the model's tokenizer
    assert f"SPECDEC_CORPUS={root / 'corpus'}" in env and "corpus: tokenized in" in report
    train, dev = Shards.load(root / "corpus" / "train"), Shards.load(root / "corpus" / "dev")
    assert train.tokens.shape[1] == dev.tokens.shape[1] == 32
    assert train.languages == dev.languages == ["python", "rust"] and len(dev.tokens) < len(train.tokens)
    assert all(len(train.indices_of(lang)) and len(dev.indices_of(lang)) for lang in train.languages)
    index = json.loads((root / "packed" / "packed.json").read_text())
    text = sum(row["text_bytes"] for row in index["splits"]["train"].values())
    documents = sum(row["documents"] for row in index["splits"]["train"].values())
    # a byte a token, [BOS] and [EOS] around each document, less each language's last partial sequence
    assert text - 2 * 32 < train.manifest["tokens"] <= text + 2 * documents
    where = subprocess.run(
        ["bash", "-c", f'source "{root}/env.sh" && "$PYTHON" -c "import speccomplete.decoder as d; print(d.__file__)"'],
        cwd=REPO,
        env=dict(os.environ, PYTHON=sys.executable, PYTHONPATH=""),
        capture_output=True,
        text=True,
    )
    assert where.stdout.strip() == str(root / "pkg" / "speccomplete" / "decoder" / "__init__.py"), where.stderr
    # rerunning the last load is harmless: the model is kept, not converted again
    again = unpack(plan["loads"][-1]["carry"][0], root, out)
    assert again.returncode == 0 and "converted to" not in again.stdout


def test_the_packed_corpus_is_deterministic(smoke_pack, tmp_path):
    """The same inputs and seed give the same corpus files, byte for byte (xz is deterministic)."""
    again = tmp_path / "carry"
    smoke_gpu_pack(smoke_pack.parent, again)

    def corpus_files(carry: Path) -> dict[str, bytes]:
        return {p.relative_to(carry).as_posix(): p.read_bytes() for p in sorted(carry.glob("load-*/corpus/**/*.*"))}

    first = corpus_files(smoke_pack)
    assert first and corpus_files(again) == first


def test_a_pack_takes_text_the_lineage_has_not_seen_and_says_what_is_left(smoke_pack, tmp_path):
    """The next lending's pack starts where the draft's earlier lendings' packs stopped, per language, in the
    same seeded order; another seed's record says nothing of this order."""
    first = json.loads((smoke_pack / "plan.json").read_text())["corpus"]
    assert first["files_seen_before"] == {"python": 0, "rust": 0} and first["files_taken"]["python"] >= 1
    lineage = tmp_path / "lineage.json"
    lending = {"corpus": {"seed": 0, "files_taken": {"python": 3}}}
    other_seed = {"corpus": {"seed": 7, "files_taken": {"rust": 5}}}
    lineage.write_text(json.dumps({"tokens": 0, "lendings": [lending, other_seed]}))
    smoke_gpu_pack(smoke_pack.parent, tmp_path / "carry", "--seen", str(lineage))
    plan = json.loads((tmp_path / "carry" / "plan.json").read_text())
    corpus = plan["corpus"]
    assert corpus["files_seen_before"] == {"python": 3, "rust": 0}
    assert corpus["files_taken"]["python"] > 3
    index = json.loads(next((tmp_path / "carry").glob("load-*/corpus/packed.json")).read_text())
    skipped = set(sampled_paths(smoke_pack.parent / "splits" / "python.train.txt", "python", 0)[:3])
    packed = set()
    for name in index["splits"]["train"]["python"]["files"]:
        path = next((tmp_path / "carry").glob(f"load-*/corpus/{name}"))
        packed |= {d.source for d in read_packed_file(path, "python")}
    assert packed and not packed & skipped
    assert corpus["unseen"]["python"]["files"] == 6 - corpus["files_taken"]["python"]
    assert "New text: 3 files" in (tmp_path / "carry" / "PLAN.md").read_text()


def test_without_the_meta_unpack_converts_through_transformers(tmp_path):
    out = tmp_path / "carry"
    assert main(["--smoke", "--no-meta", "--out", str(out)]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert not any(row["meta"] for row in plan["loads"]) and not list(out.glob("load-*/model-meta.tar.xz"))
    root, report = tmp_path / "gpu", tmp_path / "out"
    for row in plan["loads"]:
        done = unpack(out / row["name"], root, report)
        assert done.returncode == 0, done.stdout + done.stderr
    assert "with transformers (no meta carried) in" in (report / "unpack.txt").read_text()
    model, tokenizer = load_model(str(root / "models" / plan["model"]["name"]), device="cpu")
    assert model.config.vocab_size == len(tokenizer) == 259


def test_a_corrupt_piece_fails_loudly(smoke_pack, tmp_path):
    corrupt = tmp_path / "carry"
    subprocess.run(["cp", "-r", str(smoke_pack), str(corrupt)], check=True)
    piece = next((corrupt / "load-2" / "gguf").glob("*.part-*"))
    data = bytearray(piece.read_bytes())
    data[100] ^= 0xFF
    piece.write_bytes(bytes(data))
    root, out = tmp_path / "gpu", tmp_path / "out"
    assert unpack(corrupt / "load-1", root, out).returncode == 0
    failed = unpack(corrupt / "load-2", root, out)
    assert failed.returncode != 0
    assert "FAILED: checksums of" in failed.stderr and "FAILED" in (out / "unpack.txt").read_text()


def test_a_later_load_on_a_fresh_machine_says_start_over(smoke_pack, tmp_path):
    failed = unpack(smoke_pack / "load-2", tmp_path / "fresh", tmp_path / "out")
    assert failed.returncode != 0 and "start over from load-1" in failed.stderr


def test_wheels_go_first_and_pieces_fill_the_rest(tmp_path):
    wheels = []
    for name, size in (("a", 30), ("b", 70), ("c", 40)):
        wheels.append(tmp_path / f"{name}-1.0-py3-none-any.whl")
        wheels[-1].write_bytes(b"w" * size)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"g" * 250)
    loads, pieces = plan_loads(wheels, None, gguf, room=100, min_piece=10)
    assert [[(p.kind, p.size) for p in load.parts] for load in loads] == [
        [("wheel", 70), ("wheel", 30)],
        [("wheel", 40), ("piece", 60)],
        [("piece", 100)],
        [("piece", 90)],
    ]
    assert [p.offset for p in pieces] == [0, 60, 160]
    assert all(isinstance(p, Part) for p in pieces)


def test_wheel_requirements_follow_dependencies_the_machine_lacks():
    """Versions are this environment's; what the machine has (pytest, numpy, ...) is not carried, attrs aside."""
    found = dict(wheel_requirements(["pygls", "tree-sitter-language-pack", "pytest-lsp", "gguf"]))
    assert {"pygls", "lsprotocol", "cattrs", "attrs", "tree-sitter", "tree-sitter-language-pack"} <= set(found)
    assert found["tree-sitter-language-pack"] == "0.13.0"
    assert not {"typing-extensions", "pytest", "numpy", "pyyaml", "requests", "tqdm"} & set(found)


def test_aside_moves_the_shipped_weights_out_of_the_tree_and_back(tmp_path):
    """gpu/aside.sh: the loads travel without the tracked weights, and the tree comes back as it was."""
    repo = tmp_path / "repo"
    (repo / "gpu").mkdir(parents=True)
    (repo / "gpu" / "aside.sh").write_bytes((REPO / "gpu" / "aside.sh").read_bytes())
    weights = repo / "decoder" / "weights" / "draft" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    (repo / "decoder" / "weights" / "draft" / "config.json").write_text("{}")

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True)

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "weights")
    aside = ["bash", str(repo / "gpu" / "aside.sh")]
    subprocess.run([*aside, "out"], check=True, capture_output=True)
    assert not weights.exists()
    assert (repo / "decoder" / "weights" / "draft" / "config.json").exists()  # only the weights go
    assert (repo / ".git" / "aside" / "decoder" / "weights" / "draft" / "model.safetensors").read_bytes() == b"weights"
    subprocess.run([*aside, "back"], check=True, capture_output=True)
    assert weights.read_bytes() == b"weights"
    assert not (repo / ".git" / "aside").exists()
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout == ""
