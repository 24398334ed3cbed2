"""Trained drafts: the target's own architecture cut to a few layers, with weights of their own,
and their file format, which this module alone writes and reads.

A trained draft keeps the target's embeddings and rotary tables (shared, frozen: no memory) and
owns its decoder layers and final norm. Its head may be restricted to a sub-vocabulary, the
most frequent code tokens (EAGLE-3 style): the head is most of a small draft's cost (Gemma-3's
262k-row head is 80% of a 2-layer draft step), and speculation stays lossless because the target
verifies every token. Draft logits are then over `vocab_ids`, which map back to target ids.

On disk a draft is a folder, no optimizer state, no pickle:
- `draft.json`: a `DraftMeta`, what the draft was built from and for;
- `model.safetensors`: the owned weights (`owned_parameters`) plus `vocab_ids` where the head is cut;
- `vocab_ids.safetensors`: `vocab_ids` alone, what the self draft reads (drafts/self_draft.py), so that an
  install without the drafts' weights (the VS Code extension's: tools/lean_wheel.py) still has it; and, where
  known, `vocab_counts`: how often each id occurs in the corpus sample the vocabulary was drawn from, so that
  a head can be cut further to the most frequent of them (`draft_vocabulary`).
Training one is decoder/training/ (`specdec finetune`, harness/drafting.py).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .derived import derive_draft, head_rows, layer_list_name

DRAFT_JSON = "draft.json"
WEIGHTS = "model.safetensors"
VOCABULARY = "vocab_ids.safetensors"
# Why a shipped draft folder may hold no weights, for the error that says so.
LEAN_INSTALL = (
    "this install leaves the trained drafts' weights out, as the VS Code extension's server does; install the "
    "speccomplete package from a clone of the repository to draft with them"
)
FORMAT, VERSION = "specdec-draft", 1

# Trained drafts that ship with the package, one folder each (see its README.md model card).
SHIPPED_DRAFTS = Path(__file__).parent.parent / "weights"


class DraftLoadError(ValueError):
    pass


@dataclass(kw_only=True)
class DraftMeta:
    """`draft.json`. Loading needs `target_config` and `layers`; the rest records how it was trained."""

    format: str = FORMAT
    version: int = VERSION
    target: str = ""  # the target's model spec
    target_config: dict[str, Any]  # target_signature() of the target it was trained for
    layers: list[int]  # the target layers it is made of
    init: str = "derived"  # derived (copies of the target's layers), scratch (fresh ones) or draft:FOLDER (trained on)
    draft_vocab: int = 0  # the rows of its head
    objective: str = ""  # ce, kd or ce+kd
    kd_topk: int = 0
    balance: str = ""  # how languages were sampled
    tokens_seen: int = 0
    steps: int = 0  # optimizer steps
    corpus: list[dict[str, Any]] = field(default_factory=list)  # per phase: {"data": folder, "tokens": trained}
    dev_fitness: dict[str, dict[str, float]] | None = None  # per language, at the end of training
    command: str = ""  # the command that trained it

    @classmethod
    def read(cls, folder: str | Path) -> DraftMeta:
        path = Path(folder) / DRAFT_JSON
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise DraftLoadError(f"cannot read {path}: {e}") from e
        if not isinstance(raw, dict) or raw.get("format", FORMAT) != FORMAT or raw.get("version", VERSION) != VERSION:
            raise DraftLoadError(f"{path} is not a version {VERSION} {FORMAT} file")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{key: value for key, value in raw.items() if key in known})
        except TypeError as e:  # a required field is missing
            raise DraftLoadError(f"cannot read {path}: {e}") from e

    def write(self, folder: Path) -> None:
        (folder / DRAFT_JSON).write_text(json.dumps(asdict(self), indent=1) + "\n")


def is_trained_draft(path: str | Path) -> bool:
    return (Path(path) / DRAFT_JSON).is_file()


def target_signature(target) -> dict[str, Any]:
    """What a trained draft must match in its target."""
    c = target.config
    return {
        "model_type": c.model_type,
        "hidden_size": c.hidden_size,
        "vocab_size": c.vocab_size,
        "num_hidden_layers": c.num_hidden_layers,
    }


def draft_with_own_layers(target, layers: list[int], vocab_ids: torch.Tensor | None = None):
    """A draft of the target's `layers` that owns copies of them and of the final norm: the shape a
    trained draft's weights load into, and training starts from.

    Embeddings, rotary tables and (without `vocab_ids`) the head stay shared with the target; with
    `vocab_ids`, its head is the target's rows for those ids (`restrict_head`). Every weight is frozen.
    """
    draft = derive_draft(target, layers)  # shares everything; now give it layers and a norm of its own
    base = draft.base_model
    layer_attr = layer_list_name(base)
    setattr(base, layer_attr, torch.nn.ModuleList(copy.deepcopy(layer) for layer in getattr(base, layer_attr)))
    base.norm = copy.deepcopy(base.norm)
    draft.vocab_ids = None
    if vocab_ids is not None:
        restrict_head(draft, target, vocab_ids)
    return draft.requires_grad_(False).eval()


def restrict_head(draft, target, vocab_ids: torch.Tensor) -> None:
    """Give `draft` a head of the target's rows for `vocab_ids` only, and those ids as `draft.vocab_ids`."""
    vocab_ids = vocab_ids.to(torch.long).cpu()
    full = target.get_output_embeddings()
    if int(vocab_ids.max()) >= full.out_features or int(vocab_ids.min()) < 0:
        raise DraftLoadError(f"draft vocabulary ids must lie in [0, {full.out_features})")
    draft.lm_head = head_rows(full, vocab_ids)
    draft.config = copy.deepcopy(draft.config)
    draft.config.tie_word_embeddings = False
    draft.vocab_ids = vocab_ids.to(full.weight.device)


