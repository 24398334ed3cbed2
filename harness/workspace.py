"""A case's workspace: the files of its language nearest to it first, what `specdec bench
--compare-workspace` lets a prompt lookup copy from besides the prompt (decoder/drafts/references.py).

The walk starts in the document's folder and widens a folder at a time up to the workspace's root, so
the files it finds first are those most like the document, and a large tree is never walked whole.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from speccomplete.decoder.drafts.references import References
from speccomplete.server.language import AMBIGUOUS_HEADER, detect_language

MAX_FILES = 400  # files read at most for one language
MAX_FILE_BYTES = 200_000  # larger files are skipped (generated, minified or data)
MAX_TOKENS = 500_000  # tokens indexed for one language at most: about 22 MB (References)
# folders no one edits: dependencies, builds, caches and version control
SKIPPED_FOLDERS = frozenset({"node_modules", "target", "build", "dist", "out", "__pycache__", "venv", "vendor"})


def nearest_files(root: str | Path, near: str | Path, language: str, max_files: int = MAX_FILES) -> list[Path]:
    """Up to `max_files` files under `root` in `language`, but `near` itself: those in `near`'s folder first,
    then the rest of its parent's, and so on up to `root`."""
    root, near = Path(root).resolve(), Path(near).resolve()
    folder = near.parent if near.is_relative_to(root) else root
    found: list[Path] = []
    walked: Path | None = None  # the folder already walked whole, skipped when its parent is walked
    while len(found) < max_files:
        for path in _files_under(folder, skip=walked):
            if path != near and _language_of(path) == language:
                found.append(path)
                if len(found) == max_files:
                    break
        if folder == root or folder == folder.parent:
            break
        walked, folder = folder, folder.parent
    return found


def workspace_references(
    texts: Iterable[str], encode: Callable[[str], list[int]], max_tokens: int = MAX_TOKENS, min_ngram: int = 4
) -> References:
    """The references a lookup copies from: `texts`, nearest first, encoded until `max_tokens`; a copy needs a
    match of `min_ngram` tokens or more (up to twice that are tried)."""
    documents: list[list[int]] = []
    held = 0
    for text in texts:
        if held >= max_tokens:
            break
        documents.append(encode(text))
        held += len(documents[-1])
    return References(
        reversed(documents), max_tokens, min_ngram, 2 * min_ngram
    )  # the nearest last: a search takes the latest first


def read_texts(paths: list[Path]) -> Iterator[str]:
    """The texts of `paths` that are small enough and read as UTF-8; the others are skipped."""
    for path in paths:
        try:
            if path.stat().st_size <= MAX_FILE_BYTES:
                yield path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def _files_under(folder: Path, skip: Path | None) -> Iterator[Path]:
    """Every file under `folder`, sorted by name in each folder, but those under `skip` and hidden ones."""
    for parent, folders, files in os.walk(folder):
        folders[:] = sorted(
            name
            for name in folders
            if not name.startswith(".") and name not in SKIPPED_FOLDERS and Path(parent, name) != skip
        )
        for name in sorted(files):
            if not name.startswith("."):
                yield Path(parent, name)


def _language_of(path: Path) -> str:
    """A file's language by its extension; a `.h` file's by its text (language.header_language)."""
    if path.suffix.lower() != AMBIGUOUS_HEADER:
        return detect_language(str(path))
    try:
        return detect_language(str(path), text=path.read_text(encoding="utf-8", errors="replace")[:20_000])
    except OSError:
        return ""
