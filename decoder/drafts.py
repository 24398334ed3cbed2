"""Drafters: things that propose the next few tokens for the target to verify.

- ModelDrafter wraps any causal LM that shares the target's vocabulary: a draft derived from
  the target's own layers (`derive_draft`), or an independent small model.
- NgramDrafter is model-free prompt lookup: it copies what followed the last occurrence of the
  current suffix, which is cheap and good at the identifiers code repeats.
- HybridDrafter asks the lookup first and the model only where the context has no match
  (`ngram+none`: no model; a round without a match is a plain target step).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from .kv_cache import forward_logits, keep_first, new_cache
from .sampling import SamplingParams, probabilities, sample

# Trained drafts that ship with the package, one folder each (see its README.md model card).
SHIPPED_DRAFTS = Path(__file__).parent / "weights"


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] draft probabilities; None for greedy or deterministic drafts
    lookup: bool = False  # copied from the context, not drafted by a model: says nothing about the γ to draft


class ModelDrafter:
    def __init__(self, model):
        self.model = model
        self.cache = new_cache()
        # A draft head over a sub-vocabulary (trained drafts) has logits over these target ids.
        self.vocab_ids = getattr(model, "vocab_ids", None)
        self.target_vocab = model.get_input_embeddings().num_embeddings

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        """Start a request; the first `reused` prompt tokens are those the last request began with."""
        keep = min(reused, self.cache.get_seq_length())
        if keep == 0:
            self.cache = new_cache()
        else:
            keep_first(self.cache, keep)
        if len(prompt) - 1 > keep:
            forward_logits(self.model, self.cache, prompt[keep:-1], keep=1)

    def propose(
        self, committed: list[int], gamma: int, params: SamplingParams, generator, min_confidence: float = 0.0
    ) -> Proposal:
        """Draft up to `gamma` tokens; stop early where the draft's own top probability < min_confidence.

        The drafted tokens stay on the device, fed straight back in, and are read back once at the
        end, so the host does not wait on each draft step (a confidence threshold has to look at each).
        """
        keep_first(self.cache, len(committed) - 1)  # the last committed token is always fed
        feed = committed[self.cache.get_seq_length():]  # catch up on everything committed since the last round
        tokens, qs = [], []
        for _ in range(gamma):
            logits = forward_logits(self.model, self.cache, feed, keep=1)
            if params.greedy:
                probs = torch.softmax(logits.float(), -1) if min_confidence else None
                index = logits.argmax(-1)
            else:
                probs = probabilities(logits, params)
                index = sample(probs, generator)
            if min_confidence and float(probs.max()) < min_confidence:
                break
            token = index if self.vocab_ids is None else self.vocab_ids[index]
            tokens.append(token)
            if not params.greedy:
                qs.append(probs[0] if self.vocab_ids is None else self._to_target_vocab(probs[0]))
            feed = token
        drafted = torch.cat(tokens).tolist() if tokens else []
        return Proposal(drafted, torch.stack(qs) if qs else None)

    def _to_target_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """q over the sub-vocabulary -> q over the target's vocabulary (zero elsewhere)."""
        return torch.zeros(self.target_vocab, dtype=probs.dtype, device=probs.device).scatter_(0, self.vocab_ids, probs)

    def rollback(self, valid: int) -> None:
        """Forget cached positions from `valid` on (they held drafts the target rejected)."""
        keep_first(self.cache, valid)


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens and propose what followed."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        pass

    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0) -> Proposal:
        if gamma == 0:
            return Proposal([], None)
        seq = torch.tensor(committed)
        for n in range(min(self.max_ngram, len(committed) - 1), self.min_ngram - 1, -1):
            windows = seq.unfold(0, n, 1)[:-1]  # every earlier n-gram, excluding the suffix itself
            hits = (windows == seq[-n:]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n
                return Proposal(committed[start : start + gamma], None)
        return Proposal([], None)

    def rollback(self, valid: int) -> None:
        pass


class HybridDrafter:
    """Prompt lookup where the context repeats itself (free, often long), the model draft elsewhere.

    The lookup needs a match of `min_ngram` tokens, so one common token does not trigger it. How
    much it copies adapts, apart from the model's γ: +2 after a fully accepted copy, else one
    more than was accepted. Long copies pay where code repeats itself, and a copy that keeps
    missing shrinks to one token, whose verify costs about a plain step. With no model
    (`ngram+none`, the default) a round without a match drafts nothing: a plain target step.
    """

    def __init__(self, model: ModelDrafter | None, lookup_tokens: int = 16, min_ngram: int = 2, max_ngram: int = 4):
        self.model = model
        self.lookup = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        self.lookup_tokens = lookup_tokens  # the most one copy proposes
        self.span = lookup_tokens // 2  # what the next copy proposes
        self._copied: tuple[int, int] | None = None  # (committed length, tokens) of the last copy

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        # A request starts from the middle span: the last one's may have grown on text of another kind.
        self.span, self._copied = self.lookup_tokens // 2, None
        if self.model is not None:
            self.model.reset(prompt, reused)

    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0) -> Proposal:
        found = self.lookup.propose(committed, self.span, params, generator)
        if found.tokens:
            self._copied = (len(committed), len(found.tokens))
            return Proposal(found.tokens, None, lookup=True)
        self._copied = None
        if self.model is None:
            return Proposal([], None)
        return self.model.propose(committed, gamma, params, generator, min_confidence)

    def rollback(self, valid: int) -> None:
        if self._copied is not None:
            start, copied = self._copied
            accepted = valid - start
            self.span = min(self.span + 2, self.lookup_tokens) if accepted == copied else accepted + 1
            self._copied = None
        if self.model is not None:
            self.model.rollback(valid)


