"""Training corpus for drafts: labelled documents -> token budgets per language -> packed shards.

Sources:
- The Stack (`bigcode/the-stack-dedup`, `-smol`, or any dataset in its layout: one `data/<lang>`
  directory per language, a `content` column) through the `datasets` library, when reachable;
- local file lists, one path per line, one list per language and split (`<lang>.train.txt`,
  `<lang>.dev.txt` in one folder);
- natural language (`nl`): READMEs and docs from the same package roots, for the out-of-domain
  comparison.

Each language is tokenized up to its token budget, every document framed as [BOS] text [EOS],
and the stream of each language cut into fixed-length sequences, so a sequence belongs to one
language (documents may continue across sequences). Shards are safetensors (`tokens` [N, L]
int32, `language` [N] int16) plus `manifest.json`. The output depends only on the inputs and the seed.

A corpus can also travel as packed source text, tokenized on the machine that trains: packed.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

log = logging.getLogger(__name__)

# The Stack's directory names differ from our grammar names in a few places.
STACK_DIRS = {"cpp": "c++", "csharp": "c-sharp"}
NL = "nl"
NL_SUFFIXES = (".md", ".rst", ".txt", ".adoc")
MAX_DOC_BYTES = 1_000_000


class CorpusError(ValueError):
    pass


@dataclass
class Document:
    language: str
    text: str
    source: str  # a path, or dataset:row


@dataclass
class LanguageStats:
    documents: int = 0
    tokens: int = 0
    sequences: int = 0
    sources: set[str] = field(default_factory=set)


# --------------------------------------------------------------------------- sources


def local_documents(list_file: str | Path, language: str) -> Iterator[Document]:
    """Documents named by a file list (one path per line)."""
    return documents_at(listed_paths(list_file), language)


def listed_paths(list_file: str | Path) -> list[str]:
    return [line.strip() for line in Path(list_file).read_text().splitlines() if line.strip()]


def documents_at(paths: Iterable[str], language: str) -> Iterator[Document]:
    """The files at `paths`, skipping unreadable, binary, non-UTF-8 and huge ones."""
    for path in paths:
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            log.warning("skipping %s: %s", path, e)
            continue
        if len(raw) > MAX_DOC_BYTES or b"\0" in raw:
            continue
        try:
            yield Document(language, raw.decode("utf-8"), path)
        except UnicodeDecodeError:
            continue


def split_lists(splits_dir: str | Path, split: str, languages: list[str] | None) -> dict[str, Path]:
    """`<lang>.<split>.txt` files in a directory; unknown requested languages are an error."""
    found = {p.name.split(".")[0]: p for p in sorted(Path(splits_dir).glob(f"*.{split}.txt"))}
    if not found:
        raise CorpusError(f"no *.{split}.txt lists in {splits_dir}")
    if languages:
        missing = [lang for lang in languages if lang not in found and lang != NL]
        if missing:
            raise CorpusError(f"unknown language(s) {missing}; {splits_dir} has {sorted(found)}")
        return {lang: found[lang] for lang in languages if lang in found}
    return found


def stack_documents(dataset: str, language: str, split: str = "train") -> Iterator[Document]:
    """One language of The Stack (or a local dataset in its layout) through `datasets`, streamed."""
    try:
        from datasets import load_dataset
    except ImportError as e:
        raise CorpusError("reading The Stack needs the `datasets` package: pip install datasets") from e
    data_dir = f"data/{STACK_DIRS.get(language, language)}"
    rows = load_dataset(dataset, data_dir=data_dir, split=split, streaming=True)
    for i, row in enumerate(rows):
        text = row.get("content")
        if text and len(text.encode("utf-8", "ignore")) <= MAX_DOC_BYTES and "\0" not in text:
            yield Document(language, text, f"{dataset}:{data_dir}:{i}")


def nl_documents(roots: Iterable[str | Path], split: str) -> Iterator[Document]:
    """READMEs and docs under package roots; dev takes about 1 directory in 20 (by a path hash)."""
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            in_dev = int(hashlib.sha1(dirpath.encode()).hexdigest(), 16) % 20 == 0
            if in_dev != (split == "dev"):
                continue
            for name in sorted(filenames):
                if name.lower().endswith(NL_SUFFIXES) or name.upper().startswith("README"):
                    yield from documents_at([os.path.join(dirpath, name)], NL)


def package_roots(roots_file: str | Path) -> list[str]:
    """Package roots from the corpus's ROOTS.txt (tab-separated; the third column is the root)."""
    roots = []
    for line in Path(roots_file).read_text().splitlines():
        cols = line.split("\t")
        if len(cols) >= 3 and os.path.isdir(cols[2]):
            roots.append(cols[2])
    return sorted(set(roots))


