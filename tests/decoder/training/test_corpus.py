"""The draft's training corpus: budgets, packing, determinism, sources (file lists, a Stack-layout dataset), and
the packed source text that travels to a GPU machine and is tokenized there."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.tokenizers import BOS, EOS, make_byte_tokenizer

from speccomplete.decoder.training.corpus import (
    PACKED_INDEX,
    CorpusError,
    Document,
    Shards,
    balanced_chunks,
    build_corpus,
    encode_texts,
    frame,
    local_documents,
    pack,
    parse_budgets,
    read_packed_file,
    read_packed_index,
    split_lists,
    stack_documents,
    text_bytes,
    tokenize_packed,
    write_packed,
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


def test_balanced_chunks_come_from_the_language_with_the_least_text_so_far():
    sources = {"c": docs("c", 10, 600), "python": docs("python", 12, 300), "zig": docs("zig", 2, 300)}
    seen = dict.fromkeys(sources, 0)
    left = {lang: len(d) for lang, d in sources.items()}
    numbers = dict.fromkeys(sources, 0)
    taken: dict[str, list[Document]] = {lang: [] for lang in sources}
    for language, number, chunk in balanced_chunks(sources, chunk_bytes=600):
        # every other language that still has documents has at least as much text already
        assert all(seen[language] <= seen[other] for other in sources if left[other] and other != language)
        assert number == numbers[language] and sum(text_bytes(d) for d in chunk) >= min(600, text_bytes(chunk[0]))
        numbers[language] += 1
        seen[language] += sum(text_bytes(d) for d in chunk)
        left[language] -= len(chunk)
        taken[language] += chunk
    assert taken == sources  # every document once, in its language's order


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
