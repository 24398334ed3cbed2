"""server/documents.py: the server's copy of a document splits lines as LSP does, so incremental edits
land where the editor made them."""

from lsprotocol import types
from pygls.workspace import Workspace

from speccomplete.server.documents import lsp_lines, use_lsp_lines


def test_lsp_lines_keep_terminators_and_ignore_other_breaks():
    assert lsp_lines("a\r\nb\rc\nd\x0ce\u2028f") == ["a\r\n", "b\r", "c\n", "d\x0ce\u2028f"]
    assert lsp_lines("x\n") == ["x\n"] and lsp_lines("") == []


def _edit(text: str, line: int, character: int, insert: str, lsp: bool) -> str:
    workspace = Workspace(None, types.TextDocumentSyncKind.Incremental)
    if lsp:
        use_lsp_lines(workspace)
    workspace.put_text_document(types.TextDocumentItem("file:///a.py", "python", 1, text))
    document = workspace.get_text_document("file:///a.py")
    at = types.Position(line, character)
    document.apply_change(types.TextDocumentContentChangePartial(range=types.Range(at, at), text=insert))
    return document.source


def test_an_edit_after_a_u2028_or_form_feed_lands_on_the_editors_line():
    text = "s = 'a\u2028b'\nx = \x0c1\ny = 2\n"
    assert _edit(text, 2, 0, "z", lsp=True) == "s = 'a\u2028b'\nx = \x0c1\nzy = 2\n"
    assert _edit(text, 2, 0, "z", lsp=False) != "s = 'a\u2028b'\nx = \x0c1\nzy = 2\n"  # pygls' own split drifts