# --------------------------------------------------------------------------- building


def shuffled(documents: Iterable[Document], seed: int, language: str) -> list[Document]:
    """A deterministic order per (seed, language), so a budget takes a fair sample, not the first files."""
    docs = list(documents)
    random.Random(f"{seed}:{language}").shuffle(docs)
    return docs


def pack(token_stream: Iterable[list[int]], seq_len: int, budget: int) -> tuple[list[list[int]], int, int]:
    """Concatenate framed documents and cut full `seq_len` sequences until `budget` tokens.

    Returns (sequences, documents used, tokens used). A trailing partial sequence is dropped.
    """
    sequences: list[list[int]] = []
    buffer: list[int] = []
    documents = 0
    limit = budget // seq_len  # never more tokens than the budget
    for ids in token_stream:
        if len(sequences) >= limit:
            break
        documents += 1
        buffer.extend(ids)
        while len(buffer) >= seq_len and len(sequences) < limit:
            sequences.append(buffer[:seq_len])
            buffer = buffer[seq_len:]
    return sequences, documents, len(sequences) * seq_len


def frame(tokenizer, text: str) -> list[int]:
    head, tail = frame_ends(tokenizer)
    return head + tokenizer(text, add_special_tokens=False)["input_ids"] + tail


def frame_ends(tokenizer) -> tuple[list[int], list[int]]:
    """What frames a document: [BOS] before it and [EOS] after, where the tokenizer has them."""
    head = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []
    tail = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    return head, tail


def build_corpus(
    documents: dict[str, Iterable[Document]],
    tokenizer,
    out_dir: str | Path,
    budgets: dict[str, int],
    seq_len: int = 512,
    seed: int = 0,
    shard_sequences: int = 4096,
    tokenizer_name: str = "",
    command: str = "",
) -> dict:
    """Tokenize, pack and write shards; returns the manifest (also written as manifest.json)."""
    if seq_len < 2:
        raise CorpusError(f"seq_len must be >= 2, got {seq_len}")
    out = Path(out_dir)
    languages = sorted(documents)
    all_sequences: list[list[int]] = []
    labels: list[int] = []
    stats: dict[str, LanguageStats] = {}
    for index, language in enumerate(languages):
        budget = budgets.get(language, budgets.get("*", 0))
        st = stats[language] = LanguageStats()
        if budget <= 0:
            continue
        docs = shuffled(documents[language], seed, language)
        used_sources: list[str] = []

        def stream():
            for doc in docs:
                used_sources.append(doc.source)
                yield frame(tokenizer, doc.text)

        sequences, st.documents, st.tokens = pack(stream(), seq_len, budget)
        st.sequences = len(sequences)
        st.sources = {source_root(s) for s in used_sources[: st.documents]}
        all_sequences.extend(sequences)
        labels.extend([index] * len(sequences))
        log.info("%s: %d docs, %d tokens", language, st.documents, st.tokens)
    if not all_sequences:
        raise CorpusError("the corpus is empty: no language produced a full sequence within its budget")
    tokens = np.asarray(all_sequences, dtype=np.int32).reshape(len(all_sequences), seq_len)
    per_language = {
        lang: {
            "documents": s.documents,
            "tokens": s.tokens,
            "sequences": s.sequences,
            "budget": budgets.get(lang, budgets.get("*", 0)),
            "sources": sorted(s.sources),
        }
        for lang, s in stats.items()
    }
    return write_shards(
        out,
        tokens,
        np.asarray(labels, dtype=np.int16),
        languages,
        per_language,
        seed=seed,
        shard_sequences=shard_sequences,
        tokenizer_name=tokenizer_name,
        vocab_size=len(tokenizer),
        command=command,
    )


