"""Training an EAGLE-3 draft (decoder/drafts/eagle3/model.py) on the target's own hidden states.

The draft reads the target's states (the aux states it fuses, and the final normed state the
target's head reads, which makes the teacher). They come from one of two sources, with one interface:
- `OnlineFeatures` (a GPU): the frozen target runs inside each training step, batched, no_grad, in
  its own dtype; nothing touches a disk, and every epoch sees fresh sequences;
- `extract_features` + `FeatureShards` (the CPU): teacher-forced target passes over corpus sequences,
  written once to chunk files, so epochs on the CPU never run the target again. Resumable: chunks
  already written are skipped.
`train_eagle3` trains the draft's own weights (fc, the layer, norm; the head stays the target's rows,
frozen) with the "training-time test" (TTT) objective below, in decoder/training/trainer.py's loop.
The teacher is compact: the target's distribution over the draft's vocabulary only (its head rows).

TTT, as the engine decodes (decoder/drafts/eagle3/model.py, `Eagle3.step`): sequence x_0..x_{L-1},
features g_t. Step 0, row i: embeds E[x_{i+1}], hidden fuse(g_i), position i+1, causal attention
over step-0 rows; trained toward the target's next-token distribution after x_{i+1}. Step s,
row i: embeds E[x_{i+1+s}], hidden = the draft's own step-(s-1) output of row i, position i+1+s;
it attends to step-0 rows 0..i and to row i's own rows of steps 1..s (what the decode cache
holds after drafting s tokens from position i+1). Trained toward the target after x_{i+1+s}.
Loss: Σ_s decay^s KL(P || Q) over the draft's vocabulary. The diagonal keys are scored one
vector product each, so memory stays O(L^2), not O(L * sL).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

from ..drafts.eagle3.model import Eagle3
from ..drafts.trained import target_signature
from ..kv_cache import forward_tapped, new_cache
from .corpus import Shards
from .fitness import fitness_from_logits
from .teacher import teacher_logits
from .trainer import LoopConfig, Phase
from .trainer import train as train_loop

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FEATURES_FORMAT = 1


# --------------------------------------------------------------------------- feature extraction


def extract_features(
    target,
    shards: Shards,
    out_dir: str | Path,
    taps: tuple[int, ...],
    sequences: int | None = None,
    indices: torch.Tensor | None = None,
    chunk_sequences: int = 64,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> dict:
    """Run the target teacher-forced over `sequences` corpus sequences (a seeded shuffle, so a prefix
    mixes languages; or exactly `indices`) and write chunk-NNNNN.safetensors + manifest.json.

    Each chunk: ids int32 [n, L], features bf16 [n, L, len(taps) h], final bf16 [n, L, h],
    language int64 [n]. Chunks already on disk holding the same sequences are kept, so an interrupted
    extraction (or a larger `sequences` later) resumes. `progress` gets the number of sequences done.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = target.config.get_text_config()
    num_layers, hidden = config.num_hidden_layers, config.hidden_size
    taps = tuple(int(t) for t in taps)
    if any(not 0 <= t <= num_layers for t in taps):
        raise ValueError(f"aux layers must be in 0..{num_layers} for a {num_layers}-layer target, got {taps}")
    # each state tapped once, in layer order (as forward_tapped returns them), then picked per tap;
    # num_layers, the final normed state, is both what the head reads and a shallow target's last aux layer
    wanted = tuple(sorted(set(taps) | {num_layers}))
    pick = [wanted.index(t) for t in taps]
    if indices is None:
        order = torch.randperm(len(shards.tokens), generator=torch.Generator().manual_seed(seed))
        indices = order[: len(order) if sequences is None else min(sequences, len(order))]
    indices = indices.long()
    seq_len = shards.tokens.shape[1]
    signature = target_signature(target)
    manifest_path = out / MANIFEST
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        same = (old.get("taps"), old.get("target"), old.get("seq_len")) == (list(taps), signature, seq_len)
        if not same:
            raise ValueError(
                f"{out} holds features of another target, taps or sequence length "
                f"({old.get('taps')}, {old.get('target')}, {old.get('seq_len')}); use another --features folder"
            )
    chunks = []
    done = 0
    for c, start in enumerate(range(0, len(indices), chunk_sequences)):
        rows = indices[start : start + chunk_sequences]
        name = f"chunk-{c:05d}.safetensors"
        chunks.append({"file": name, "sequences": len(rows)})
        if _holds(out / name, shards.tokens[rows]):
            done += len(rows)
            if progress:
                progress(done)
            continue
        ids_out, features_out, final_out = [], [], []
        with torch.inference_mode():
            for i in rows.tolist():
                ids = shards.tokens[i].to(target.device)
                _, tapped = forward_tapped(target, new_cache(), ids, keep=1, taps=wanted)
                assert tapped is not None  # taps given: never None
                states = tapped.view(len(ids), len(wanted), hidden)
                ids_out.append(shards.tokens[i].to(torch.int32))
                features_out.append(states[:, pick].flatten(1).to(torch.bfloat16).cpu())
                final_out.append(states[:, -1].to(torch.bfloat16).cpu())
                done += 1
                if progress:
                    progress(done)
        tensors = {
            "ids": torch.stack(ids_out).contiguous(),
            "features": torch.stack(features_out).contiguous(),
            "final": torch.stack(final_out).contiguous(),
            "language": shards.language[rows].long().contiguous(),
        }
        # aside, then renamed: a crash mid-write leaves no truncated chunk that looks complete
        save_file(tensors, str(out / f"{name}.tmp"), metadata={"format": "pt"})
        (out / f"{name}.tmp").replace(out / name)
    manifest = {
        "format": FEATURES_FORMAT,
        "languages": list(shards.languages),
        "taps": list(taps),
        "hidden_size": hidden,
        "seq_len": seq_len,
        "target": signature,
        "sequences": len(indices),
        "tokens": len(indices) * seq_len,
        "chunks": chunks,
        "corpus": shards.manifest.get("command", ""),
    }
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _holds(path: Path, ids: torch.Tensor) -> bool:
    """Whether the chunk at `path` was extracted from exactly these sequences (another seed, size or
    corpus puts others there; a corrupt chunk is redone)."""
    if not path.exists():
        return False
    try:
        with safe_open(str(path), "pt") as f:
            return torch.equal(f.get_tensor("ids").long(), ids.long())
    except Exception:
        return False