def owned_parameters(draft) -> dict[str, torch.nn.Parameter]:
    """The weights a trained draft owns, by their names on disk: its decoder layers and final norm."""
    base = draft.base_model
    layer_attr = layer_list_name(base)
    prefix = draft.base_model_prefix
    owned = {f"{prefix}.{layer_attr}.{name}": p for name, p in getattr(base, layer_attr).named_parameters()}
    owned |= {f"{prefix}.norm.{name}": p for name, p in base.norm.named_parameters()}
    return owned


def save_draft(
    draft,
    out_dir: str | Path,
    meta: DraftMeta,
    dtype: torch.dtype = torch.bfloat16,
    vocab_counts: torch.Tensor | None = None,
) -> Path:
    """Write the owned weights (in `dtype`) and `draft.json`; returns the folder. vocab_counts: each of
    the head's ids' occurrences in the corpus its vocabulary was drawn from, where it is cut."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to(dtype).cpu().contiguous() for name, p in owned_parameters(draft).items()}
    if draft.vocab_ids is not None:
        tensors["vocab_ids"] = draft.vocab_ids.to(torch.int32).cpu().contiguous()
        write_vocabulary(out, tensors["vocab_ids"], vocab_counts)
    save_file(tensors, str(out / WEIGHTS))
    meta.write(out)
    return out


def load_draft(path: str | Path, target):
    """Rebuild a saved draft on top of `target`; checks it was made for a target of this shape."""
    folder = Path(path)
    meta = check_target(folder, target)
    tensors = _read_weights(folder)
    vocab_ids = tensors.pop("vocab_ids", None)
    draft = draft_with_own_layers(target, meta.layers, vocab_ids)
    owned = owned_parameters(draft)
    if set(owned) != set(tensors):
        raise DraftLoadError(f"draft {folder} weights do not match its layers {meta.layers}")
    with torch.no_grad():
        for name, p in owned.items():
            if p.shape != tensors[name].shape:
                raise DraftLoadError(
                    f"draft {folder}: {name} has shape {tuple(tensors[name].shape)}, expected {tuple(p.shape)}"
                )
            p.copy_(tensors[name])
    return draft


def write_vocabulary(folder: str | Path, vocab_ids: torch.Tensor, vocab_counts: torch.Tensor | None = None) -> None:
    """`vocab_ids.safetensors` in `folder`: the ids, and each one's count where known."""
    tensors = {"vocab_ids": vocab_ids.to(torch.int32).cpu().contiguous()}
    if vocab_counts is not None:
        if vocab_counts.shape != vocab_ids.shape:
            raise ValueError(f"{len(vocab_ids)} vocabulary ids but {len(vocab_counts)} counts")
        tensors["vocab_counts"] = vocab_counts.to(torch.int64).cpu().contiguous()
    save_file(tensors, str(Path(folder) / VOCABULARY))


