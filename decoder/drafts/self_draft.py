"""The target drafts for itself, with its head cut to the most frequent tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..families import BY_MODEL
from ..kernels import PackedLinear
from ..kv_cache import head_logits
from ..sampling import draw_draft
from .base import Drafter, Lookup, Proposal
from .derived import head_rows

if TYPE_CHECKING:
    from ..target_steps import Steps


class SelfDrafter(Drafter):
    """The target drafts for itself: its own layers and KV cache, and its head cut to the most
    frequent tokens (EAGLE-3's reduced draft vocabulary, applied to the target's own body).

    On the CPU a step reads the target's weights, and Gemma-3-270M's 262k-row head is 63% of them.
    A draft step here reads the layers and an 8k-row head; the verify then runs the full head
    once, over every drafted position's hidden state. The layers' work is never repeated: a
    draft step is the target's own step, so its keys and values are the target's, and the engine
    keeps those of the accepted drafts. The target's top token is in the 8k most frequent code
    tokens 95% of the time (docs/drafts.md), so most drafts are accepted; the gain is the head
    read once for γ + 1 tokens instead of once per token. Lossless like any draft: the full
    head decides. A round's drafting stops at `max_drafts`, after a line end, or where a lookup
    (HybridDrafter's) can copy the rest.
    """

    # The most drafts a round takes, whatever γ allows. Each costs most of a target step (its
    # layers), and a round that overruns where the completion stops wastes them: more a round
    # helped the bench and slowed the editor (docs/benchmarks, "self drafts: at most 4 a round").
    max_drafts = 4
    # The head's size: the most frequent ids of the trained draft's vocabulary, where it counts them
    # (drafts/trained.py, `draft_vocabulary`). Fewer rows read less a draft step, more drafts miss;
    # 8k of the 32k measured fastest (docs/drafts.md, "The self draft's head").
    head_size = 8192

    def __init__(self, target, vocab_ids: torch.Tensor, line_ends: set[int] | frozenset[int] = frozenset()):
        """line_ends: ids whose text holds a newline. A round's drafting stops after one: editor
        completions end at line ends, and drafts past where one stops are wasted steps."""
        full = target.get_output_embeddings()
        if not isinstance(full, torch.nn.Linear):
            raise ValueError(f"the self draft needs the target's head as a plain linear, not {type(full).__name__}")
        self.target = target
        self.line_ends = line_ends
        self.target_vocab = full.out_features
        self.vocab_ids = vocab_ids.to(device=full.weight.device, dtype=torch.long)
        self.head: torch.nn.Linear | PackedLinear = head_rows(full, self.vocab_ids)
        self.steps: Steps | None = None  # set by the decoder that drafts on them (attach)
        _check_logits_are_the_head(target)

    @property
    def drafts_on_the_target(self) -> bool:
        return True

    def attach(self, steps: Steps) -> None:
        self.steps = steps

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        pass

    def propose(
        self,
        committed,
        gamma,
        params,
        generator,
        min_confidence: float = 0.0,
        lookup: Lookup | None = None,
    ) -> Proposal:
        """Feed the last committed token and then each draft, one at a time, each chosen by the cut head.

        lookup: asked after each draft with the drafts so far; tokens it returns (a prompt lookup's
        copy) are fed at once as the round's last drafts. A copy costs a few rows of one step.
        """
        # Only where the cache holds every committed token but the last; after a prefill it holds
        # them all, and the prefill's logits already give the next token.
        steps = self.steps
        assert steps is not None, "the decoder attaches the target's steps before the first round"
        if gamma == 0 or len(steps.tokens) != len(committed) - 1:
            return Proposal([], None)
        if isinstance(self.target.get_output_embeddings(), PackedLinear) and not isinstance(self.head, PackedLinear):
            self.head = PackedLinear(self.head)  # the target was packed after this draft was built
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        hidden = [steps.hidden(committed[-1:])]
        while len(tokens) < min(gamma, self.max_drafts):
            drawn = draw_draft(head_logits(self.target, self.head, hidden[-1][-1:]), params, generator, min_confidence)
            if drawn is None:
                break
            index, probs = drawn
            if probs is not None:
                qs.append(probs.new_zeros(self.target_vocab).scatter_(0, self.vocab_ids, probs[0]))
            tokens.append(int(self.vocab_ids[index]))  # a read back per draft: the cache tracks host ids
            copied = lookup(tokens) if lookup is not None else []
            hidden.append(steps.hidden(tokens[-1:] + copied))
            if copied:
                tokens += copied
                if qs:  # a copy is a deterministic draft: q is one-hot at each copied token
                    qs += list(
                        torch.nn.functional.one_hot(torch.tensor(copied, device=qs[0].device), self.target_vocab).to(
                            qs[0].dtype
                        )
                    )
                break
            if tokens[-1] in self.line_ends:
                break
        return Proposal(tokens, torch.stack(qs) if qs else None, hidden=torch.cat(hidden))

    def rollback(self, valid: int) -> None:
        pass  # the engine rolls back the target's cache, which is the one this draft wrote


def _check_logits_are_the_head(target) -> None:
    """The verify applies only the head (kv_cache.head_logits) to hidden states; that must be what
    the model's own forward does, which a model that scales or otherwise post-processes its logits breaks.
    A family's CausalLM says so by its record; any other model is probed (a forward: seconds for a large head)."""
    family = BY_MODEL.get(type(target.base_model).__name__)
    if family is not None and type(target).__name__.endswith("ForCausalLM"):
        cap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
        if cap and not family.logit_softcap:
            raise ValueError(
                f"{type(target).__name__} does not soft-cap its logits by final_logit_softcapping={cap}, "
                "so they are made otherwise than by its head over its last hidden states, and the self draft "
                "cannot verify with the head alone"
            )
        return
    _probe_logits_are_the_head(target)


def _probe_logits_are_the_head(target) -> None:
    probe = torch.tensor([[1, 2, 3]], device=target.device)
    with torch.inference_mode():
        want = target(input_ids=probe, use_cache=False).logits[0]
        got = head_logits(
            target, target.get_output_embeddings(), target.base_model(input_ids=probe).last_hidden_state[0]
        )
    if not torch.allclose(want, got, rtol=1e-4, atol=1e-4):
        raise ValueError(
            f"{type(target).__name__} makes its logits otherwise than by its head over its last "
            "hidden states, so the self draft cannot verify with the head alone"
        )
