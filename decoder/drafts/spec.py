"""Draft specs: what `--draft`, the server's `draft` option and `bench --compare-drafts` accept.

This docstring is the one description of the syntax; the CLI and the README point here.

    auto         the shipped trained draft made for the target (decoder/weights/), else layers:0,1
                 (also where an install leaves the drafts' weights out, as the VS Code extension's does)
    none         no draft: plain autoregressive decoding
    ngram        prompt lookup alone, paced by γ (NgramDrafter)
    self         the target drafts for itself, its head cut to the shipped trained draft's
                 vocabulary, to its most frequent ids where it counts them (SelfDrafter.head_size);
                 an error for a target no trained draft ships for
    self:FOLDER  the same, with the vocabulary of the trained draft in FOLDER
    layers:0,1   a draft made of these target layers, sharing its embeddings, norm and head: no
                 extra memory (drafts/derived.py); the list must include layer 0
    eagle3       the EAGLE-3 draft shipped for the target (decoder/weights/); an error for a target
                 none ships for, and in an install without the drafts' weights
    FOLDER       a trained draft: a folder holding draft.json (drafts/trained.py), or an EAGLE-3
                 draft: a folder holding a speculators config.json (drafts/eagle3/model.py)
    MODEL        any other text is a model spec (decoder/models.py: a packaged alias, a local
                 model folder or a Hugging Face id) for a draft sharing the target's vocabulary;
                 a name that is none of these and close to a word above or a packaged alias
                 (ngramm, gemma3-27Om) is refused as mistyped, not looked for on the hub
    ngram+SPEC   prompt lookup where the context repeats itself, else the draft SPEC
                 (HybridDrafter); SPEC is a model draft or none, never ngram or another ngram+.
                 ngram+self is the default (decoder/models.py, DEFAULT_DRAFT): for a target no
                 trained draft ships for, it is the lookup alone

A spec is parsed once, by `parse_draft_spec`, into one of the dataclasses below; a folder is told
from a model spec by the draft.json in it. What `auto` and `self` resolve to depends on the target,
so drafts/build.py resolves them when it builds the drafter.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path

from ..models import PACKAGED
from .eagle3.model import is_eagle3_draft
from .trained import DraftLoadError, is_trained_draft

# The spec words, as an error for a spec that is none of them lists them.
KINDS = ("auto", "none", "ngram", "self", "self:FOLDER", "layers:0,1", "eagle3", "ngram+SPEC")
# A Hugging Face id, name or owner/name: letters, digits, '-', '_' and '.'.
HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


@dataclass(frozen=True)
class AutoDraft:
    def __str__(self) -> str:
        return "auto"


@dataclass(frozen=True)
class NoDraft:
    def __str__(self) -> str:
        return "none"


@dataclass(frozen=True)
class NgramDraft:
    def __str__(self) -> str:
        return "ngram"


@dataclass(frozen=True)
class SelfDraft:
    folder: Path | None = None  # the trained draft whose vocabulary the head is cut to; None: the shipped one

    def __str__(self) -> str:
        return "self" if self.folder is None else f"self:{self.folder}"


@dataclass(frozen=True)
class LayersDraft:
    layers: tuple[int, ...]

    def __str__(self) -> str:
        return "layers:" + ",".join(map(str, self.layers))


@dataclass(frozen=True)
class TrainedDraft:
    folder: Path

    def __str__(self) -> str:
        return str(self.folder)


@dataclass(frozen=True)
class Eagle3Draft:
    folder: Path | None = None  # None: the one shipped for the target

    def __str__(self) -> str:
        return "eagle3" if self.folder is None else str(self.folder)


@dataclass(frozen=True)
class ModelDraft:
    model: str  # a model spec for decoder/models.py

    def __str__(self) -> str:
        return self.model


# What may follow 'ngram+': a draft that drafts with a model, or none.
ModelDraftSpec = AutoDraft | NoDraft | SelfDraft | LayersDraft | TrainedDraft | Eagle3Draft | ModelDraft


@dataclass(frozen=True)
class HybridDraft:
    model: ModelDraftSpec

    def __str__(self) -> str:
        return f"ngram+{self.model}"


DraftSpec = ModelDraftSpec | NgramDraft | HybridDraft


def parse_draft_spec(text: str) -> DraftSpec:
    """The typed spec for `text` (syntax: this module's docstring). Raises ValueError, or
    DraftLoadError (a ValueError) for a self:FOLDER whose folder holds no trained draft."""
    if not text.strip():
        raise ValueError("empty draft spec")
    if text.startswith("ngram+"):
        inner = parse_draft_spec(text.removeprefix("ngram+"))
        if isinstance(inner, (NgramDraft, HybridDraft)):
            raise ValueError(f"draft spec {text!r}: 'ngram+' must be followed by a model draft or 'none'")
        return HybridDraft(inner)
    if text == "auto":
        return AutoDraft()
    if text == "none":
        return NoDraft()
    if is_trained_draft(text):
        return TrainedDraft(Path(text))
    if text == "eagle3":
        return Eagle3Draft()
    if is_eagle3_draft(text):
        return Eagle3Draft(Path(text))
    if text == "ngram":
        return NgramDraft()
    if text == "self" or text.startswith("self:"):
        folder = text.removeprefix("self").removeprefix(":")
        if not folder:
            return SelfDraft()
        if not is_trained_draft(folder):
            raise DraftLoadError(f"draft spec {text!r}: {folder} is not a trained draft folder")
        return SelfDraft(Path(folder))
    if text.startswith("layers:"):
        try:
            return LayersDraft(tuple(int(x) for x in text.removeprefix("layers:").split(",")))
        except ValueError:
            raise ValueError(f"draft spec {text!r} must look like layers:0,1") from None
    return _model_draft(text)


def _model_draft(text: str) -> ModelDraft:
    """A model spec, unless `text` can name no model, or looks like a mistyped spec word or alias:
    as a Hugging Face id it would be looked for on the hub, which takes a while to fail."""
    if text in PACKAGED or Path(text).expanduser().exists() or text.startswith((".", "/", "~")):
        return ModelDraft(text)  # a missing path: decoder/models.py says so
    words = ("auto", "none", "ngram", "self", "eagle3", "layers", *PACKAGED)
    guess = difflib.get_close_matches(text.lower(), words, n=1, cutoff=0.75) if "/" not in text else []
    if HUB_ID.fullmatch(text) and not guess:
        return ModelDraft(text)
    hint = f" (did you mean {guess[0]!r}?)" if guess else ""
    raise ValueError(
        f"unknown draft spec {text!r}{hint}: use {', '.join(KINDS)}, a draft folder, or a model: a packaged "
        f"alias ({', '.join(PACKAGED)}), a local model folder or a Hugging Face id (owner/name)"
    )