def draft_vocabulary(path: str | Path, target, rows: int | None = None) -> torch.Tensor:
    """The target ids a saved draft's head scores (its `vocab_ids`), for drafts.SelfDrafter. With `rows`, the
    `rows` most frequent of them (ascending) where the draft counted them (`vocab_counts`), else all."""
    check_target(path, target)
    folder = Path(path)
    tensors = load_file(str(folder / VOCABULARY)) if (folder / VOCABULARY).exists() else _read_weights(folder)
    if "vocab_ids" not in tensors:
        raise DraftLoadError(f"draft {path} has a full-vocabulary head: there is no reduced vocabulary in it")
    ids = tensors["vocab_ids"].long()
    counts = tensors.get("vocab_counts")
    if rows is None or counts is None or rows >= len(ids):
        return ids
    most = counts.argsort(descending=True, stable=True)[:rows]
    return ids[most].sort().values


def check_target(path: str | Path, target) -> DraftMeta:
    """The draft's `DraftMeta`; DraftLoadError unless it was trained for a target shaped like this one."""
    meta = DraftMeta.read(path)
    actual = target_signature(target)
    for key, value in meta.target_config.items():
        if actual.get(key) != value:
            raise DraftLoadError(
                f"draft {Path(path)} was trained for a target with {key}={value}, "
                f"but this target has {key}={actual.get(key)}"
            )
    return meta


def with_full_vocab_head(draft):
    """The same draft with its sub-vocabulary head spread over the target's whole vocabulary.

    For tools that read draft logits as target ids (HF assisted generation): ids outside the
    sub-vocabulary get a logit of -1e9, so argmax and softmax are those of the sub-vocabulary head.
    The copy shares every module but the head with `draft`.
    """
    if getattr(draft, "vocab_ids", None) is None:
        return draft
    head, ids = draft.lm_head, draft.vocab_ids
    rows = draft.get_input_embeddings().num_embeddings
    full = torch.nn.Linear(head.in_features, rows, bias=True, device=head.weight.device, dtype=head.weight.dtype)
    with torch.no_grad():
        full.weight.zero_()
        full.weight[ids] = head.weight
        full.bias.fill_(-1e9)
        full.bias[ids] = 0.0
    wide = copy.copy(draft)
    wide._modules = dict(draft._modules)  # copy.copy shares the module dict; the head must be the copy's own
    wide.lm_head = full.requires_grad_(False)
    wide.vocab_ids = None
    return wide


def has_weights(folder: str | Path) -> bool:
    """Whether a draft folder holds its weights (a shipped one, in a lean install, may not: LEAN_INSTALL)."""
    return (Path(folder) / WEIGHTS).exists()


def missing_shipped_weights(folder: str | Path) -> str | None:
    """Why a shipped draft folder (a trained or an EAGLE-3 draft) holds no weights, for its error; None where it
    holds them or is not shipped."""
    folder = Path(folder)
    if has_weights(folder) or folder.parent != SHIPPED_DRAFTS:
        return None
    return f"the shipped draft {folder.name} has no weights here: {LEAN_INSTALL}"


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    if reason := missing_shipped_weights(folder):
        raise DraftLoadError(reason)
    try:
        return load_file(str(folder / WEIGHTS))
    except (OSError, ValueError) as e:
        raise DraftLoadError(f"cannot read the draft in {folder}: {e}") from e
