"""Fill-in-the-middle prompts for each code-model family, on tokenizers laid out like the real ones
(tests/helpers/tokenizers.py): the markers are found in the tokenizer's vocabulary, each encodes to its
own single token, the prompt is the family's layout token for token, healing leaves the middle marker alone,
and a decode stops at the token that ends the middle.
"""

from __future__ import annotations

import threading
import time

import pytest
from helpers.lsp import always_writing
from helpers.tokenizers import FAMILY_TOKENIZERS

from speccomplete.decoder.healing import heal
from speccomplete.server.completion import Request, complete, load_engine
from speccomplete.server.options import ServerOptions
from speccomplete.server.prompt import FIM_STYLES, Prompt, TokenIds, fim_end_ids, fim_stop_ids, fim_tokens, format_fim

FAMILIES = list(FAMILY_TOKENIZERS)
STYLE = {"starcoder": 0, "qwen-coder": 1, "codegemma": 1, "deepseek-coder": 2, "codellama": 3}

PROMPT = Prompt(prefix="a = ", suffix="\nb", multiline=False, indent="", language="python")

# The prompt as the family's tokenizer writes it: the begin token where the family adds one, the markers, and
# the text between them (byte-level pieces: Ġ a space, Ċ a line break; SentencePiece: ▁ a space, <0x0A> a
# line break). CodeLlama's prefix carries SentencePiece's leading space and its suffix none, as Meta's
# reference infilling encodes them (`<PRE> {prefix} <SUF>{suffix} <MID>`).
LAYOUT = {
    "starcoder": ["<fim_prefix>", "a", "Ġ", "=", "Ġ", "<fim_suffix>", "Ċ", "b", "<fim_middle>"],
    "qwen-coder": ["<|fim_prefix|>", "a", "Ġ", "=", "Ġ", "<|fim_suffix|>", "Ċ", "b", "<|fim_middle|>"],
    "codegemma": ["<bos>", "<|fim_prefix|>", "a", "▁", "=", "▁", "<|fim_suffix|>", "<0x0A>", "b", "<|fim_middle|>"],
    "deepseek-coder": [
        "<｜begin▁of▁sentence｜>",
        "<｜fim▁begin｜>",
        *["a", "Ġ", "=", "Ġ"],
        "<｜fim▁hole｜>",
        *["Ċ", "b"],
        "<｜fim▁end｜>",
    ],
    "codellama": ["<s>", "▁<PRE>", "▁", "a", "▁", "=", "▁", "▁<SUF>", "<0x0A>", "b", "▁<MID>"],
}

# the token each family writes when the middle is done
END = {
    "starcoder": "<|endoftext|>",
    "qwen-coder": "<|endoftext|>",
    "codegemma": "<|file_separator|>",
    "deepseek-coder": "<｜end▁of▁sentence｜>",
    "codellama": "▁<EOT>",
}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param, FAMILY_TOKENIZERS[request.param]()


def test_the_markers_are_found_in_the_vocabulary(family):
    name, tokenizer = family
    assert fim_tokens(tokenizer.get_vocab()) == FIM_STYLES[STYLE[name]]


def test_each_marker_and_the_end_encode_to_one_token(family):
    name, tokenizer = family
    vocab = tokenizer.get_vocab()
    tokens = fim_tokens(vocab)
    assert tokens is not None
    for marker in (tokens.prefix, tokens.suffix, tokens.middle, END[name]):
        assert tokenizer(marker, add_special_tokens=False)["input_ids"] == [vocab[marker]], marker
    assert fim_end_ids(tokens, vocab) == {vocab[END[name]]}


def test_the_servers_token_lookup_finds_what_the_whole_vocabulary_finds(family):
    """The server looks the markers up one by one (TokenIds) rather than building get_vocab()'s dict."""
    _, tokenizer = family
    vocab, ids = tokenizer.get_vocab(), TokenIds(tokenizer)
    tokens = fim_tokens(ids)
    assert tokens == fim_tokens(vocab) and tokens is not None
    assert fim_stop_ids(tokens, ids) == fim_stop_ids(tokens, vocab)
    assert "<no such token>" not in ids and 5 not in ids


