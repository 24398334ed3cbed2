import pytest

from speccomplete.server.language import UNKNOWN, detect_language
from speccomplete.server.positions import PositionError, offset_at, utf16_len


@pytest.mark.parametrize(
    "path, language_id, text, expected",
    [
        ("a.py", None, "", "python"),
        ("a.txt", "python", "", "python"),  # languageId wins over the extension
        ("lib.rs", None, "", "rust"),
        ("x.HPP", None, "", "cpp"),
        ("m.ml", None, "", "ocaml"),
        ("build.zig", None, "", "zig"),
        ("mix.exs", None, "", "elixir"),
        ("Main.hs", None, "", "haskell"),
        ("init.lua", None, "", "lua"),
        ("app.ts", None, "", "typescript"),
        ("script", None, "#!/usr/bin/env python3\nprint(1)\n", "python"),
        ("script", None, "#!/usr/bin/ruby -w\n", "ruby"),
        ("script", None, "#!/bin/sh\n", "bash"),
        ("notes.xyz", "plaintext", "hello", UNKNOWN),
        ("", None, "", UNKNOWN),
        ("x.cpp", "c++", "", "cpp"),
    ],
)
def test_detect_language(path, language_id, text, expected):
    assert detect_language(path, language_id, text) == expected


def test_offset_at_counts_utf16_units():
    text = "a🙂b\nxyz"
    assert offset_at(text, 0, 0) == 0
    assert offset_at(text, 0, 1) == 1
    assert offset_at(text, 0, 3) == 2  # the emoji is two UTF-16 units and one code point
    assert offset_at(text, 0, 4) == 3  # end of line 0
    assert offset_at(text, 1, 3) == len(text)
    assert utf16_len("a🙂b") == 4


@pytest.mark.parametrize("line, character", [(2, 0), (0, 5), (-1, 0), (1, 4)])
def test_offset_at_rejects_positions_past_the_end(line, character):
    with pytest.raises(PositionError):
        offset_at("a🙂b\nxyz", line, character)
