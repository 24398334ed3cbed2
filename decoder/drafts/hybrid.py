"""Prompt lookup first, a model draft only where the context has no match."""

from __future__ import annotations

from ..gamma import LookupSpan
from ..tree import DraftTree
from .base import Drafter, Proposal, tree_proposal
from .ngram import NgramDrafter
from .references import References

# Earlier occurrences a lookup's draft tree copies from at most (NgramDrafter.copies).
LOOKUP_BRANCHES = 3


class HybridDrafter(Drafter):
    """Prompt lookup where the context repeats itself (free, often long), the model draft elsewhere.

    The lookup needs a match of `min_ngram` tokens, so one common token does not trigger it. How
    much it copies adapts, apart from the model's γ. Behind an adaptive γ policy the decoder hands it a
    clock (`clock_lookup`, gamma.LookupSpan): the span expected to commit the most tokens a millisecond,
    from how far copies have matched and what a verify's rows cost on this machine. Without one, or before
    a round was timed: +2 after a fully accepted copy, else one more than was accepted. Long copies pay
    where code repeats itself and rows are cheap, and a copy that keeps missing shrinks to one token, whose
    verify costs about a plain step. With no model
    (`ngram+none`) a round without a match drafts nothing: a plain target step. Behind a
    drafter that asks it (a SelfDrafter), the lookup is asked again after each of its drafts, and a
    copy ends that round (Drafter.propose's `lookup`). Where the prompt has no match, a request's references
    (other documents, `refer`) are searched too; the server passes none (docs/speculative-decoding.md).
    """

    def __init__(
        self,
        model: Drafter | None,
        lookup_tokens: int = 16,
        min_ngram: int = 2,
        max_ngram: int = 4,
    ):
        self.model = model
        self.lookup = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        self.lookup_tokens = lookup_tokens  # the most one copy proposes
        self.span = lookup_tokens // 2  # what the next copy proposes by the lookup's own rule (no clock, a tree)
        # (committed length, tokens, depth into a run or None for a tree) of the last copy
        self._copied: tuple[int, int, int | None] | None = None
        self._run = 0  # tokens of the current run of fully accepted copies
        self._proposed_at = 0  # the committed length the last proposal followed
        self.spans: LookupSpan | None = None  # the clock the span follows (clock_lookup)
        self.references: References | None = None  # other documents, copied from where the prompt has no match

    @property
    def target_taps(self) -> tuple[int, ...]:  # type: ignore[override]  # the model draft's
        return self.model.target_taps if self.model is not None else ()

    @property
    def own_modules(self):
        return self.model.own_modules if self.model is not None else ()

    @property
    def drafts_on_the_target(self) -> bool:
        return self.model is not None and self.model.drafts_on_the_target

    def attach(self, steps) -> None:
        if self.model is not None:
            self.model.attach(steps)

    def warm_up(self, max_gamma: int) -> None:
        if self.model is not None:
            self.model.warm_up(max_gamma)

    def refer(self, references: References | None) -> None:
        self.references = references

    def clock_lookup(self, spans: LookupSpan | None) -> None:
        self.spans = spans

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        # A request starts from the middle span: the last one's may have grown on text of another kind.
        self.span, self._copied, self._run = self.lookup_tokens // 2, None, 0
        self.lookup.reset(prompt, reused)
        if self.model is not None:
            self.model.reset(prompt, reused)

    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0, lookup=None) -> Proposal:
        self._proposed_at = len(committed)
        found = self._lookup(committed, self._span(self._run, self.lookup_tokens))
        if found:
            self._copied = (len(committed), len(found), self._run)
            return Proposal(found, None, lookup=True)
        self._copied = None
        if self.model is None:
            return Proposal([], None)

        def copy(drafts: list[int]) -> list[int]:
            return self._copy(committed, drafts)

        return self.model.propose(committed, gamma, params, generator, min_confidence, lookup=copy)

    def propose_tree(self, committed, gamma, nodes, params, generator) -> Proposal | None:
        """Where the context repeats itself, the trie of copies from several earlier occurrences that go on
        differently (NgramDrafter.copies): the latest one whole, the others as far as `nodes` more rows allow,
        within a round's `lookup_tokens`; elsewhere the model draft's tree, or None where it drafts chains."""
        self._proposed_at = len(committed)
        span = min(self.span, self.lookup_tokens)  # the clock knows chains; a tree's accepted path may leave a copy
        copies = self.lookup.copies(committed, span, LOOKUP_BRANCHES)
        if not copies and self.references is not None:
            copies = [copy] if (copy := self.references.copy(committed, span)) else []
        if copies:
            tree = _trie_within(copies, min(self.lookup_tokens, len(copies[0]) + nodes))
            self._copied = (len(committed), max(tree.depths()), None)
            return tree_proposal(tree, lookup=True)
        self._copied = None
        if self.model is None:
            return Proposal([], None)
        return self.model.propose_tree(committed, gamma, nodes, params, generator)

    def _copy(self, committed: list[int], drafts: list[int]) -> list[int]:
        """A lookup after `drafts`, within one round's rows (lookup_tokens in all)."""
        room = self._span(0, self.lookup_tokens - len(drafts))
        found = self._lookup(committed + drafts, room) if room > 0 else []
        if found:
            self._copied = (len(committed) + len(drafts), len(found), 0)
        return found

    def shortened(self, kept: int) -> None:
        if self._copied is not None:
            start, copied, depth = self._copied
            verified = self._proposed_at + kept - start  # of the copy: the rows the target will check
            self._copied = (start, min(copied, verified), depth) if verified > 0 else None

    def _span(self, depth: int, room: int) -> int:
        """The most a copy at `depth` into a run proposes, within `room`: by the clock where there is one."""
        timed = self.spans.span(depth, room) if self.spans is not None else None
        return timed if timed is not None else min(self.span, room)

    def _lookup(self, tokens: list[int], room: int) -> list[int]:
        """Up to `room` tokens copied from the prompt, or else from the references."""
        found = self.lookup.copies(tokens, room, 1)
        if found:
            return found[0]
        return self.references.copy(tokens, room) if self.references is not None else []

    def rollback(self, valid: int) -> None:
        run = 0
        if self._copied is not None:
            start, copied, depth = self._copied
            accepted = valid - start
            if accepted >= 0:  # else a draft before the copy was rejected: the copy was not tried
                self.span = min(self.span + 2, self.lookup_tokens) if accepted == copied else accepted + 1
                if depth is not None:  # a chain's copy (a tree's accepted path may have left it)
                    if self.spans is not None:
                        self.spans.record(depth, copied, accepted)
                    run = depth + copied if accepted == copied else 0
            self._copied = None
        self._run = run
        self.lookup.rollback(valid)  # the lookup indexed the drafts it was asked after (`_copy`)
        if self.model is not None:
            self.model.rollback(valid)


def _trie_within(paths: list[list[int]], rows: int) -> DraftTree:
    """The trie of `paths`, each cut where the trie would pass `rows` nodes."""
    kept: list[list[int]] = []
    for path in paths:
        for length in range(len(path), 0, -1):
            if len(DraftTree.of_paths([*kept, path[:length]])) <= rows:
                kept.append(path[:length])
                break
    return DraftTree.of_paths(kept)