def test_the_prompt_is_the_familys_layout(family):
    name, tokenizer = family
    ids = tokenizer(format_fim(PROMPT, fim_tokens(tokenizer.get_vocab())), add_special_tokens=True)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == LAYOUT[name]


def test_codellamas_markers_have_their_real_ids_and_text():
    tokenizer = FAMILY_TOKENIZERS["codellama"]()
    text = format_fim(PROMPT, fim_tokens(tokenizer.get_vocab()))
    assert text == "▁<PRE> a = ▁<SUF>\nb▁<MID>"
    ids = tokenizer(text)["input_ids"]
    assert ids[:2] == [1, 32007] and ids[-4:-2] == [32008, 13] and ids[-1] == 32009  # 13: <0x0A>
    assert tokenizer.convert_tokens_to_ids("▁<EOT>") == 32010
    assert tokenizer.decode(ids) == "<s> <PRE> a =  <SUF>\nb <MID>"  # the prefix's space, then the marker's
    # an empty prefix has no SentencePiece space to carry
    empty = format_fim(Prompt("", "x", False, "", "python"), fim_tokens(tokenizer.get_vocab()))
    assert tokenizer.convert_ids_to_tokens(tokenizer(empty)["input_ids"]) == ["<s>", "▁<PRE>", "▁<SUF>", "x", "▁<MID>"]


def test_the_markers_are_not_found_by_name_or_in_part():
    assert fim_tokens({"<PRE>", "<SUF>", "<MID>"}) is None  # CodeLlama's are SentencePiece pieces: ▁<PRE>
    assert fim_tokens({"▁<PRE>", "▁<SUF>"}) is None
    assert fim_tokens({"<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"}) == FIM_STYLES[2]
    # a style's end tokens that the vocabulary lacks are left out
    assert fim_end_ids(FIM_STYLES[1], {"<|fim_prefix|>": 5, "<|file_separator|>": 9}) == {9}
    assert fim_end_ids(FIM_STYLES[0], {"<fim_prefix>": 1}) == frozenset()


def test_healing_leaves_the_middle_marker_alone(family):
    """The server heals by default: it must not take back the marker the middle is written after, special
    token (StarCoder, CodeLlama) or not (Qwen2.5-Coder, CodeGemma, DeepSeek-Coder)."""
    _, tokenizer = family
    ids = tokenizer(format_fim(PROMPT, fim_tokens(tokenizer.get_vocab())), add_special_tokens=True)["input_ids"]
    assert heal(tokenizer, ids) == (ids, "")


def _save_end_writer(path, tokenizer, end: int):
    """A tiny Llama over the family's vocabulary that writes token `end` first, whatever the prompt."""
    model = always_writing(
        end, layers=1, max_pos=256, vocab=len(tokenizer), bos=tokenizer.bos_token_id, eos=tokenizer.eos_token_id
    )
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("writes", ["end", "marker"])
@pytest.mark.parametrize("name", FAMILIES)
def test_the_server_stops_at_the_end_of_the_middle(name, writes, tmp_path):
    """Loaded from a folder as the server loads it, the FIM style is found in the saved tokenizer; a completion
    from a model that first writes the family's end token, or one of its markers, is empty: decoding ended there,
    as at EOS, without the token in the text."""
    tokenizer = FAMILY_TOKENIZERS[name]()
    style = FIM_STYLES[STYLE[name]]
    token = END[name] if writes == "end" else style.prefix
    folder = _save_end_writer(tmp_path / name, tokenizer, tokenizer.convert_tokens_to_ids(token))
    options = ServerOptions(target=str(folder), draft="none", quantization="none", min_confidence=0, telemetry=False)
    engine = load_engine(options)
    assert engine.fim == style
    text = "def f(x):\n    return \n\nprint(f(1))\n"
    request = Request("end", text, "file:///work/end.py", "python", 1, 11, "invoked", time.perf_counter())
    completion = complete(engine, options, request, threading.Event())
    assert (completion.text, completion.event.generated_tokens, completion.event.finish_reason) == ("", 0, "eos")
