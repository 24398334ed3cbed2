"""`specdec eagle3-gguf`: our EAGLE-3 draft folder (decoder/drafts/eagle3/model.py, the speculators format)
as the GGUF llama.cpp's `eagle3` architecture loads, for `llama-server -md DRAFT.gguf --spec-type draft-eagle3`
(docs/eagle3.md, "Running the draft in llama.cpp"). A one-time export for another runtime: the decoder never
reads this GGUF, so the converter lives here with its command.

Not with the packaged Gemma-3 target yet: the xllamacpp wheel's llama.cpp aborts on the first request
(`GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null")`, llama-graph.cpp): its Gemma-3
graph does not hand out the layer inputs the draft reads, which its Llama graph does (docs/eagle3.md).

What llama.cpp expects (its src/models/eagle3.cpp and common/speculative.cpp, as built into the
xllamacpp wheel; checked against the wheel's strings):

- `general.architecture` "eagle3"; the usual llama keys for the one layer (width, heads, head size,
  FFN, RMS eps, RoPE base and dimensions); `eagle3.target_layers`, three layer ids whose *input*
  states are read from the target (our `aux_layers`: id k is the state entering layer k, the same
  convention, so they go through unchanged); `eagle3.target_hidden_size`; and
  `eagle3.norm_before_residual`.
- The target's tokenizer: the draft context has a vocabulary of its own, and the draft's logits are
  scattered into a target-sized row by `d2t`.
- Tensors `fc.weight`, `blk.0.{attn_norm, attn_norm_2 (our hidden_norm), attn_q, attn_k, attn_v,
  attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}.weight`, `output_norm.weight`, `output.weight`
  and `d2t` (I64). llama.cpp indexes target rows with d2t directly, so it holds absolute target ids
  (ours holds offsets: target id = i + d2t[i]).
- llama.cpp ropes the layer as Llama (adjacent pairs), HF and we rotate halves: q and k rows are
  permuted per head, as llama.cpp's own converter does for Llama.
- No `token_embd`: the draft then reads the target's embedding rows (unscaled; only RMS-normed,
  so Gemma's sqrt(width) scale does not matter). `output` is required here even where our folder
  leaves the head out (`head_from_target`): llama.cpp would borrow the target's full 262k head,
  which does not fit a 32k draft vocabulary, so the head is rebuilt from the target's rows.

`write_eagle3_gguf` converts; `add_parser` and `run` are the command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from speccomplete.decoder.drafts.eagle3.model import WEIGHTS, Eagle3LoadError, read_config, shape_from_config

ARCH = "eagle3"
# our safetensors names -> llama.cpp's (the layer is block 0)
TENSOR_NAMES = {
    "fc.weight": "fc.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "layers.0.input_layernorm.weight": "blk.0.attn_norm.weight",
    "layers.0.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "layers.0.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "layers.0.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "layers.0.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "layers.0.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "layers.0.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "layers.0.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "layers.0.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "layers.0.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}
OUTTYPES = ("f16", "f32")


def resolve_target_gguf(target: str | Path) -> Path:
    """A .gguf path, or a packaged alias (gemma3-270m) resolved to its GGUF."""
    from speccomplete.decoder.models import packaged_gguf

    return Path(packaged_gguf(str(target)))


def write_eagle3_gguf(draft_dir: str | Path, target: str | Path, out_path: str | Path, outtype: str = "f16") -> Path:
    """Write the EAGLE-3 draft in `draft_dir` as an llama.cpp eagle3 GGUF at `out_path` for the target
    GGUF `target` (a path or a packaged alias), which gives the tokenizer and, for a folder without its
    head, the head's rows. Matrices in `outtype` (f16 or f32), norms in f32. Returns `out_path`."""
    import gguf
    from safetensors.torch import load_file

    if outtype not in OUTTYPES:
        raise ValueError(f"outtype must be one of {OUTTYPES}, got {outtype!r}")
    draft_dir, out_path = Path(draft_dir), Path(out_path)
    config = read_config(draft_dir)
    shape = shape_from_config(config)
    if len(shape.aux_layers) != 3:
        raise Eagle3LoadError(f"llama.cpp's eagle3 reads exactly 3 target layers; {draft_dir} reads {shape.aux_layers}")
    reader = gguf.GGUFReader(resolve_target_gguf(target))
    arch = _field(reader, "general.architecture")
    n_layer = int(_field(reader, f"{arch}.block_count"))
    width = int(_field(reader, f"{arch}.embedding_length"))
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    problems = []
    if width != shape.hidden_size:
        problems.append(f"width {width}, the draft's {shape.hidden_size}")
    if n_vocab != shape.target_vocab:
        problems.append(f"vocabulary {n_vocab}, the draft's {shape.target_vocab}")
    if max(shape.aux_layers) > n_layer:
        problems.append(f"{n_layer} layers, the draft reads layer {max(shape.aux_layers)}")
    if problems:
        raise Eagle3LoadError("the EAGLE-3 draft was made for another target: the GGUF has " + "; ".join(problems))

    state = {k: v for k, v in load_file(str(draft_dir / WEIGHTS)).items() if k != "t2d"}
    target_ids = np.arange(shape.draft_vocab, dtype=np.int64) + state.pop("d2t").long().numpy()
    if target_ids.min() < 0 or target_ids.max() >= n_vocab or len(np.unique(target_ids)) != len(target_ids):
        raise Eagle3LoadError(f"{draft_dir}: d2t maps to target ids outside 0..{n_vocab - 1} or twice")
    arrays = {name: t.float().numpy() for name, t in state.items()}
    if "lm_head.weight" not in arrays:
        if not config.get("head_from_target"):
            raise Eagle3LoadError(f"{draft_dir} has no lm_head.weight")
        arrays["lm_head.weight"] = _target_head_rows(reader, target_ids)
    unknown = sorted(set(arrays) - set(TENSOR_NAMES))
    missing = sorted(set(TENSOR_NAMES) - set(arrays))
    if unknown or missing:
        raise Eagle3LoadError(f"{draft_dir}: weights missing {missing}, unexpected {unknown}")
    arrays["layers.0.self_attn.q_proj.weight"] = _rope_pairs(
        arrays["layers.0.self_attn.q_proj.weight"], shape.num_heads
    )
    arrays["layers.0.self_attn.k_proj.weight"] = _rope_pairs(
        arrays["layers.0.self_attn.k_proj.weight"], shape.num_kv_heads
    )

    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), ARCH)
    writer.add_name(f"{draft_dir.name} (EAGLE-3 draft)")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if outtype == "f16" else gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(shape.max_positions)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(1)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_heads)
    writer.add_head_count_kv(shape.num_kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_norm_eps)
    writer.add_vocab_size(n_vocab)
    writer.add_array(f"{ARCH}.target_layers", list(shape.aux_layers))
    writer.add_uint32(f"{ARCH}.target_hidden_size", width)
    writer.add_bool(f"{ARCH}.norm_before_residual", shape.norm_before_residual)
    _copy_tokenizer(reader, writer)
    dtype = np.float16 if outtype == "f16" else np.float32
    for name, array in arrays.items():
        writer.add_tensor(
            TENSOR_NAMES[name], np.ascontiguousarray(array.astype(dtype if array.ndim == 2 else np.float32))
        )
    writer.add_tensor("d2t", target_ids, raw_dtype=gguf.GGMLQuantizationType.I64)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(out_path)
    return out_path


