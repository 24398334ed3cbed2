"""Packed source text, read on the machine that trains (decoder/training/packed.py): what the GPU carry wrote
(tools/gpu/packed_text.py) reads back document for document, and tokenizes into the shards `build_corpus` would
write, whatever the workers."""

from __future__ import annotations

import json

import pytest
from helpers.tokenizers import make_byte_tokenizer

from speccomplete.decoder.training.corpus import CorpusError, Document, Shards, frame
from speccomplete.decoder.training.packed import (
    PACKED_INDEX,
    encode_texts,
    read_packed_file,
    read_packed_index,
    tokenize_packed,
)
from tools.gpu.packed_text import text_bytes, write_packed

TOKENIZER = make_byte_tokenizer()


def awkward_docs(language: str, n: int) -> list[Document]:
    """Documents with what a line-based reader could break on: CRLF, lone CR, U+2028, non-ASCII, quotes."""
    text = 'say("héllo\\n")\r\nline\u2028sep\rcr\t"q"\n'
    return [Document(language, f"// {language} {i}\n" + text * (i + 1), f"/src/{language}/{i}") for i in range(n)]


def test_packed_text_round_trips_and_a_languages_chunks_join_into_one_xz_stream(tmp_path):
    documents = awkward_docs("python", 30)
    index = write_packed({"train": {"python": documents}}, tmp_path, chunk_bytes=500)
    files = index["splits"]["train"]["python"]["files"]
    assert len(files) > 3 and files[0] == "train/python.0000.jsonl.xz"
    read = [d for name in files for d in read_packed_file(tmp_path / name, "python")]
    assert [(d.language, d.text, d.source) for d in read] == [(d.language, d.text, d.source) for d in documents]
    joined = tmp_path / "joined.jsonl.xz"
    joined.write_bytes(b"".join((tmp_path / name).read_bytes() for name in files))
    assert [d.text for d in read_packed_file(joined, "python")] == [d.text for d in documents]
    assert index["splits"]["train"]["python"]["text_bytes"] == sum(text_bytes(d) for d in documents)
    assert read_packed_index(tmp_path) == json.loads((tmp_path / PACKED_INDEX).read_text())
    (tmp_path / files[-1]).unlink()
    with pytest.raises(CorpusError, match="1 files .* missing"):
        read_packed_index(tmp_path)


def test_encode_texts_gives_what_the_tokenizer_call_gives():
    texts = ["def f():\n    return 1\n", "  x  *  y", "héllo ✓", ""]
    for tokenizer in (TOKENIZER, make_byte_tokenizer(merges=((" ", "*"), ("d", "e")))):
        assert encode_texts(tokenizer, texts) == tokenizer(texts, add_special_tokens=False)["input_ids"]


def test_tokenize_packed_frames_documents_and_does_not_depend_on_workers(tmp_path):
    documents = {"python": awkward_docs("python", 25), "zig": awkward_docs("zig", 6)}
    packed = tmp_path / "packed"
    write_packed(
        {"train": documents, "dev": {"python": awkward_docs("python", 2)}}, packed, seq_len=16, seed=3, chunk_bytes=700
    )
    outputs = {}
    for workers in (1, 3):
        manifests = tokenize_packed(packed, TOKENIZER, tmp_path / f"out{workers}", workers=workers)
        outputs[workers] = {
            p.relative_to(tmp_path / f"out{workers}").as_posix(): p.read_bytes()
            for p in sorted((tmp_path / f"out{workers}").rglob("*"))
            if p.is_file()
        }
    assert outputs[1] == outputs[3] and "dev/manifest.json" in outputs[1]
    train = Shards.load(tmp_path / "out1" / "train")
    assert train.manifest["seq_len"] == 16 and train.manifest["seed"] == 3  # the pack's, unless given
    assert manifests["dev"]["languages"] == ["python"]
    for language, docs_ in documents.items():
        stream = [t for d in docs_ for t in frame(TOKENIZER, d.text)]
        count = len(stream) // 16
        expected = sorted(tuple(stream[i * 16 : (i + 1) * 16]) for i in range(count))
        got = sorted(tuple(row) for row in train.tokens[train.indices_of(language)].tolist())
        assert got == expected  # the language's framed stream, cut into whole sequences (shuffled among all)
        row = train.manifest["per_language"][language]
        assert row["tokens"] == count * 16 and row["documents"] == len(docs_) and row["budget"] is None
    capped = tokenize_packed(packed, TOKENIZER, tmp_path / "capped", seq_len=8, budgets={"*": 40}, workers=2)
    assert all(row["tokens"] == 40 for row in capped["train"]["per_language"].values())
