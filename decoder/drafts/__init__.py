"""Drafters: things that propose the next few tokens for the target to verify.

- ModelDrafter (model.py) runs a causal LM that shares the target's vocabulary: a draft derived
  from the target's own layers (derived.py), a trained draft (trained.py), or an independent model.
- NgramDrafter (ngram.py) is model-free prompt lookup: it copies what followed the last occurrence
  of the current suffix, which is cheap and good at the identifiers code repeats.
- SelfDrafter (self_draft.py) is the target itself with its head cut to the most frequent tokens:
  drafting runs the target's own layers on its own cache, so the verify is only the full head.
- Eagle3Drafter (eagle3/drafter.py) runs an EAGLE-3 draft (eagle3/model.py): one layer that drafts from
  the target's own states at three layers, which the verify pass keeps; a speculators-format folder.
  The eagle3/ package holds the draft's model and format, its drafter and its captured chain (chain.py).
- HybridDrafter (hybrid.py) asks the lookup first and the model only where the context has no match.

What every drafter offers the decoder is base.py's `Drafter`; a spec string names one (spec.py
describes the syntax) and build.py builds it. This module is the package's public API.
"""

from .base import Drafter, Proposal
from .build import build_drafter, default_draft_for, draft_label
from .derived import derive_draft
from .eagle3.drafter import Eagle3Drafter
from .hybrid import HybridDrafter
from .model import ModelDrafter
from .ngram import NgramDrafter
from .self_draft import SelfDrafter
from .spec import DraftSpec, parse_draft_spec
from .trained import SHIPPED_DRAFTS, DraftLoadError

__all__ = [
    "SHIPPED_DRAFTS",
    "DraftLoadError",
    "DraftSpec",
    "Drafter",
    "Eagle3Drafter",
    "HybridDrafter",
    "ModelDrafter",
    "NgramDrafter",
    "Proposal",
    "SelfDrafter",
    "build_drafter",
    "default_draft_for",
    "derive_draft",
    "draft_label",
    "parse_draft_spec",
]
