"""Packed source text, written for the GPU carry (tools/gpu/packed_text.py): chunks from the language with the
least text so far. Read back and tokenized: tests/decoder/training/test_packed.py."""

from __future__ import annotations

from speccomplete.decoder.training.corpus import Document
from tools.gpu.packed_text import balanced_chunks, text_bytes


def docs(language: str, n: int, size: int) -> list[Document]:
    return [
        Document(language, f"# {language} file {i}\n" + "x = 1\n" * (size // 6), f"/src/{language}/{i}")
        for i in range(n)
    ]


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
