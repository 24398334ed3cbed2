"""Prompt lookup: a model-free draft that copies what followed the last occurrence of the current
suffix, which is cheap and good at the identifiers code repeats."""

from __future__ import annotations

from .base import Drafter, Proposal

# The earlier occurrences `copies` looks through for continuations that differ: the latest ones.
COPIES_SEARCHED = 16


class NgramDrafter(Drafter):
    """Find the latest earlier occurrence of the last n tokens and propose what followed.

    The longest n in [min_ngram, max_ngram] that occurred before wins. The index of every n-gram's
    end positions grows only by the tokens added since the last call, so a round costs about the
    same at any context length; `reset` and `rollback` cut it to what is still valid.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if min_ngram < 1:
            raise ValueError(f"min_ngram must be at least 1, not {min_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._tokens: list[int] = []  # the tokens indexed, a prefix of what the last call saw
        # n-gram -> the positions of its last token, ascending. A stack, not only the latest: after a
        # rollback pops a later occurrence, the one before it is the latest again.
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        self._truncate(min(max(reused, 0), len(self._tokens)))
        self._index(prompt)  # here rather than in the first round: the request's prefill pays for it

    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0, lookup=None) -> Proposal:
        found = self.copies(committed, gamma, 1)
        return Proposal(found[0] if found else [], None)

    def copies(self, committed: list[int], gamma: int, count: int) -> list[list[int]]:
        """Up to `count` copies of up to `gamma` tokens, each from another earlier occurrence of the longest
        suffix that occurred before, latest first, and each starting otherwise than the ones before it: a draft
        tree's branches (decoder/tree.py). The first is what `propose` copies: after the latest one."""
        if gamma == 0 or count < 1:
            return []
        self._index(committed)
        length = len(committed)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            ends = self._ends.get(tuple(committed[length - n :]))
            if ends is None or len(ends) < 2:
                continue
            found: list[list[int]] = []
            starts: set[int] = set()
            # ends[-1] is the suffix itself; those before it are its earlier occurrences, the latest last
            for end in reversed(ends[-1 - COPIES_SEARCHED : -1]):
                copy = committed[end + 1 : end + 1 + gamma]
                if copy and copy[0] not in starts:
                    starts.add(copy[0])
                    found.append(copy)
                    if len(found) == count:
                        break
            return found
        return []

    def rollback(self, valid: int) -> None:
        self._truncate(min(max(valid, 0), len(self._tokens)))

    def _index(self, tokens: list[int]) -> None:
        """Make the index hold exactly `tokens`: keep the prefix it shares with them, add the rest."""
        if not isinstance(tokens, list):
            tokens = list(tokens)
        held = self._tokens
        # One comparison in C where the caller kept the contract (`tokens` extends what is held); a
        # caller that did not (another sequence without a reset) costs a search for where they part.
        if tokens[: len(held)] != held:
            self._truncate(_shared_prefix(tokens, held))
        start = len(held)
        held.extend(tokens[start:])
        ends = self._ends
        for n in range(self.min_ngram, self.max_ngram + 1):
            first = max(start, n - 1)  # the first new position an n-gram ends at
            # every n-gram ending at `first` or later, built in C
            grams = zip(*(held[first - n + 1 + offset :] for offset in range(n)))
            for position, gram in zip(range(first, len(held)), grams):
                stack = ends.get(gram)
                if stack is None:
                    ends[gram] = [position]
                else:
                    stack.append(position)

    def _truncate(self, valid: int) -> None:
        """Forget every n-gram that ends at `valid` or later, and the tokens from `valid` on."""
        held = self._tokens
        if valid >= len(held):
            return
        if valid < len(held) - valid:  # keeping less than is dropped: index the kept part again
            kept = held[:valid]
            held.clear()
            self._ends.clear()
            self._index(kept)
            return
        ends = self._ends
        for n in range(self.min_ngram, self.max_ngram + 1):
            first = max(valid, n - 1)  # the first dropped position an n-gram ends at
            grams = zip(*(held[first - n + 1 + offset :] for offset in range(n)))
            for gram in grams:
                stack = ends[gram]
                stack.pop()  # the dropped positions are the last entries of each stack: one pop each
                if not stack:
                    del ends[gram]
        del held[valid:]


def _shared_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of `a` and `b`, by halving with comparisons in C."""
    low, high = 0, min(len(a), len(b))  # a[:low] == b[:low]; the prefix is at most high long
    if a[:high] == b[:high]:
        return high
    high -= 1
    while low < high:
        middle = (low + high + 1) // 2
        if a[low:middle] == b[low:middle]:
            low = middle
        else:
            high = middle - 1
    return low
