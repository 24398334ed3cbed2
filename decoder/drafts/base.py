"""What the decoder asks of a drafter (`Drafter`) and what a drafter answers (`Proposal`).

The drafters subclass `Drafter` for its defaults: `attach` does nothing, `lookup_tokens` is 0 and
`drafts_on_the_target` is False and `target_taps` and `own_modules` empty unless a drafter says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from ..gamma import LookupSpan
    from ..sampling import SamplingParams
    from ..target_steps import Steps
    from ..tree import DraftTree
    from .references import References


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] draft probabilities; None for greedy or deterministic drafts
    lookup: bool = False  # copied from the context, not drafted by a model: says nothing about the γ to draft
    # [len(tokens) + 1, hidden]: the target's own final hidden states at the last committed token
    # and each draft, already in its cache (SelfDrafter); the verify is then only its head over them
    hidden: torch.Tensor | None = None
    # a draft tree (decoder/tree.py) whose nodes are `tokens`: several continuations, verified in one pass
    tree: DraftTree | None = None


def tree_proposal(tree: DraftTree, lookup: bool = False) -> Proposal:
    """A proposal of `tree`; one shaped as a chain is proposed as a chain, which the target verifies on
    its chain steps (compiled where they are)."""
    return Proposal(list(tree.tokens), None, lookup, tree=None if tree.is_chain else tree)


# Given a round's drafts so far, the tokens a prompt lookup copies after them ([] where none match).
Lookup = Callable[[list[int]], list[int]]


class Drafter(Protocol):
    """Proposes the next few tokens for the target to verify (decoder/engine.py runs the rounds)."""

    # The most tokens one round proposes whatever γ says (a prompt lookup's copy); 0 where γ
    # bounds every proposal. The target's steps are sized for the rows a round feeds (engine.round_rows).
    lookup_tokens: int = 0

    # Target layer ids whose input states the drafter reads (an EAGLE-3 draft's features): the
    # target's steps keep them for every token they hold (decoder/target_steps.py).
    target_taps: tuple[int, ...] = ()

    @property
    def own_modules(self) -> tuple[torch.nn.Module, ...]:
        """Modules the drafter runs besides the target and a draft model (an EAGLE-3 draft's
        layer and head): decoder/loader.py packs their linears for the CPU with the target's."""
        return ()

    @property
    def drafts_on_the_target(self) -> bool:
        """Whether drafting runs the target's own steps (SelfDrafter, alone or behind the lookup):
        those steps must then keep the hidden states the verify reads."""
        return False

    def attach(self, steps: Steps) -> None:
        """Called once by the decoder with the target's steps (decoder/target_steps.py), which a
        drafter that runs the target itself drafts on."""
        return None

    def warm_up(self, max_gamma: int) -> None:
        """Record what drafting replays (CUDA graphs: an EAGLE-3 chain) for up to `max_gamma` drafts now,
        not in a user's first requests; the decoder calls it after `attach` when its target steps are
        recorded or compiled."""
        return None

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        """Start a request; the first `reused` prompt tokens are those the last request began with."""
        ...

    def refer(self, references: References | None) -> None:
        """Other documents' tokens (references.py) a prompt lookup may copy from in the requests to come, where
        the prompt has no match; None: the prompt only. Drafters without a lookup ignore them."""
        return None

    def clock_lookup(self, spans: LookupSpan | None) -> None:
        """The clock a prompt lookup's span follows in the requests to come (gamma.LookupSpan: an adaptive γ
        policy's decoder hands one over); None: the lookup's own rule. Drafters without a lookup ignore it."""
        return None

    def propose(
        self,
        committed: list[int],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        min_confidence: float = 0.0,
        lookup: Lookup | None = None,
    ) -> Proposal:
        """Up to `gamma` drafts (up to `lookup_tokens` for a copy) after `committed`; a model draft
        stops early where its own top probability is under `min_confidence`.

        lookup: a prompt lookup the drafter may ask after each of its drafts (HybridDrafter passes one).
        A drafter that drafts one at a time on the target (SelfDrafter) ends its round in the copy it
        returns; the others decide a round's drafts together and ignore it."""
        ...

    def shortened(self, kept: int) -> None:
        """The decoder verifies only the first `kept` drafts of the last proposal: the generation ends at a stop
        string in the one before, so the rest are not checked (engine._through_stop)."""
        return None

    def propose_tree(
        self, committed: list[int], gamma: int, nodes: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal | None:
        """A draft tree (Proposal.tree) of up to `nodes` drafts, at most `gamma` deep (`lookup_tokens` for
        a copy), decided ahead of the target (decoder/tree.py: top-k, not draws); or None where this drafter
        proposes chains: the decoder then asks `propose`."""
        return None

    def rollback(self, valid: int) -> None:
        """Forget what the drafter holds from position `valid` on (drafts the target rejected)."""
        ...