def write_shards(
    out: Path,
    tokens: np.ndarray,
    labels: np.ndarray,
    languages: list[str],
    per_language: dict[str, dict],
    *,
    seed: int,
    shard_sequences: int,
    tokenizer_name: str,
    vocab_size: int,
    command: str,
) -> dict:
    """Shuffle the sequences ([N, L] int32, labels [N] int16) by `seed`, write the shards and manifest.json."""
    out.mkdir(parents=True, exist_ok=True)
    order = list(range(len(tokens)))
    random.Random(seed).shuffle(order)  # interleave languages so a prefix of the shards is a fair mix
    tokens = tokens[order]
    labels = labels[order]
    shards = []
    for n, start in enumerate(range(0, len(order), shard_sequences)):
        name = f"shard-{n:05d}.safetensors"
        save_file(
            {
                "tokens": torch.from_numpy(np.ascontiguousarray(tokens[start : start + shard_sequences])),
                "language": torch.from_numpy(np.ascontiguousarray(labels[start : start + shard_sequences])),
            },
            str(out / name),
        )
        shards.append(name)
    manifest = {
        "format": "specdec-corpus",
        "version": 1,
        "seq_len": int(tokens.shape[1]),
        "seed": seed,
        "tokenizer": tokenizer_name,
        "command": command,  # how this corpus was built, for model cards
        "vocab_size": vocab_size,
        "languages": languages,
        "shards": shards,
        "sequences": len(order),
        "tokens": len(order) * int(tokens.shape[1]),
        "per_language": per_language,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def source_root(source: str) -> str:
    """A coarse provenance label: the dataset, or the first four path components (the package)."""
    if ":" in source and not source.startswith("/"):
        return source.split(":", 1)[0]
    return "/".join(Path(source).parts[:5])


# --------------------------------------------------------------------------- reading


@dataclass
class Shards:
    """A corpus loaded for training: all sequences in memory (int32; 1M tokens = 4 MB)."""

    tokens: torch.Tensor  # [N, L] int64
    language: torch.Tensor  # [N] int64, indices into `languages`
    languages: list[str]
    manifest: dict

    @classmethod
    def load(cls, directory: str | Path) -> Shards:
        directory = Path(directory)
        manifest_path = directory / "manifest.json"
        if not manifest_path.exists():
            raise CorpusError(f"{directory} has no manifest.json; build it with `specdec corpus`")
        manifest = json.loads(manifest_path.read_text())
        parts = [load_file(str(directory / name)) for name in manifest["shards"]]
        return cls(
            torch.cat([p["tokens"] for p in parts]).long(),
            torch.cat([p["language"] for p in parts]).long(),
            manifest["languages"],
            manifest,
        )

    def indices_of(self, language: str) -> torch.Tensor:
        return (self.language == self.languages.index(language)).nonzero().flatten()


def parse_budgets(spec: str, languages: list[str]) -> dict[str, int]:
    """'200k' (every language), or 'python=1M,zig=100k,*=200k'. Suffixes k and M."""

    def number(s: str) -> int:
        s = s.strip()
        scale = {"k": 1_000, "K": 1_000, "m": 1_000_000, "M": 1_000_000}.get(s[-1:], 1)
        try:
            return int(float(s[:-1] if scale > 1 else s) * scale)
        except ValueError:
            raise CorpusError(f"bad token budget {s!r}") from None

    budgets: dict[str, int] = {}
    for part in spec.split(","):
        if "=" in part:
            lang, value = part.split("=", 1)
            lang = lang.strip()
            if lang != "*" and lang not in languages:
                raise CorpusError(f"budget for unknown language {lang!r}; languages: {languages}")
            budgets[lang] = number(value)
        elif part.strip():
            budgets["*"] = number(part)
    return budgets