def _layer_list_name(base) -> str:
    for name in ("layers", "h", "blocks"):
        if isinstance(getattr(base, name, None), torch.nn.ModuleList):
            return name
    raise ValueError(f"cannot find the decoder layers of {type(base).__name__}")


def derive_draft(target, layers: list[int]):
    """A draft made of some of the target's own decoder layers, sharing its embeddings, norm and head.

    Nothing is copied: the draft's modules are the target's, so it costs no memory. The draft
    keeps its own KV cache, indexed by the original layer numbers.
    """
    base = target.base_model
    layer_attr = _layer_list_name(base)
    total = len(getattr(base, layer_attr))
    if not layers or any(not 0 <= i < total for i in layers) or len(set(layers)) != len(layers):
        raise ValueError(f"draft layers must be distinct indices in [0, {total}), got {layers}")
    if 0 not in layers:
        # the cache reports its length from layer 0, and positions come from that length
        raise ValueError("draft layers must include layer 0")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(layers)  # GPT-2 aliases n_layer to this
    if getattr(config, "layer_types", None):
        config.layer_types = [target.config.layer_types[i] for i in layers]
    with torch.device("meta"):
        draft = AutoModelForCausalLM.from_config(config)
    draft_base = draft.base_model
    for name, _ in list(draft_base.named_children()):
        if name == layer_attr:
            setattr(draft_base, name, torch.nn.ModuleList(getattr(base, layer_attr)[i] for i in layers))
        else:
            setattr(draft_base, name, getattr(base, name))
    for name, _ in list(draft.named_children()):
        if name != draft.base_model_prefix:
            setattr(draft, name, getattr(target, name))
    if any(t.is_meta for t in list(draft.parameters()) + list(draft.buffers())):
        raise ValueError(f"could not share every module of {type(target).__name__} with the draft")
    draft.generation_config = copy.deepcopy(target.generation_config)
    draft.eval().requires_grad_(False)
    return draft


def default_draft_for(target) -> str:
    """The shipped trained draft when it was made for a target of this shape, else first two layers."""
    from .trained_draft import DraftLoadError, check_target

    for folder in sorted(SHIPPED_DRAFTS.glob("*/")):
        try:
            check_target(folder, target)
            return str(folder)
        except DraftLoadError:
            continue
    return "layers:0,1"


def draft_label(spec: str, target) -> str:
    """What telemetry calls a draft: 'auto' resolved for this target, a trained-draft folder by its name."""
    from .trained_draft import is_trained_draft

    if spec.startswith("ngram+"):
        return "ngram+" + draft_label(spec.removeprefix("ngram+"), target)
    if spec == "auto":
        spec = default_draft_for(target)
    return Path(spec).name if is_trained_draft(spec) else spec


def build_drafter(spec: str, target, tokenizer, device: str = "auto", dtype: str = "auto"):
    """A drafter from a spec: 'auto' (the shipped trained draft for this target, if any), 'none',
    'ngram', 'layers:0,1' (derived from the target), a trained-draft folder, or a model spec;
    'ngram+' before a model draft's spec (or 'none') makes it a HybridDrafter.

    Returns (drafter or None, draft model or None); the model is what HF assisted generation needs.
    """
    from .models import VocabularyMismatchError, check_same_vocabulary, load_model
    from .trained_draft import is_trained_draft, load_draft

    if spec.startswith("ngram+"):
        drafter, draft = build_drafter(spec.removeprefix("ngram+"), target, tokenizer, device, dtype)
        if drafter is not None and not isinstance(drafter, ModelDrafter):
            raise ValueError(f"draft spec {spec!r}: 'ngram+' must be followed by a model draft or 'none'")
        return HybridDrafter(drafter), draft
    if spec == "auto":
        spec = default_draft_for(target)
    if spec == "none":
        return None, None
    if is_trained_draft(spec):
        draft = load_draft(spec, target)
        return ModelDrafter(draft), draft
    if spec == "ngram":
        return NgramDrafter(), None
    if spec.startswith("layers:"):
        try:
            layers = [int(x) for x in spec.split(":", 1)[1].split(",")]
        except ValueError:
            raise ValueError(f"draft spec {spec!r} must look like layers:0,1") from None
        draft = derive_draft(target, layers)
        return ModelDrafter(draft), draft
    draft, draft_tokenizer = load_model(spec, device=device, dtype=dtype)
    check_same_vocabulary(tokenizer, draft_tokenizer)
    rows = draft.get_input_embeddings().num_embeddings
    if rows < len(tokenizer):
        raise VocabularyMismatchError(
            f"draft {spec!r} embeds {rows} tokens but the vocabulary has {len(tokenizer)}; "
            "it could not read every token the target writes"
        )
    return ModelDrafter(draft), draft
