"""Drafters from draft specs (drafts/spec.py), resolved against the target they draft for."""

from __future__ import annotations

import logging
from pathlib import Path

from transformers import PreTrainedModel

from ..models import VocabularyMismatchError, check_same_vocabulary, load_model
from .base import Drafter
from .derived import derive_draft
from .eagle3.drafter import Eagle3Drafter
from .eagle3.model import Eagle3LoadError, load_eagle3, read_config, shape_from_config
from .eagle3.model import check_target as check_eagle3_target
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .self_draft import SelfDrafter
from .spec import (
    AutoDraft,
    DraftSpec,
    Eagle3Draft,
    HybridDraft,
    LayersDraft,
    ModelDraftSpec,
    NgramDraft,
    NoDraft,
    SelfDraft,
    TrainedDraft,
    parse_draft_spec,
)
from .trained import SHIPPED_DRAFTS, DraftLoadError, check_target, draft_vocabulary, has_weights, load_draft

log = logging.getLogger(__name__)


def default_draft_for(target, weights: bool = True) -> TrainedDraft | LayersDraft:
    """What 'auto' is for `target`: the shipped trained draft made for a target of this shape, else its
    first two layers. weights: only a draft whose weights this install holds (the self draft reads only the
    vocabulary, which every install holds: trained.LEAN_INSTALL)."""
    for folder in sorted(SHIPPED_DRAFTS.glob("*/")):
        try:
            check_target(folder, target)
        except DraftLoadError:
            continue
        if has_weights(folder) or not weights:
            return TrainedDraft(folder)
    return LayersDraft((0, 1))


def shipped_eagle3_for(target) -> Path:
    """The EAGLE-3 draft folder shipped for a target of this shape (decoder/weights/)."""
    for folder in sorted(SHIPPED_DRAFTS.glob("*/")):
        try:
            check_eagle3_target(shape_from_config(read_config(folder)), target)
            return folder
        except Eagle3LoadError:
            continue
    raise DraftLoadError("no EAGLE-3 draft ships for this target; name a folder (specdec train-eagle3 makes one)")


def draft_label(spec: str | DraftSpec, target) -> str:
    """What telemetry calls a draft: 'auto' resolved for this target, a trained-draft folder by its name."""
    spec = parse_draft_spec(spec) if isinstance(spec, str) else spec
    if isinstance(spec, HybridDraft):
        return "ngram+" + draft_label(spec.model, target)
    if isinstance(spec, AutoDraft):
        spec = default_draft_for(target)
    if isinstance(spec, Eagle3Draft) and spec.folder is None:
        return shipped_eagle3_for(target).name
    return spec.folder.name if isinstance(spec, (TrainedDraft, Eagle3Draft)) and spec.folder else str(spec)


def build_drafter(
    spec: str | DraftSpec, target, tokenizer, device: str = "auto", dtype: str = "auto"
) -> tuple[Drafter | None, PreTrainedModel | None]:
    """The drafter for a spec (a string is parsed first), or None for 'none'; and the draft model it
    runs, or None for drafts without one of their own (that model is what HF assisted generation needs)."""
    spec = parse_draft_spec(spec) if isinstance(spec, str) else spec
    if isinstance(spec, NgramDraft):
        return NgramDrafter(), None
    if isinstance(spec, HybridDraft):
        inner = spec.model
        if isinstance(inner, SelfDraft) and inner.folder is None:  # the default draft: it stays usable with any target
            shipped = default_draft_for(target, weights=False)
            if isinstance(shipped, TrainedDraft):
                inner = SelfDraft(shipped.folder)
            else:
                log.info("no trained draft ships for this target to cut its head to: ngram+self is the lookup alone")
                inner = NoDraft()
        drafter, draft = _model_drafter(inner, target, tokenizer, device, dtype)
        return HybridDrafter(drafter), draft
    return _model_drafter(spec, target, tokenizer, device, dtype)


def _model_drafter(
    spec: ModelDraftSpec, target, tokenizer, device: str, dtype: str
) -> tuple[ModelDrafter | SelfDrafter | Eagle3Drafter | None, PreTrainedModel | None]:
    if isinstance(spec, AutoDraft):
        spec = default_draft_for(target)
    if isinstance(spec, NoDraft):
        return None, None
    if isinstance(spec, TrainedDraft):
        draft = load_draft(spec.folder, target)
        return ModelDrafter(draft), draft
    if isinstance(spec, SelfDraft):
        folder = spec.folder
        if folder is None:
            shipped = default_draft_for(target, weights=False)
            if not isinstance(shipped, TrainedDraft):
                raise DraftLoadError(
                    f"draft spec {str(spec)!r}: no trained draft ships for this target to take a "
                    "reduced vocabulary from; name one as self:FOLDER"
                )
            folder = shipped.folder
        vocab_ids = draft_vocabulary(folder, target, rows=SelfDrafter.head_size)
        return SelfDrafter(target, vocab_ids, _line_ends(tokenizer, vocab_ids)), None
    if isinstance(spec, Eagle3Draft):
        eagle = load_eagle3(spec.folder or shipped_eagle3_for(target), target)
        return Eagle3Drafter(eagle, target, _line_ends(tokenizer, eagle.target_ids())), None
    if isinstance(spec, LayersDraft):
        draft = derive_draft(target, list(spec.layers))
        return ModelDrafter(draft), draft
    draft, draft_tokenizer = load_model(spec.model, device=device, dtype=dtype)
    check_same_vocabulary(tokenizer, draft_tokenizer)
    rows = draft.get_input_embeddings().num_embeddings
    if rows < len(tokenizer):
        raise VocabularyMismatchError(
            f"draft {spec.model!r} embeds {rows} tokens but the vocabulary has {len(tokenizer)}; "
            "it could not read every token the target writes"
        )
    return ModelDrafter(draft), draft


def _line_ends(tokenizer, vocab_ids) -> set[int]:
    """The ids among `vocab_ids` whose text holds a newline: a round's drafting stops after one."""
    ids = vocab_ids.tolist()
    one_each = [[i] for i in ids]
    backend = getattr(tokenizer, "backend_tokenizer", None)  # a fast tokenizer's, in Rust: a tenth of batch_decode
    texts = (
        backend.decode_batch(one_each, skip_special_tokens=False)
        if backend is not None
        else tokenizer.batch_decode(one_each)
    )
    return {i for i, text in zip(ids, texts) if "\n" in text}