class FeatureShards:
    """Extracted features: ids and languages in memory (the sampler's view, as train.py's Shards),
    features read per batch from the chunk files."""

    def __init__(self, directory: str | Path):
        directory = Path(directory)
        path = directory / MANIFEST
        if not path.exists():
            raise ValueError(f"{directory} has no {MANIFEST}: extract features first")
        self.manifest = json.loads(path.read_text())
        self.languages: list[str] = self.manifest["languages"]
        self.taps: list[int] = self.manifest["taps"]
        self._files = [safe_open(str(directory / c["file"]), "pt") for c in self.manifest["chunks"]]
        self._starts = []
        ids, language, start = [], [], 0
        for f in self._files:
            ids.append(f.get_tensor("ids").long())
            language.append(f.get_tensor("language").long())
            self._starts.append(start)
            start += len(ids[-1])
        self.tokens = torch.cat(ids)  # [N, L]: `BatchSampler` draws from len(tokens)
        self.language = torch.cat(language)

    def __len__(self) -> int:
        return len(self.tokens)

    def indices_of(self, language: str) -> torch.Tensor:
        return (self.language == self.languages.index(language)).nonzero().flatten()

    def batch(
        self, indices: torch.Tensor, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ids [B, L] long, features [B, L, k h] and final hidden [B, L, h] in `dtype`, on `device`."""
        features, final = [], []
        for i in indices.tolist():
            c = bisect.bisect_right(self._starts, i) - 1
            row = i - self._starts[c]
            features.append(self._files[c].get_slice("features")[row : row + 1])
            final.append(self._files[c].get_slice("final")[row : row + 1])
        return (
            self.tokens[indices].to(device),
            torch.cat(features).to(device=device, dtype=dtype),
            torch.cat(final).to(device=device, dtype=dtype),
        )


class OnlineFeatures:
    """The target's states computed when a batch is drawn: FeatureShards' interface over corpus Shards.

    A batch runs the frozen target once, teacher-forced over whole sequences ([B, L] at a time, no_grad,
    in the target's dtype), and keeps the tapped states and the final normed state; the corpus tokens
    wait on the target's device, so drawing a batch never waits for the GPU."""

    def __init__(self, target, shards: Shards, taps: tuple[int, ...]):
        num_layers = target.config.get_text_config().num_hidden_layers
        if any(not 0 <= t <= num_layers for t in taps):
            raise ValueError(f"aux layers must be in 0..{num_layers} for a {num_layers}-layer target, got {taps}")
        self.target = target
        self.taps = [int(t) for t in taps]
        self.languages = shards.languages
        self.language = shards.language
        self.tokens = shards.tokens  # [N, L]: `BatchSampler` draws from len(tokens)
        self.manifest = shards.manifest
        self._tokens_on_device = shards.tokens.to(target.device)

    def __len__(self) -> int:
        return len(self.tokens)

    def indices_of(self, language: str) -> torch.Tensor:
        return (self.language == self.languages.index(language)).nonzero().flatten()

    @torch.no_grad()
    def batch(
        self, indices: torch.Tensor, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ids [B, L] long, features [B, L, k h] and final hidden [B, L, h] on the target's device.

        `dtype` is FeatureShards' argument; states stay in the target's dtype (autocast, or the draft's
        `fuse`, casts them where they are read)."""
        if self._tokens_on_device.is_cuda:  # a pinned copy does not wait for the kernels queued before it
            indices = indices.pin_memory().to(self._tokens_on_device.device, non_blocking=True)
        ids = self._tokens_on_device[indices]
        features, final = target_states(self.target, ids, self.taps)
        return ids, features, final


def target_states(target, ids: torch.Tensor, taps: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The states entering target layers `taps` (the number of layers: the final, normed, states),
    concatenated [B, L, len(taps) h], and the final normed states [B, L, h], of sequences `ids` [B, L]:
    what kv_cache.forward_tapped returns for one sequence, for a batch at once."""
    out = target.base_model(input_ids=ids, use_cache=False, output_hidden_states=True)
    states = list(out.hidden_states[:-1]) + [out.last_hidden_state]  # HF's last is the normed state too
    return torch.cat([states[k] for k in taps], dim=-1), out.last_hidden_state


# --------------------------------------------------------------------------- the TTT forward and loss


def ttt_forward(
    draft: Eagle3, embed_weight: torch.Tensor, ids: torch.Tensor, features: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """Draft logits of every TTT step: element s is [B, L-1-s, V'], row i predicting the token after x_{i+1+s}.

    ids [B, L], features [B, L, k h]. Rows that would run past the sequence are dropped, not masked:
    a row only ever attends to step-0 rows before it and to itself, so the others never matter.
    """
    layer = draft.layer
    heads, kv_heads, head_dim = draft.shape.num_heads, draft.shape.num_kv_heads, draft.shape.head_dim
    repeat = heads // kv_heads
    scale = 1.0 / math.sqrt(head_dim)
    rows = ids.shape[1] - 1
    device = ids.device
    hidden = draft.fuse(features[:, :rows])
    out: list[torch.Tensor] = []
    k0 = v0 = None
    diag_k: list[torch.Tensor] = []
    diag_v: list[torch.Tensor] = []
    for s in range(min(steps, rows)):
        n = rows - s  # rows i = 0..n-1 still embed a token of the sequence, x_{i+1+s}, so have a teacher P_{i+1+s}
        embeds = F.embedding(ids[:, 1 + s : 1 + s + n], embed_weight).to(hidden.dtype)
        hidden = hidden[:, :n]
        cos, sin = draft.rotary(torch.arange(1 + s, 1 + s + n, device=device))
        q, k, v = layer.qkv(embeds, hidden, cos, sin)
        k = k.repeat_interleave(repeat, dim=1)  # GQA, as SDPA's enable_gqa pairs heads
        v = v.repeat_interleave(repeat, dim=1)
        if s == 0:
            k0, v0 = k, v
            causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        else:
            assert k0 is not None and v0 is not None
            diag_k = [dk[:, :, :n] for dk in diag_k] + [k]
            diag_v = [dv[:, :, :n] for dv in diag_v] + [v]
            causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
            scores = (q @ k0[:, :, :n].transpose(-1, -2)) * scale  # [B, H, n, n]
            scores = scores.masked_fill(~causal, float("-inf"))
            diagonal = torch.stack([(q * dk).sum(-1) * scale for dk in diag_k], dim=-1)  # [B, H, n, s]
            weights = torch.softmax(torch.cat([scores, diagonal], dim=-1).float(), dim=-1).to(q.dtype)
            attended = weights[..., :n] @ v0[:, :, :n]
            for j, dv in enumerate(diag_v):
                attended = attended + weights[..., n + j, None] * dv
        hidden = layer.finish(hidden, attended)
        out.append(draft.logits(hidden))
    return out


def ttt_loss(
    draft: Eagle3,
    embed_weight: torch.Tensor,
    ids: torch.Tensor,
    features: torch.Tensor,
    final_hidden: torch.Tensor,
    steps: int = 3,
    decay: float = 0.8,
    softcap: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Σ_s decay^s KL(P || Q) (mean over valid rows), and per step: kl, top-1 agreement, expected acceptance,
    as detached device scalars (reading them back is the caller's one host sync).

    KL(P || Q) = Σ P log P - Σ P log Q: P and its entropy are computed once for every step, so what a step
    keeps for the backward pass is its log Q alone (the [rows, draft vocabulary] tensors dominate memory)."""
    q_steps = ttt_forward(draft, embed_weight, ids, features, steps)
    with torch.no_grad():
        # P_t for t = 1..L-1: the target's distribution after x_t; step s row i wants t = i+1+s
        log_p_all = torch.log_softmax(teacher_logits(draft.lm_head.weight, final_hidden[:, 1:], softcap).float(), -1)
        p_all = log_p_all.exp()
        p_log_p = (p_all * log_p_all).sum(-1)  # [B, L-1]
        p_top1 = log_p_all.argmax(-1)
        del log_p_all
    loss = torch.zeros((), device=ids.device)
    parts: dict[str, torch.Tensor] = {}
    for s, q_logits in enumerate(q_steps):
        n = q_logits.shape[1]
        p = p_all[:, s : s + n]
        log_q = torch.log_softmax(q_logits.float(), -1)
        kl = (p_log_p[:, s : s + n] - (p * log_q).sum(-1)).mean()
        loss = loss + decay**s * kl
        with torch.no_grad():
            parts[f"kl_{s}"] = kl.detach()
            parts[f"top1_{s}"] = (q_logits.argmax(-1) == p_top1[:, s : s + n]).float().mean()
            parts[f"acceptance_{s}"] = torch.minimum(p, log_q.exp()).sum(-1).mean()
    return loss, parts


# --------------------------------------------------------------------------- the objective and its run


@dataclass(kw_only=True)
class Eagle3TrainConfig(LoopConfig):
    tokens: int  # sequence tokens to train on (batch x seq_len per batch); epochs over the data are fine
    steps: int = 3  # TTT steps
    decay: float = 0.8
    softcap: float | None = None  # the target's final_logit_softcapping
    batch_size: int = 8
    eval_sequences: int = 8  # dev sequences per language
    eval_tokens: int = 128  # positions scored per dev sequence: the target's full head is costly on the CPU

    def __post_init__(self):
        super().__post_init__()
        if self.steps < 1 or self.tokens <= 0:
            raise ValueError("need steps >= 1 and tokens > 0")


Features = FeatureShards | OnlineFeatures


def trainable_parameters(draft: Eagle3) -> dict[str, torch.nn.Parameter]:
    """fc, the layer and norm: everything but the head (the target's rows, frozen)."""
    return {n: p for n, p in draft.named_parameters() if not n.startswith("lm_head.")}


@torch.no_grad()
def dev_fitness(
    draft: Eagle3,
    embed_weight: torch.Tensor,
    dev: Features,
    cfg: Eagle3TrainConfig,
    target_head: torch.Tensor | None = None,
) -> dict[str, dict[str, float]]:
    """Per language, at every TTT step s: top-1 agreement (top1_s) and expected acceptance Σmin(P, Q)
    (acceptance_s); expected_acceptance and cross_entropy are step 0's (the keys s-CDF reads).

    With `target_head` (the target's full output matrix) P is the target's whole distribution, as the
    engine accepts against (decoder/training/fitness.py): a token outside the draft's vocabulary is
    never accepted. Without, P is renormalized over the draft's vocabulary (the training teacher).
    """
    device = embed_weight.device
    vocab_ids = draft.target_ids() if target_head is not None else None
    out: dict[str, dict[str, float]] = {}
    for lang in dev.languages:
        ix = dev.indices_of(lang)[: cfg.eval_sequences]
        if not len(ix):
            continue
        rows = []
        for i in ix:
            ids, features, final = dev.batch(i[None], device)
            keep = cfg.eval_tokens + 1  # a sequence's first positions: those the TTT steps score
            ids, features, final = ids[:, :keep], features[:, :keep], final[:, :keep]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.bf16):
                q_steps = ttt_forward(draft, embed_weight, ids, features, cfg.steps)
            if target_head is not None:
                p_logits = teacher_logits(target_head, final[0, 1:], cfg.softcap).float()
            else:
                p_logits = teacher_logits(draft.lm_head.weight, final[0, 1:], cfg.softcap).float()
            row: dict[str, float] = {}
            for s, q_logits in enumerate(q_steps):
                n = q_logits.shape[1]
                f = fitness_from_logits(p_logits[s : s + n], q_logits[0].float(), vocab_ids)
                row[f"top1_{s}"], row[f"acceptance_{s}"] = f["top1_agreement"], f["expected_acceptance"]
                if s == 0:
                    row["expected_acceptance"], row["cross_entropy"] = f["expected_acceptance"], f["cross_entropy"]
            rows.append(row)
        out[lang] = {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
    if out:
        out["all"] = {k: sum(v[k] for v in out.values()) / len(out) for k in next(iter(out.values()))}
    return out


class Eagle3Objective:
    """The EAGLE-3 draft's part of the loop: its own weights, ttt_loss on a batch's states, dev_fitness."""

    top1_key = "top1_0"

    def __init__(
        self,
        draft: Eagle3,
        embed_weight: torch.Tensor,
        cfg: Eagle3TrainConfig,
        dev: Features | None = None,
        target_head: torch.Tensor | None = None,
    ):
        self.draft, self.cfg, self.dev, self.target_head = draft, cfg, dev, target_head
        self.embed_weight = embed_weight.detach()
        self.params = trainable_parameters(draft)
        for p in self.params.values():
            p.requires_grad_(True)
        draft.lm_head.weight.requires_grad_(False)

    def parameters(self) -> dict[str, torch.nn.Parameter]:
        return self.params

    def loss(self, data: Features, indices: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        ids, features, final = data.batch(indices, self.embed_weight.device)
        cfg = self.cfg
        return ttt_loss(self.draft, self.embed_weight, ids, features, final, cfg.steps, cfg.decay, cfg.softcap)

    def evaluate(self) -> dict[str, dict[str, float]] | None:
        if self.dev is None:
            return None
        return dev_fitness(self.draft, self.embed_weight, self.dev, self.cfg, self.target_head)

    def train_mode(self, on: bool) -> None:
        self.draft.train(on)


def train_eagle3(
    embed_weight: torch.Tensor,
    draft: Eagle3,
    cfg: Eagle3TrainConfig,
    data: Features,
    dev: Features | None = None,
    progress: Callable[[dict], None] | None = None,
    resume: bool = True,
    target_head: torch.Tensor | None = None,
) -> dict:
    """Train `draft`'s own weights on the target's states from `data` (trainer.train); returns the final state.

    `embed_weight` is the target's input embedding matrix (the draft reads it, never trains it);
    `target_head`, its output matrix, makes dev fitness score against the full distribution (`dev_fitness`).
    """
    if list(data.taps) != list(draft.shape.aux_layers):
        raise ValueError(f"the features tap layers {list(data.taps)}, the draft reads {list(draft.shape.aux_layers)}")
    objective = Eagle3Objective(draft, embed_weight, cfg, dev, target_head)
    return train_loop(objective, [Phase(data, cfg.tokens)], cfg, progress, resume, device=embed_weight.device)
