"""Packed source text, read on the machine that trains: a corpus that travelled as compressed source text (written
by the GPU carry, tools/gpu/packed_text.py) tokenized into the shard folders `train/` and `dev/` (`specdec corpus
--packed`).

The format: per split and language, chunks `<split>/<lang>.<NNNN>.jsonl.xz` (JSON lines with "text" and "source";
concatenated, a language's chunks are one valid .xz stream) and `packed.json`, the index (its "splits" list each
language's files, documents and bytes). `tokenize_packed` tokenizes chunks in parallel, one a job, and writes what
`corpus.build_corpus` would from the same documents in the same order; the output does not depend on the workers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import lzma
import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .corpus import CorpusError, Document, frame_ends, source_root, write_shards

log = logging.getLogger(__name__)

PACKED_FORMAT = "specdec-packed-text"
PACKED_INDEX = "packed.json"


def read_packed_file(path: str | Path, language: str) -> Iterator[Document]:
    # newline="\n": JSON escapes every line break inside a document, so only "\n" ends a line
    with lzma.open(path, "rt", encoding="utf-8", newline="\n") as f:
        for line in f:
            row = json.loads(line)
            yield Document(language, row["text"], row["source"])


def read_packed_index(packed_dir: str | Path) -> dict:
    """packed.json of a packed text corpus, once every file it lists is there."""
    packed_dir = Path(packed_dir)
    index_path = packed_dir / PACKED_INDEX
    if not index_path.exists():
        raise CorpusError(
            f"{packed_dir} has no {PACKED_INDEX}: not a packed text corpus (python -m tools.gpu.pack --splits)"
        )
    index = json.loads(index_path.read_text())
    if index.get("format") != PACKED_FORMAT:
        raise CorpusError(f"{index_path} is not a {PACKED_FORMAT} index")
    missing = [
        name
        for languages in index["splits"].values()
        for row in languages.values()
        for name in row["files"]
        if not (packed_dir / name).is_file()
    ]
    if missing:
        raise CorpusError(f"{len(missing)} files of {packed_dir} are missing (a load not unpacked?): {missing[:3]}")
    return index


def encode_texts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids without special tokens, as `tokenizer(text, add_special_tokens=False)` gives them; a fast
    tokenizer's Rust backend directly (no offsets, no Python dicts per document)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    encode_batch = getattr(backend, "encode_batch_fast", None)
    if encode_batch is None:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [encoding.ids for encoding in encode_batch(texts, add_special_tokens=False)]


@dataclass
class TokenizedFile:
    tokens: np.ndarray  # int32, every document framed as [BOS] text [EOS], in file order
    lengths: np.ndarray  # int64, framed tokens per document
    sources: list[str]  # per document, `corpus.source_root` of its source


def tokenize_file(tokenizer, path: str | Path, language: str) -> TokenizedFile:
    documents = list(read_packed_file(path, language))
    head, tail = frame_ends(tokenizer)
    flat: list[int] = []
    lengths = []
    for ids in encode_texts(tokenizer, [d.text for d in documents]):
        flat += head
        flat += ids
        flat += tail
        lengths.append(len(head) + len(ids) + len(tail))
    return TokenizedFile(
        np.array(flat, dtype=np.int32), np.array(lengths, dtype=np.int64), [source_root(d.source) for d in documents]
    )


_WORKER_TOKENIZER = None  # the pool's workers inherit it by fork


def _tokenize_job(job: tuple[str, str]) -> TokenizedFile:
    return tokenize_file(_WORKER_TOKENIZER, *job)


def _start_worker() -> None:
    # a worker is one core: the tokenizer's own threads would only contend with the other workers
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def tokenize_packed(
    packed_dir: str | Path,
    tokenizer,
    out_dir: str | Path,
    *,
    seq_len: int | None = None,
    seed: int | None = None,
    workers: int = 1,
    budgets: dict[str, int] | None = None,
    shard_sequences: int = 4096,
    tokenizer_name: str = "",
    command: str = "",
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, dict]:
    """Tokenize a packed text corpus into one shard folder per split (`out_dir/train`, `out_dir/dev`), as
    `build_corpus` would from the same documents in the same order; returns the manifests by split.

    Files are tokenized by `workers` processes (one file a job) and gathered in file order, so the output
    does not depend on `workers`. seq_len and seed default to the pack's; `budgets` caps tokens per language
    (default: everything).
    """
    global _WORKER_TOKENIZER
    packed_dir, out = Path(packed_dir), Path(out_dir)
    index = read_packed_index(packed_dir)
    seq_len = seq_len or index["seq_len"]
    seed = index["seed"] if seed is None else seed
    if seq_len < 2:
        raise CorpusError(f"seq_len must be >= 2, got {seq_len}")
    jobs = [
        (split, language, str(packed_dir / name))
        for split, languages in sorted(index["splits"].items())
        for language, row in sorted(languages.items())
        for name in row["files"]
    ]
    files: dict[tuple[str, str], list[TokenizedFile]] = {}
    _WORKER_TOKENIZER = tokenizer
    try:
        with contextlib.ExitStack() as stack:
            if workers <= 1:
                results: Iterator[TokenizedFile] = (tokenize_file(tokenizer, path, lang) for _, lang, path in jobs)
            else:
                pool = stack.enter_context(multiprocessing.get_context("fork").Pool(workers, _start_worker))
                results = pool.imap(_tokenize_job, [(path, lang) for _, lang, path in jobs])
            for done, ((split, language, _), result) in enumerate(zip(jobs, results), 1):
                files.setdefault((split, language), []).append(result)
                if progress:
                    progress(done, len(jobs))
    finally:
        _WORKER_TOKENIZER = None
    manifests = {}
    for split in sorted(index["splits"]):
        languages = sorted(index["splits"][split])
        sequences, labels, per_language = [], [], {}
        for number, language in enumerate(languages):
            parts = files.get((split, language), [])
            stream = np.concatenate([p.tokens for p in parts]) if parts else np.zeros(0, np.int32)
            lengths = np.concatenate([p.lengths for p in parts]) if parts else np.zeros(0, np.int64)
            sources = [s for p in parts for s in p.sources]
            budget = (budgets or {}).get(language, (budgets or {}).get("*"))
            count = (len(stream) if budget is None else min(len(stream), budget)) // seq_len
            used = count * seq_len
            documents = int(np.searchsorted(np.cumsum(lengths), used, side="left")) + 1 if used else 0
            sequences.append(stream[:used].reshape(count, seq_len))
            labels.append(np.full(count, number, dtype=np.int16))
            per_language[language] = {
                "documents": documents,
                "tokens": used,
                "sequences": count,
                "budget": budget,
                "sources": sorted(set(sources[:documents])),
            }
        if not sum(len(s) for s in sequences):
            log.warning("no %s split: no language produced a full %d-token sequence", split, seq_len)
            continue
        manifests[split] = write_shards(
            out / split,
            np.concatenate(sequences),
            np.concatenate(labels),
            languages,
            per_language,
            seed=seed,
            shard_sequences=shard_sequences,
            tokenizer_name=tokenizer_name,
            vocab_size=len(tokenizer),
            command=command,
        )
    if not manifests:
        raise CorpusError(f"the corpus is empty: no language produced a full {seq_len}-token sequence")
    return manifests
