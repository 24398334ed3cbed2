"""The draft's training corpus: budgets, packing, determinism, sources (file lists, a Stack-layout dataset). The
packed source text that travels to a GPU machine: test_packed.py here, tests/tools/test_packed_text.py."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tokenizers import BOS, EOS, make_byte_tokenizer

from speccomplete.decoder.training.corpus import (
    CorpusError,
    Document,
    Shards,
    build_corpus,
    frame,
    local_documents,
    pack,
    parse_budgets,
    split_lists,
    stack_documents,
)

TOKENIZER = make_byte_tokenizer()


def docs(language: str, n: int, size: int = 300) -> list[Document]:
    return [
        Document(language, f"# {language} file {i}\n" + "x = 1\n" * (size // 6), f"/src/{language}/{i}")
        for i in range(n)
    ]


def test_pack_cuts_the_framed_stream_into_full_sequences_within_budget():
    stream = [[BOS] + [i] * 7 + [EOS] for i in range(10)]  # 10 documents of 9 tokens
    sequences, documents, tokens = pack(iter(stream), seq_len=4, budget=30)
    assert tokens == 28 and len(sequences) == 7  # never more than the budget
    assert all(len(s) == 4 for s in sequences)
    flat = [t for doc in stream for t in doc]
    assert [t for s in sequences for t in s] == flat[:28]  # boundaries: documents continue across sequences
    assert documents == 4  # 28 tokens need the first 4 documents (36 tokens), no more


def test_frame_marks_document_boundaries():
    assert frame(TOKENIZER, "ab") == [BOS, ord("a"), ord("b"), EOS]


def test_budgets_are_respected_per_language(tmp_path):
    manifest = build_corpus(
        {"python": docs("python", 50), "zig": docs("zig", 2)},
        TOKENIZER,
        tmp_path,
        budgets={"python": 2000, "zig": 10_000},
        seq_len=128,
    )
    per = manifest["per_language"]
    assert per["python"]["tokens"] == 2000 // 128 * 128
    assert per["zig"]["tokens"] <= 2 * 320 and per["zig"]["documents"] == 2  # ran out of documents first
    shards = Shards.load(tmp_path)
    assert shards.tokens.shape == (manifest["sequences"], 128)
    for lang in ("python", "zig"):
        assert len(shards.indices_of(lang)) * 128 == per[lang]["tokens"]


def test_same_seed_same_shards_other_seed_other_sample(tmp_path):
    corpus = {"python": docs("python", 40), "rust": docs("rust", 40)}
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        build_corpus(corpus, TOKENIZER, tmp_path / name, {"*": 1024}, seq_len=64, seed=seed)
    a, b, c = (Shards.load(tmp_path / n) for n in "abc")
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.language, b.language)
    assert (tmp_path / "a" / "manifest.json").read_text() == (tmp_path / "b" / "manifest.json").read_text()
    assert not torch.equal(a.tokens, c.tokens)


def test_empty_corpus_is_a_clear_error(tmp_path):
    with pytest.raises(CorpusError, match="empty"):
        build_corpus({"python": []}, TOKENIZER, tmp_path, {"*": 1000}, seq_len=64)


def test_file_lists_and_unknown_language(tmp_path):
    src = tmp_path / "a.py"
    src.write_text("print('hi')\n")
    (tmp_path / "bin.py").write_bytes(b"\0\1\2")
    (tmp_path / "python.train.txt").write_text(f"{src}\n{tmp_path / 'bin.py'}\n{tmp_path / 'missing.py'}\n")
    lists = split_lists(tmp_path, "train", ["python"])
    assert [d.text for d in local_documents(lists["python"], "python")] == ["print('hi')\n"]  # binary, missing skipped
    with pytest.raises(CorpusError, match="unknown language"):
        split_lists(tmp_path, "train", ["cobol"])
    with pytest.raises(CorpusError, match="unknown language"):
        parse_budgets("cobol=1k", ["python"])
    assert parse_budgets("python=1.5M,*=200k", ["python"]) == {"python": 1_500_000, "*": 200_000}


def test_stack_layout_dataset_through_datasets(tmp_path):
    """The Stack path, on a local dataset in its layout: data/<lang>/ files with a `content` column."""
    for lang_dir, rows in (("python", ["def f():\n    return 1\n", "x = 2\n"]), ("c++", ["int main() {}\n"])):
        folder = tmp_path / "data" / lang_dir
        folder.mkdir(parents=True)
        (folder / "train-00000.jsonl").write_text(
            "".join(json.dumps({"content": r, "lang": lang_dir}) + "\n" for r in rows)
        )
    python = [d.text for d in stack_documents(str(tmp_path), "python")]
    cpp = list(stack_documents(str(tmp_path), "cpp"))  # our grammar name maps to The Stack's "c++"
    assert python == ["def f():\n    return 1\n", "x = 2\n"]
    assert [d.text for d in cpp] == ["int main() {}\n"] and cpp[0].language == "cpp"
    manifest = build_corpus(
        {"python": stack_documents(str(tmp_path), "python")}, TOKENIZER, tmp_path / "out", {"*": 16}, seq_len=8
    )
    assert manifest["per_language"]["python"]["tokens"] == 16
