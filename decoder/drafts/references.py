"""What a prompt lookup may copy from beyond the prompt: other documents' tokens (the editor's other
open documents and the workspace's files of the same language), in a read-only index of bounded size.

Their tokens sit in one array, documents apart by a separator, and for each n-gram length the hashes of
every n-gram that holds no separator, sorted, with where each ends. A search hashes the suffix, finds its
run of equal hashes by bisection and checks the tokens (hashes may collide), so it costs the same at any
size, and the memory is about 4 + 8 bytes a token for each n-gram length (int32: the hashes are below 2**31).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

_SEPARATOR = -1  # between documents: no n-gram holds it and no copy runs past it
_BASE = 1_000_003  # the polynomial hash's base and modulus: products stay below 2**63
_MODULUS = (1 << 31) - 1


class References:
    """Other documents' tokens, the latest given last: a search takes the latest occurrence of the longest
    suffix of `min_ngram`..`max_ngram` tokens that occurs, and copies what follows it in its document.

    Up to `max_tokens` tokens are kept: the documents given last first (the nearest or most recently used,
    by the caller's order); a document that does not fit whole is cut to its start.
    """

    def __init__(self, documents: Iterable[list[int]], max_tokens: int, min_ngram: int = 4, max_ngram: int = 8):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram} and {max_ngram}")
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        kept: list[list[int]] = []
        room = max_tokens
        for document in reversed(list(documents)):
            if room <= 0:
                break
            kept.append(list(document[:room]))
            room -= len(kept[-1])
        self.documents = len(kept)
        tokens: list[int] = []
        for document in reversed(kept):
            tokens.extend(document)
            tokens.append(_SEPARATOR)
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.size = len(tokens) - len(kept)  # tokens held, separators apart
        self._hashes: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # n -> (sorted hashes, n-gram ends)
        for n in range(min_ngram, max_ngram + 1):
            self._hashes[n] = _index(self.tokens, n)

    def copy(self, committed: list[int], gamma: int) -> list[int]:
        """Up to `gamma` tokens that followed the latest occurrence of the longest suffix of `committed` that
        occurs here ([] where none does)."""
        if gamma < 1 or not self.size:
            return []
        for n in range(min(self.max_ngram, len(committed)), self.min_ngram - 1, -1):
            suffix = committed[len(committed) - n :]
            hashes, ends = self._hashes[n]
            key = _hash(suffix)
            low, high = np.searchsorted(hashes, key, "left"), np.searchsorted(hashes, key, "right")
            for end in ends[low:high][::-1]:  # ends ascend within a run of equal hashes: the latest first
                end = int(end)
                if self.tokens[end - n + 1 : end + 1].tolist() != suffix:
                    continue  # a collision
                following = self.tokens[end + 1 : end + 1 + gamma].tolist()
                following = following[: following.index(_SEPARATOR)] if _SEPARATOR in following else following
                if following:
                    return following
        return []


def _hash(tokens: list[int]) -> int:
    value = 0
    for token in tokens:
        value = (value * _BASE + token) % _MODULUS
    return value


def _index(tokens: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The hashes of every n-gram of `tokens` without a separator, sorted, and the position each ends at."""
    count = len(tokens) - n + 1
    if count <= 0:
        return np.empty(0, np.int32), np.empty(0, np.int32)
    hashes = np.zeros(count, np.int64)
    clean = np.ones(count, bool)
    for i in range(n):
        window = tokens[i : i + count].astype(np.int64)
        hashes = (hashes * _BASE + window) % _MODULUS
        clean &= window != _SEPARATOR
    ends = (np.flatnonzero(clean) + n - 1).astype(np.int32)
    hashes = hashes[clean].astype(np.int32)
    order = np.argsort(hashes, kind="stable")  # equal hashes keep their positions' order
    return hashes[order], ends[order]
