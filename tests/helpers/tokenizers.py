"""Tokenizers built in-process (there is no model hub here).

The byte tokenizer, which the tiny models share: a byte-level BPE with no merges, token id i is byte i (0..255),
then <s> (256) and </s> (257).

The families' tokenizers, laid out like the code-model families' real ones: their fill-in-the-middle markers,
begin and end tokens, at the places and with the flags the published tokenizer files give them. Each is small:
every byte as a token (byte-level or SentencePiece byte fallback, as the family does), no merges, and the
family's markers. Where the family's tokenizer class is in
transformers (CodeLlama, Gemma, Qwen2, GPT-2), that class builds it, so its own rules for spaces and added
tokens apply. What each mirrors:

- StarCoder and StarCoder2: GPT-2 byte-level BPE; <|endoftext|> 0, <fim_prefix> 1, <fim_middle> 2, <fim_suffix> 3,
  <fim_pad> 4, all special; no begin token.
- Qwen2.5-Coder: Qwen2 byte-level BPE; <|endoftext|> special (its EOS), the FIM markers added as non-special
  tokens (`"special": false, "normalized": false`, ids 151659-151664 there); no begin token.
- CodeGemma: Gemma's SentencePiece BPE (spaces as ▁, byte fallback); <pad> 0, <eos> 1, <bos> 2, <unk> 3, the FIM
  markers in the base vocabulary at 67-70 and listed as non-special added tokens; <bos> begins every prompt.
- DeepSeek-Coder: byte-level BPE; <｜begin▁of▁sentence｜> and <｜end▁of▁sentence｜> special, the FIM markers
  non-special added tokens (32015-32017 there); the begin token begins every prompt.
- CodeLlama: Llama's SentencePiece vocabulary (byte fallback, <unk> 0, <s> 1, </s> 2, bytes 3-258) with ▁<PRE>,
  ▁<SUF>, ▁<MID>, ▁<EOT> at their real ids 32007-32010 in a 32016-token vocabulary; transformers'
  CodeLlamaTokenizer makes them special tokens.
"""

from __future__ import annotations

from collections.abc import Callable

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    CodeLlamaTokenizer,
    GemmaTokenizer,
    GPT2Tokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Tokenizer,
)

from speccomplete.harness.tiny_gguf import bytes_to_unicode

# --------------------------------------------------------------------------- the byte tokenizer

BOS, EOS = 256, 257
BYTE_VOCAB = 258  # 256 bytes + <s> + </s>


def make_byte_tokenizer(
    bos: bool = True, eos: bool = True, eos_name: str = "</s>", merges: tuple[tuple[str, str], ...] = ()
) -> PreTrainedTokenizerFast:
    """Byte-level BPE, 256 byte tokens (id == byte value), no merges; specials appended after them.
    merges: pairs of texts that become one token each (ids from 256, before the specials; e.g. (" ", "*"))."""
    byte_char = bytes_to_unicode()
    vocab = {byte_char[b]: b for b in range(256)}

    def piece(text: str) -> str:
        return "".join(byte_char[b] for b in text.encode("utf-8"))

    for left, right in merges:
        vocab[piece(left + right)] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(piece(left), piece(right)) for left, right in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    kwargs = {}
    if bos:
        kwargs["bos_token"] = "<s>"
    if eos:
        kwargs["eos_token"] = eos_name
    out = PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)
    if bos and not merges:
        assert out.bos_token_id == BOS
    if eos and not merges:
        assert out.eos_token_id == (EOS if bos else BOS)
    return out


def byte_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


# --------------------------------------------------------------------------- the families' tokenizers

BYTE_PIECES = [bytes_to_unicode()[b] for b in range(256)]
BYTE_FALLBACK = [f"<0x{b:02X}>" for b in range(256)]


def _non_special(*tokens: str) -> list[AddedToken]:
    return [AddedToken(t, special=False, normalized=False) for t in tokens]


def starcoder() -> PreTrainedTokenizerBase:
    specials = ["<|endoftext|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]
    vocab = {t: i for i, t in enumerate(specials)} | {p: len(specials) + b for b, p in enumerate(BYTE_PIECES)}
    return GPT2Tokenizer(vocab=vocab, merges=[], additional_special_tokens=specials[1:])


def qwen_coder() -> PreTrainedTokenizerBase:
    tokenizer = Qwen2Tokenizer(vocab={p: b for b, p in enumerate(BYTE_PIECES)}, merges=[])
    markers = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>")
    tokenizer.add_tokens(_non_special(*markers))
    return tokenizer


CODEGEMMA_FIM = {67: "<|fim_prefix|>", 68: "<|fim_middle|>", 69: "<|fim_suffix|>", 70: "<|file_separator|>"}


def codegemma() -> PreTrainedTokenizerBase:
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    pieces += [CODEGEMMA_FIM.get(i, f"<unused{i}>") for i in range(len(pieces), 71)]
    pieces += BYTE_FALLBACK + ["▁"] + [chr(c) for c in range(33, 127)]
    tokenizer = GemmaTokenizer(vocab={p: i for i, p in enumerate(pieces)}, merges=[], add_bos_token=True)
    tokenizer.add_tokens(_non_special(*CODEGEMMA_FIM.values()))
    return tokenizer


DEEPSEEK_BEGIN, DEEPSEEK_END = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"


def deepseek_coder() -> PreTrainedTokenizerBase:
    vocab = {p: b for b, p in enumerate(BYTE_PIECES)} | {DEEPSEEK_BEGIN: 256, DEEPSEEK_END: 257}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{DEEPSEEK_BEGIN} $A", pair=f"{DEEPSEEK_BEGIN} $A $B", special_tokens=[(DEEPSEEK_BEGIN, 256)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=DEEPSEEK_BEGIN, eos_token=DEEPSEEK_END)
    tokenizer.add_tokens(_non_special("<｜fim▁hole｜>", "<｜fim▁begin｜>", "<｜fim▁end｜>"))
    return tokenizer


CODELLAMA_FIM = {32007: "▁<PRE>", 32008: "▁<SUF>", 32009: "▁<MID>", 32010: "▁<EOT>"}
CODELLAMA_VOCAB = 32016


def codellama() -> PreTrainedTokenizerBase:
    pieces = ["<unk>", "<s>", "</s>", *BYTE_FALLBACK, "▁", *(chr(c) for c in range(33, 127))]
    vocab = {p: i for i, p in enumerate(pieces)}
    # the rest of Llama's SentencePiece pieces: any that no test text needs
    vocab |= {CODELLAMA_FIM.get(i, f"▁piece{i}"): i for i in range(len(pieces), CODELLAMA_VOCAB)}
    return CodeLlamaTokenizer(vocab=vocab, merges=[])


# the family's name -> a builder of its tokenizer
FAMILY_TOKENIZERS: dict[str, Callable[[], PreTrainedTokenizerBase]] = {
    "starcoder": starcoder,
    "qwen-coder": qwen_coder,
    "codegemma": codegemma,
    "deepseek-coder": deepseek_coder,
    "codellama": codellama,
}
