"""The packaged models' tokenizers, read straight from tokenizer.json (decoder/models.py::_plain_tokenizer), are
the tokenizers AutoTokenizer loads: the same class, ids, special tokens, vocabulary and text back."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from speccomplete.decoder import models, packaged

pytestmark = pytest.mark.integration

TEXTS = [
    Path(models.__file__).read_text(encoding="utf-8")[:6000],
    'fn main() {\n\tlet s = "ünïcode 日本語 ✓";\r\n}\n\n\n',
    "<bos>def f():<eos>  <pad>\n    return 1",
]


@pytest.mark.parametrize("alias", sorted(packaged.PACKAGED))
def test_the_plain_tokenizer_is_autotokenizers(alias):
    if importlib.util.find_spec(packaged.PACKAGED[alias].module) is None:
        pytest.skip(f"{alias} needs its package")
    folder = Path(models.resolve(alias))
    plain, reference = models._plain_tokenizer(folder), AutoTokenizer.from_pretrained(str(folder))
    assert plain is not None and type(plain) is type(reference)
    for text in TEXTS:
        ids = reference(text)["input_ids"]
        assert plain(text)["input_ids"] == ids
        assert (
            plain(text, add_special_tokens=False)["input_ids"] == reference(text, add_special_tokens=False)["input_ids"]
        )
        assert plain.decode(ids) == reference.decode(ids)
    assert plain.get_vocab() == reference.get_vocab()
    assert plain.all_special_ids == reference.all_special_ids
    assert plain.chat_template == reference.chat_template
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "padding_side", "model_max_length"):
        assert getattr(plain, name) == getattr(reference, name), name


def test_a_tokenizer_with_options_of_its_own_goes_through_autotokenizer(tmp_path):
    """A config with anything but special tokens and plain settings (here Llama's `legacy`) is not read the plain
    way: its class's own loading handles it."""
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "LlamaTokenizer", "legacy": false}')
    assert models._plain_tokenizer(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>"}')
    assert models._plain_tokenizer(tmp_path) is None  # an unreadable tokenizer.json: AutoTokenizer says why