def _field(reader, key: str):
    if key not in reader.fields:
        raise Eagle3LoadError(f"the target GGUF has no {key}")
    return reader.fields[key].contents()


def _target_head_rows(reader, target_ids: np.ndarray) -> np.ndarray:
    """The target's output rows for `target_ids`, dequantized: its `output.weight`, or the tied embedding."""
    from gguf.quants import dequantize

    tensors = {t.name: t for t in reader.tensors}
    tensor = tensors.get("output.weight") or tensors.get("token_embd.weight")
    if tensor is None:
        raise Eagle3LoadError("the target GGUF has neither output.weight nor token_embd.weight")
    rows = np.asarray(tensor.data)[target_ids]  # raw bytes (or floats) of the chosen rows only
    return dequantize(rows, tensor.tensor_type).astype(np.float32).reshape(len(target_ids), -1)


def _rope_pairs(weight: np.ndarray, heads: int) -> np.ndarray:
    """q/k rows from rotate-half order (HF, ours) to llama.cpp's adjacent pairs, per head."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _copy_tokenizer(reader, writer) -> None:
    import gguf

    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), kind, sub_type=field.types[-1])
        else:
            writer.add_key_value(key, field.contents(), kind)


def add_parser(subparsers) -> argparse.ArgumentParser:
    from speccomplete.decoder.drafts.trained import SHIPPED_DRAFTS

    p = subparsers.add_parser("eagle3-gguf")
    p.add_argument(
        "--draft",
        default=str(SHIPPED_DRAFTS / "gemma3-270m-eagle3"),
        help="the draft folder (default: the shipped one)",
    )
    p.add_argument(
        "--target", default="gemma3-270m", help="the target's GGUF file or packaged alias (default: %(default)s)"
    )
    p.add_argument("--out", required=True, help="the GGUF file to write")
    p.add_argument("--outtype", default="f16", choices=OUTTYPES, help="the matrices' type; norms stay f32")
    return p


def run(args: argparse.Namespace) -> int:
    out = write_eagle3_gguf(args.draft, args.target, args.out, args.outtype)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0
