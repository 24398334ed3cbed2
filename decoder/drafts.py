"""Drafters: things that propose the next few tokens for the target to verify.

- ModelDrafter wraps any causal LM that shares the target's vocabulary: a draft derived from
  the target's own layers (`derive_draft`), or an independent small model.
- NgramDrafter is model-free prompt lookup: it copies what followed the last occurrence of the
  current suffix, which is cheap and good at the identifiers code repeats.
- SelfDrafter is the target itself with its head cut to the most frequent tokens: drafting runs
  the target's own layers on its own cache, so the verify is only the full head.
- HybridDrafter asks the lookup first and the model only where the context has no match
  (`ngram+self`, the default: the target's own draft; `ngram+none`: no model, a round without a
  match is a plain target step).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from .kernels import PackedLinear
from .kv_cache import forward_logits, head_logits, keep_first, new_cache
from .sampling import SamplingParams, probabilities, sample

log = logging.getLogger(__name__)

# Trained drafts that ship with the package, one folder each (see its README.md model card).
SHIPPED_DRAFTS = Path(__file__).parent / "weights"


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor | None  # [len(tokens), V] draft probabilities; None for greedy or deterministic drafts
    lookup: bool = False  # copied from the context, not drafted by a model: says nothing about the γ to draft
    # [len(tokens) + 1, hidden]: the target's own final hidden states at the last committed token
    # and each draft, already in its cache (SelfDrafter); the verify is then only its head over them
    hidden: torch.Tensor | None = None


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


class SelfDrafter:
    """The target drafts for itself: its own layers and KV cache, and its head cut to the most
    frequent tokens (EAGLE-3's reduced draft vocabulary, applied to the target's own body).

    On the CPU a step reads the target's weights, and Gemma-3-270M's 262k-row head is 63% of them.
    A draft step here reads the layers and a 32k-row head; the verify then runs the full head
    once, over every drafted position's hidden state. The layers' work is never repeated: a
    draft step is the target's own step, so its keys and values are the target's, and the engine
    keeps those of the accepted drafts. The target's top token is in the 32k most frequent code
    tokens 99.6% of the time (docs/benchmarks), so nearly every draft is accepted; the gain is the
    head read once for γ + 1 tokens instead of once per token. Lossless like any draft: the full
    head decides. A round's drafting stops at `max_drafts`, after a line end, or where a lookup
    (HybridDrafter's) can copy the rest.
    """

    # The most drafts a round takes, whatever γ allows. Each costs most of a target step (its
    # layers), and a round that overruns where the completion stops wastes them: at 8, the
    # 64-token bench got 4-7% faster but the editor eval 3-12% slower (docs/benchmarks).
    max_drafts = 4

    def __init__(self, target, vocab_ids: torch.Tensor, line_ends: set[int] = frozenset()):
        """line_ends: ids whose text holds a newline. A round's drafting stops after one: editor
        completions end at line ends, and drafts past where one stops are wasted steps."""
        full = target.get_output_embeddings()
        if not isinstance(full, torch.nn.Linear):
            raise ValueError(f"the self draft needs the target's head as a plain linear, not {type(full).__name__}")
        self.target = target
        self.line_ends = line_ends
        self.target_vocab = full.out_features
        self.vocab_ids = vocab_ids.to(device=full.weight.device, dtype=torch.long)
        self.head = head_rows(full, self.vocab_ids)
        self.steps = None  # the target's steps (target_steps.py), set by the decoder that drafts on them
        _check_logits_are_the_head(target)

    def attach(self, steps) -> None:
        self.steps = steps

    def reset(self, prompt: list[int], reused: int = 0) -> None:
        pass

    def propose(self, committed, gamma, params, generator, min_confidence: float = 0.0,
                lookup: Callable[[list[int]], list[int]] | None = None) -> Proposal:
        """Feed the last committed token and then each draft, one at a time, each chosen by the cut head.

        lookup: asked after each draft with the drafts so far; tokens it returns (a prompt lookup's
        copy) are fed at once as the round's last drafts. A copy costs a few rows of one step.
        """
        # Only where the cache holds every committed token but the last; after a prefill it holds
        # them all, and the prefill's logits already give the next token.
        if gamma == 0 or len(self.steps.tokens) != len(committed) - 1:
            return Proposal([], None)
        if isinstance(self.target.get_output_embeddings(), PackedLinear) and not isinstance(self.head, PackedLinear):
            self.head = PackedLinear(self.head)  # the target was packed after this draft was built
        tokens, qs = [], []
        hidden = [self.steps.hidden(committed[-1:])]
        while len(tokens) < min(gamma, self.max_drafts):
            logits = head_logits(self.target, self.head, hidden[-1][-1:])
            probs = probabilities(logits, params) if not params.greedy or min_confidence else None
            if min_confidence and float(probs.max()) < min_confidence:
                break
            index = logits.argmax(-1) if params.greedy else sample(probs, generator)
            if not params.greedy:
                qs.append(probs.new_zeros(self.target_vocab).scatter_(0, self.vocab_ids, probs[0]))
            tokens.append(int(self.vocab_ids[index]))  # a read back per draft: the cache tracks host ids
            copied = lookup(tokens) if lookup is not None else []
            hidden.append(self.steps.hidden(tokens[-1:] + copied))
            if copied:
                tokens += copied
                if qs:  # a copy is a deterministic draft: q is one-hot at each copied token
                    qs += list(torch.nn.functional.one_hot(torch.tensor(copied, device=qs[0].device),
                                                           self.target_vocab).to(qs[0].dtype))
                break
            if tokens[-1] in self.line_ends:
                break
        return Proposal(tokens, torch.stack(qs) if qs else None, hidden=torch.cat(hidden))

    def rollback(self, valid: int) -> None:
        pass  # the engine rolls back the target's cache, which is the one this draft wrote


def drafts_on_the_target(drafter) -> bool:
    """Whether `drafter` runs the target's own hidden-state steps: a SelfDrafter, alone or behind the lookup."""
    return isinstance(drafter, SelfDrafter) or isinstance(getattr(drafter, "model", None), SelfDrafter)


def head_rows(head: torch.nn.Linear, ids: torch.Tensor) -> torch.nn.Linear:
    """A frozen copy of `head` that scores only the target ids `ids`: a reduced vocabulary's head."""
    ids = ids.to(device=head.weight.device, dtype=torch.long)
    rows = torch.nn.Linear(head.in_features, len(ids), bias=head.bias is not None,
                           device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        rows.weight.copy_(head.weight[ids])
        if head.bias is not None:
            rows.bias.copy_(head.bias[ids])
    return rows.requires_grad_(False)


def _check_logits_are_the_head(target) -> None:
    """The verify applies only the head (kv_cache.head_logits) to hidden states; that must be what
    the model's own forward does, which a model that scales or otherwise post-processes its logits breaks."""
    probe = torch.tensor([[1, 2, 3]], device=target.device)
    with torch.inference_mode():
        want = target(input_ids=probe, use_cache=False).logits[0]
        got = head_logits(target, target.get_output_embeddings(), target.base_model(input_ids=probe).last_hidden_state[0])
    if not torch.allclose(want, got, rtol=1e-4, atol=1e-4):
        raise ValueError(f"{type(target).__name__} makes its logits otherwise than by its head over its last "
                         "hidden states, so the self draft cannot verify with the head alone")


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
    (`ngram+none`) a round without a match drafts nothing: a plain target step. Behind a
    SelfDrafter, the lookup is asked again after each of its drafts, and a copy ends that round.
    """

    def __init__(self, model: ModelDrafter | SelfDrafter | None, lookup_tokens: int = 16, min_ngram: int = 2,
                 max_ngram: int = 4):
        self.model = model
        self.lookup = NgramDrafter(max_ngram=max_ngram, min_ngram=min_ngram)
        self.lookup_tokens = lookup_tokens  # the most one copy proposes
        self.span = lookup_tokens // 2  # what the next copy proposes
        self._copied: tuple[int, int] | None = None  # (committed length, tokens) of the last copy

    def attach(self, steps) -> None:
        if isinstance(self.model, SelfDrafter):
            self.model.attach(steps)

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
        if isinstance(self.model, SelfDrafter):  # a round of the target's own drafts ends in a copy where one matches
            return self.model.propose(committed, gamma, params, generator, min_confidence,
                                      lookup=lambda drafts: self._copy(committed, drafts, params, generator))
        return self.model.propose(committed, gamma, params, generator, min_confidence)

    def _copy(self, committed, drafts, params, generator) -> list[int]:
        """A lookup after `drafts`, within one round's rows (lookup_tokens in all)."""
        room = min(self.span, self.lookup_tokens - len(drafts))
        found = self.lookup.propose(committed + drafts, room, params, generator) if room > 0 else Proposal([], None)
        if found.tokens:
            self._copied = (len(committed) + len(drafts), len(found.tokens))
        return found.tokens

    def rollback(self, valid: int) -> None:
        if self._copied is not None:
            start, copied = self._copied
            accepted = valid - start
            if accepted >= 0:  # else a draft before the copy was rejected: the copy was not tried
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
    'ngram', 'self' (SelfDrafter over the shipped trained draft's vocabulary; 'self:FOLDER' over a
    trained draft's), 'layers:0,1' (derived from the target), a trained-draft folder, or a model
    spec; 'ngram+' before a model draft's spec (or 'none') makes it a HybridDrafter.

    Returns (drafter or None, draft model or None); the model is what HF assisted generation needs.
    """
    from .models import VocabularyMismatchError, check_same_vocabulary, load_model
    from .trained_draft import DraftLoadError, draft_vocabulary, is_trained_draft, load_draft

    if spec.startswith("ngram+"):
        inner = spec.removeprefix("ngram+")
        if inner == "self":  # the default draft: it stays usable with any target
            folder = default_draft_for(target)
            if is_trained_draft(folder):
                inner = f"self:{folder}"
            else:
                log.info("no trained draft ships for this target to cut its head to: ngram+self is the lookup alone")
                inner = "none"
        drafter, draft = build_drafter(inner, target, tokenizer, device, dtype)
        if drafter is not None and not isinstance(drafter, (ModelDrafter, SelfDrafter)):
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
    if spec == "self" or spec.startswith("self:"):
        folder = spec.removeprefix("self").removeprefix(":") or default_draft_for(target)
        if not is_trained_draft(folder):
            raise DraftLoadError(f"draft spec {spec!r}: {folder} is not a trained draft folder" if ":" in spec else
                                 f"draft spec {spec!r}: no trained draft ships for this target to take a reduced "
                                 "vocabulary from; name one as self:FOLDER")
        vocab_ids = draft_vocabulary(folder, target)
        texts = tokenizer.batch_decode([[i] for i in vocab_ids.tolist()])
        line_ends = {i for i, text in zip(vocab_ids.tolist(), texts) if "\n" in text}
        return SelfDrafter(target, vocab_ids, line_ends), None
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
