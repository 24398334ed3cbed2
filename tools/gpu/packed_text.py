"""Packed source text, written here for the GPU carry (tools/gpu/pack.py): documents in xz-compressed chunks of JSON
lines and their index, packed.json, in the format decoder/training/packed.py reads on the machine that trains
(`specdec corpus --packed`). Per language a seeded sample of a file list; chunks from the language with the least
text so far, so the languages stay balanced by bytes wherever the pack stops.
"""

from __future__ import annotations

import heapq
import json
import lzma
import multiprocessing
import random
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path

from speccomplete.decoder.training.corpus import Document, documents_at, listed_paths
from speccomplete.decoder.training.packed import PACKED_FORMAT, PACKED_INDEX

XZ_PRESET = 6  # presets 7-9 and extreme gain little on code for several times the time
# A chunk is the unit of compression, of placement in a load and of one tokenizing worker's job: larger chunks
# compress a little better, smaller ones waste less of a load's end and spread over more workers.
CHUNK_TEXT_BYTES = 4 * 2**20


def sampled_documents(list_file: str | Path, language: str, seed: int) -> Iterator[Document]:
    """The documents of a file list in a deterministic order per (seed, language). The paths are shuffled,
    not the documents, so a sample reads only the files it takes."""
    return documents_at(sampled_paths(list_file, language, seed), language)


def sampled_paths(list_file: str | Path, language: str, seed: int) -> list[str]:
    """A file list's paths in sampled_documents' order."""
    paths = listed_paths(list_file)
    random.Random(f"{seed}:{language}").shuffle(paths)
    return paths


def text_bytes(document: Document) -> int:
    return len(document.text.encode("utf-8"))


def text_chunks(documents: Iterable[Document], chunk_bytes: int) -> Iterator[list[Document]]:
    """Consecutive runs of documents, each closed once it holds `chunk_bytes` of text or more."""
    chunk: list[Document] = []
    size = 0
    for document in documents:
        chunk.append(document)
        size += text_bytes(document)
        if size >= chunk_bytes:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def balanced_chunks(
    documents: dict[str, Iterable[Document]], chunk_bytes: int = CHUNK_TEXT_BYTES
) -> Iterator[tuple[str, int, list[Document]]]:
    """(language, chunk number, documents), always next from the language with the least text so far (ties by
    name): wherever a consumer stops, the languages are balanced by bytes, save those that ran out."""
    streams = {language: text_chunks(docs, chunk_bytes) for language, docs in documents.items()}
    heap = [(0, language, 0) for language in sorted(streams)]
    heapq.heapify(heap)
    while heap:
        size, language, number = heapq.heappop(heap)
        chunk = next(streams[language], None)
        if chunk is None:
            continue
        yield language, number, chunk
        heapq.heappush(heap, (size + sum(text_bytes(d) for d in chunk), language, number + 1))


def compress_documents(documents: list[Document]) -> bytes:
    """One chunk file's bytes: JSON lines {"text", "source"} compressed as one .xz stream."""
    lines = "".join(json.dumps({"text": d.text, "source": d.source}, ensure_ascii=False) + "\n" for d in documents)
    return lzma.compress(lines.encode("utf-8"), preset=XZ_PRESET)


def packed_file_name(split: str, language: str, number: int) -> str:
    return f"{split}/{language}.{number:04d}.jsonl.xz"


def packed_index(seq_len: int, seed: int, tokenizer: str = "") -> dict:
    """An empty packed.json: `record_packed_file` fills its splits."""
    return {
        "format": PACKED_FORMAT,
        "version": 1,
        "compression": "xz",
        "seq_len": seq_len,
        "seed": seed,
        "tokenizer": tokenizer,  # the tokenizer the pack's estimates used; the machine tokenizes with the target's
        "splits": {},
    }


def record_packed_file(index: dict, split: str, language: str, name: str, documents: list[Document], size: int) -> None:
    row = (
        index["splits"]
        .setdefault(split, {})
        .setdefault(language, {"documents": 0, "text_bytes": 0, "bytes": 0, "files": []})
    )
    row["documents"] += len(documents)
    row["text_bytes"] += sum(text_bytes(d) for d in documents)
    row["bytes"] += size
    row["files"].append(name)


def write_packed(
    documents: dict[str, dict[str, Iterable[Document]]],
    out_dir: str | Path,
    *,
    seq_len: int = 512,
    seed: int = 0,
    chunk_bytes: int = CHUNK_TEXT_BYTES,
) -> dict:
    """Every document of every split and language, in order, as a packed text corpus in one folder."""
    out = Path(out_dir)
    index = packed_index(seq_len, seed)
    for split, languages in sorted(documents.items()):
        for language, docs in sorted(languages.items()):
            for number, chunk in enumerate(text_chunks(docs, chunk_bytes)):
                name = packed_file_name(split, language, number)
                data = compress_documents(chunk)
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                (out / name).write_bytes(data)
                record_packed_file(index, split, language, name, chunk, len(data))
    (out / PACKED_INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return index


def compressed_chunks(
    chunks: Iterator[tuple[str, int, list[Document]]], workers: int = 1
) -> Generator[tuple[str, int, list[Document], bytes], None, None]:
    """`chunks` with each one's compressed bytes, in order; compressed `workers` at a time. A consumer that stops
    early wastes at most one round of compression (the pool never reads ahead further)."""
    if workers <= 1:
        for language, number, documents in chunks:
            yield language, number, documents, compress_documents(documents)
        return
    with multiprocessing.get_context("fork").Pool(workers) as pool:
        while batch := [chunk for _, chunk in zip(range(workers), chunks)]:
            for (language, number, documents), data in zip(batch, pool.map(compress_documents, [c[2] for c in batch])):
                yield language, number, documents, data
