"""A tiny random llama GGUF, written in-process: the model of the tests that run llama.cpp (xllamacpp) or
read GGUF files, and of the GPU pack's rehearsal (tools/gpu/pack.py).

The model is two llama layers (d_model 64, 4 heads, 2 KV heads, FFN 128, context 512) with seeded random
f32 weights, about 430 KB; writing it takes milliseconds. Its tokenizer is GPT-2-style byte-level BPE
laid out like the byte tokenizer in tests/helpers/tokenizers.py: token id i is byte i (0..255, spelled in GPT-2's
byte-to-unicode form), then <s> (256), <|endoftext|> (257, the EOS) and one merge token, two spaces (258).

The model never generates 256..258 (their output rows are zero), so every generated token is one byte and
a completion's token ids are its bytes. llama.cpp and transformers both load the file, tokenize alike and
decode greedily alike.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

BOS, EOS, MERGE = 256, 257, 258
HIDDEN, LAYERS, HEADS, KV_HEADS, FFN, CONTEXT = 64, 2, 4, 2, 128, 512


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are spelled in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tiny_gguf(path: str | Path, *, seed: int = 0, vocab: str = "bytes") -> Path:
    """Write the tiny llama GGUF to `path` (parents created) and return the path.

    `seed` picks the weights (numpy RandomState); the same seed writes the same bytes. `vocab` names the
    tokenizer; "bytes" (the byte-level BPE above) is the only one so far.
    """
    from gguf import GGUFWriter  # imported on first use: ~0.1 s that modules merely importing this skip

    if vocab != "bytes":
        raise ValueError(f"unknown vocab {vocab!r}; only 'bytes' is supported")
    path = Path(path)
    spelling = bytes_to_unicode()
    space = spelling[ord(" ")]
    # llama.cpp refuses a BPE vocabulary without merges, so there is one: two spaces (code indents). The EOS
    # is spelled <|endoftext|> because transformers' GPT-2-style tokenizer adds that token past the model's
    # vocabulary when the file lacks it.
    tokens = [spelling[b] for b in range(256)] + ["<s>", "<|endoftext|>", space * 2]
    types = [1] * 256 + [3, 3, 1]  # 1: normal, 3: control
    n_vocab = len(tokens)
    rng = np.random.RandomState(seed)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(0)  # all f32
    writer.add_tokenizer_model("gpt2")
    # GPT-2's pre-tokenizer regex, the one transformers gives a byte-level GGUF vocabulary, so both split
    # text alike (llama.cpp spells it "gpt-2"; it refuses "gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{space} {space}"])
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(False)  # prompts tokenize to their bytes alone, the same in every reader
    writer.add_add_eos_token(False)

    def random(name: str, *shape: int, scale: float = 0.2) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    kv = HIDDEN // HEADS * KV_HEADS
    random("token_embd.weight", n_vocab, HIDDEN)
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    output = (rng.standard_normal((n_vocab, HIDDEN)) * 0.2).astype(np.float32)
    # Zero logits for <s>, the EOS and the merge token: greedy decoding never picks them over 256 random
    # competitors, so a generation runs to its token budget (no seed-dependent early EOS) and is all bytes
    output[[BOS, EOS, MERGE]] = 0.0
    writer.add_tensor("output.weight", output)
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, np.float32))
        random(f"blk.{i}.attn_q.weight", HIDDEN, HIDDEN)
        random(f"blk.{i}.attn_k.weight", kv, HIDDEN)
        random(f"blk.{i}.attn_v.weight", kv, HIDDEN)
        random(f"blk.{i}.attn_output.weight", HIDDEN, HIDDEN)
        random(f"blk.{i}.ffn_gate.weight", FFN, HIDDEN)
        random(f"blk.{i}.ffn_up.weight", FFN, HIDDEN)
        random(f"blk.{i}.ffn_down.weight", HIDDEN, FFN)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
