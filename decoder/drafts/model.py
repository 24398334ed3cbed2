"""A draft model: any causal LM that shares the target's vocabulary, with a KV cache of its own.

That is a draft derived from the target's own layers (drafts/derived.py), a trained draft
(drafts/trained.py), or an independent small model.
"""

from __future__ import annotations

import torch

from ..kv_cache import forward_logits, keep_first, new_cache
from ..sampling import SamplingParams, probabilities, sample
from .base import Drafter, Lookup, Proposal


class ModelDrafter(Drafter):
    def __init__(self, model):
        self.model = model
        self.cache = new_cache()
        # A draft head over a sub-vocabulary (trained drafts) has logits over these target ids.
        self.vocab_ids = getattr(model, "vocab_ids", None)
        self.target_vocab = model.get_input_embeddings().num_embeddings

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        keep = min(reused, self.cache.get_seq_length())
        if keep == 0:
            self.cache = new_cache()
        else:
            keep_first(self.cache, keep)
        if len(prompt) - 1 > keep:
            forward_logits(self.model, self.cache, prompt[keep:-1], keep=1)

    def propose(
        self,
        committed: list[int],
        gamma: int,
        params: SamplingParams,
        generator,
        min_confidence: float = 0.0,
        lookup: Lookup | None = None,
    ) -> Proposal:
        """Draft up to `gamma` tokens; stop early where the draft's own top probability < min_confidence.

        The drafted tokens stay on the device, fed straight back in, and are read back once at the
        end, so the host does not wait on each draft step (a confidence threshold has to look at each).
        """
        keep_first(self.cache, len(committed) - 1)  # the last committed token is always fed
        # catch up on everything committed since the last round
        feed: list[int] | torch.Tensor = committed[self.cache.get_seq_length() :]
        tokens: list[torch.Tensor] = []  # drafted ids, on the device
        qs: list[torch.Tensor] = []
        for _ in range(gamma):
            logits = forward_logits(self.model, self.cache, feed, keep=1)
            if params.greedy:
                probs = torch.softmax(logits.float(), -1) if min_confidence else None
                index = logits.argmax(-1)
            else:
                probs = probabilities(logits, params)
                index = sample(probs, generator)
            if probs is not None and min_confidence and float(probs.max()) < min_confidence:
                break
            token = index if self.vocab_ids is None else self.vocab_ids[index]
            tokens.append(token)
            if probs is not None and not params.greedy:
                qs.append(probs[0] if self.vocab_ids is None else self._to_target_vocab(probs[0]))
            feed = token
        drafted = torch.cat(tokens).tolist() if tokens else []
        return Proposal(drafted, torch.stack(qs) if qs else None)

    def _to_target_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """q over the sub-vocabulary -> q over the target's vocabulary (zero elsewhere)."""
        assert self.vocab_ids is not None  # only called for a draft head over a sub-vocabulary
        return torch.zeros(self.target_vocab, dtype=probs.dtype, device=probs.device).scatter_(0, self.vocab_ids, probs)

    def rollback(self, valid: int) -> None:
        keep_first(self.cache, valid)
