"""Trained drafts: the target's own architecture cut to a few layers, with weights of their own.

A trained draft keeps the target's embeddings and rotary tables (shared, frozen: no memory) and
owns its decoder layers and final norm. Its head may be restricted to a sub-vocabulary, the
most frequent code tokens (EAGLE-3 style): the head is most of a small draft's cost (Gemma-3's
262k-row head is 80% of a 2-layer draft step), and speculation stays lossless because the target
verifies every token. Draft logits are then over `vocab_ids`, which map back to target ids.

On disk a draft is a folder: `draft.json` (what it was built from) and `model.safetensors` (the
owned weights plus `vocab_ids`), no optimizer state, no pickle.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .drafts import _layer_list_name, derive_draft, head_rows

DRAFT_JSON = "draft.json"
WEIGHTS = "model.safetensors"


class DraftLoadError(ValueError):
    pass


def is_trained_draft(path: str | Path) -> bool:
    return (Path(path) / DRAFT_JSON).is_file()


def build_draft(target, layers: list[int], init: str = "derived", vocab_ids: torch.Tensor | None = None):
    """A draft with its own copies of `layers` (init "derived") or fresh ones (init "scratch").

    Embeddings, rotary tables and (without `vocab_ids`) the head stay shared with the target and frozen.
    """
    if init not in ("derived", "scratch"):
        raise ValueError(f"draft init must be derived or scratch, got {init!r}")
    draft = derive_draft(target, layers)  # shares everything; now give it layers and a norm of its own
    base = draft.base_model
    layer_attr = _layer_list_name(base)
    owned = torch.nn.ModuleList(copy.deepcopy(layer) for layer in getattr(base, layer_attr))
    if init == "scratch":
        for module in owned.modules():
            target._init_weights(module)
    setattr(base, layer_attr, owned)
    base.norm = copy.deepcopy(base.norm)
    if vocab_ids is not None:
        vocab_ids = vocab_ids.to(torch.long).cpu()
        full = target.get_output_embeddings()
        if int(vocab_ids.max()) >= full.out_features or int(vocab_ids.min()) < 0:
            raise DraftLoadError(f"draft vocabulary ids must lie in [0, {full.out_features})")
        draft.lm_head = head_rows(full, vocab_ids)
        draft.config = copy.deepcopy(draft.config)
        draft.config.tie_word_embeddings = False
        vocab_ids = vocab_ids.to(full.weight.device)
    draft.vocab_ids = vocab_ids
    draft.requires_grad_(False)
    for p in trainable_parameters(draft).values():
        p.requires_grad_(True)
    return draft.eval()


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


def trainable_parameters(draft) -> dict[str, torch.nn.Parameter]:
    """The weights a trained draft owns: its decoder layers and final norm."""
    base = draft.base_model
    layer_attr = _layer_list_name(base)
    prefix = draft.base_model_prefix
    owned = {f"{prefix}.{layer_attr}.{name}": p for name, p in getattr(base, layer_attr).named_parameters()}
    owned |= {f"{prefix}.norm.{name}": p for name, p in base.norm.named_parameters()}
    return owned


def save_draft(draft, out_dir: str | Path, meta: dict, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the owned weights (in `dtype`) and `draft.json`; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to(dtype).cpu().contiguous() for name, p in trainable_parameters(draft).items()}
    if draft.vocab_ids is not None:
        tensors["vocab_ids"] = draft.vocab_ids.to(torch.int32).cpu().contiguous()
    save_file(tensors, str(out / WEIGHTS))
    (out / DRAFT_JSON).write_text(json.dumps(meta, indent=1) + "\n")
    return out


def load_draft(path: str | Path, target):
    """Rebuild a saved draft on top of `target`; checks it was made for a target of this shape."""
    folder = Path(path)
    try:
        meta = json.loads((folder / DRAFT_JSON).read_text())
        tensors = load_file(str(folder / WEIGHTS))
    except (OSError, ValueError) as e:
        raise DraftLoadError(f"cannot read the draft in {folder}: {e}") from e
    _check_signature(folder, meta, target)
    vocab_ids = tensors.pop("vocab_ids", None)
    draft = build_draft(target, meta["layers"], "derived", vocab_ids)
    owned = trainable_parameters(draft)
    if set(owned) != set(tensors):
        raise DraftLoadError(f"draft {folder} weights do not match its layers {meta['layers']}")
    with torch.no_grad():
        for name, p in owned.items():
            if p.shape != tensors[name].shape:
                raise DraftLoadError(f"draft {folder}: {name} has shape {tuple(tensors[name].shape)}, "
                                     f"expected {tuple(p.shape)}")
            p.copy_(tensors[name])
    return draft.requires_grad_(False).eval()


def draft_vocabulary(path: str | Path, target) -> torch.Tensor:
    """The target ids a saved draft's head scores (its `vocab_ids`), for drafts.SelfDrafter."""
    check_target(path, target)
    try:
        tensors = load_file(str(Path(path) / WEIGHTS))
    except (OSError, ValueError) as e:
        raise DraftLoadError(f"cannot read the draft in {path}: {e}") from e
    if "vocab_ids" not in tensors:
        raise DraftLoadError(f"draft {path} has a full-vocabulary head: there is no reduced vocabulary in it")
    return tensors["vocab_ids"].long()


def check_target(path: str | Path, target) -> None:
    """Raise DraftLoadError unless the draft in `path` was trained for a target shaped like this one."""
    try:
        meta = json.loads((Path(path) / DRAFT_JSON).read_text())
    except (OSError, ValueError) as e:
        raise DraftLoadError(f"cannot read {Path(path) / DRAFT_JSON}: {e}") from e
    _check_signature(Path(path), meta, target)


def _check_signature(folder: Path, meta: dict, target) -> None:
    expected, actual = meta.get("target_config", {}), target_signature(target)
    for key, value in expected.items():
        if actual.get(key) != value:
            raise DraftLoadError(f"draft {folder} was trained for a target with {key}={value}, "
                                 f"but this target has {key}={actual.get(key)}")


def target_signature(target) -> dict:
    c = target.config
    return {"model_type": c.model_type, "hidden_size": c.hidden_size, "vocab_size": c.vocab_size,
            "num_hidden_layers": c.num_hidden_layers}


def frequent_token_ids(tokens: torch.Tensor, size: int, always: list[int], vocab_size: int) -> torch.Tensor:
    """The `size` most frequent ids in `tokens`, plus `always` (specials such as EOS), sorted."""
    counts = torch.bincount(tokens.flatten().long(), minlength=vocab_size)
    for i in always:
        counts[i] = counts.max() + 1
    ids = counts.topk(min(size, vocab_size)).indices
    return ids.sort().values
