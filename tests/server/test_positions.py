"""server/positions.py: LSP positions (UTF-16 code units) to string offsets."""

import pytest

from speccomplete.server.positions import PositionError, offset_at, utf16_len


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


def test_only_lsp_line_terminators_end_a_line():
    """\\r\\n, \\r and \\n end a line; a form feed, U+0085 or U+2028 inside a line does not."""
    text = "a\r\nb\rc\nd\x0ce\x85f\u2028g"
    assert [offset_at(text, line, 0) for line in range(4)] == [0, 3, 5, 7]
    assert offset_at(text, 3, 7) == len(text)
    with pytest.raises(PositionError, match="4-line"):
        offset_at(text, 4, 0)
