"""Open documents with LSP's lines: only "\\r\\n", "\\r" and "\\n" end a line.

pygls splits a document with `str.splitlines`, which also breaks lines at form feeds, U+0085, U+2028,
U+2029 and a few control characters. An incremental edit's line number then points at another line than
the editor's, and the server's copy of the document silently drifts from the editor's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pygls.workspace import TextDocument, Workspace

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def lsp_lines(text: str) -> list[str]:
    """`text` split after each LSP line terminator, the terminators kept (as `splitlines(True)` would)."""
    return _LINE.findall(text)


class LspTextDocument(TextDocument):
    @property
    def lines(self) -> Sequence[str]:
        return tuple(lsp_lines(self.source))


class LspWorkspace(Workspace):
    def _create_text_document(self, doc_uri, source=None, version=None, language_id=None) -> TextDocument:
        return LspTextDocument(
            doc_uri,
            source=source,
            version=version,
            language_id=language_id,
            sync_kind=self._sync_kind,
            position_codec=self._position_codec,
        )


def use_lsp_lines(workspace: Workspace) -> None:
    """Make a pygls workspace (made by pygls at `initialize`) file its documents with LSP's lines."""
    workspace.__class__ = LspWorkspace
