"""Open documents with LSP's lines: only "\\r\\n", "\\r" and "\\n" end a line, and only checked contents.

pygls splits a document with `str.splitlines`, which also breaks lines at form feeds, U+0085, U+2028,
U+2029 and a few control characters. An incremental edit's line number then points at another line than
the editor's, and the server's copy of the document silently drifts from the editor's.

didOpen and didChange are notifications: nothing can answer a bad one, so what they carry is checked
here, as it arrives, and one bad message never breaks the document's later requests:
- a `languageId` that is not a string (lsprotocol lets any JSON value through) is logged and dropped:
  the document opens and its language comes from its path, as for an unknown id;
- text with lone UTF-16 surrogates (JSON's "\\ud800" escapes) is not text the tokenizer can encode; each
  becomes U+FFFD, one UTF-16 code unit like the surrogate, so the editor's positions still fit.

A request's URI becomes its document key (`document_key`) once, where it enters: the server's tables are
kept by that key.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from urllib.parse import unquote, urlparse

import attrs
from lsprotocol import types
from pygls.workspace import TextDocument, Workspace

log = logging.getLogger(__name__)

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins valid pairs: any left is alone


def valid_text(text: str) -> str:
    """`text` with each lone surrogate replaced by U+FFFD: encodable as UTF-8, and as long in UTF-16."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def document_key(uri: str) -> str:
    """The key of the document at `uri`, for every table the server keeps by document. pygls files documents
    under their unquoted URIs, so a percent-encoded one (spaces, non-ASCII names, `file:///c%3A/...`) is
    unquoted."""
    return unquote(uri)


def path_of(uri: str) -> str:
    """The file path in a URI: for language detection, and snippets name it in the prompt (so it is made
    valid text: a lone surrogate in it would fail the tokenizer)."""
    return valid_text(unquote(urlparse(uri).path))


def lsp_lines(text: str) -> list[str]:
    """`text` split after each LSP line terminator, the terminators kept (as `splitlines(True)` would)."""
    return _LINE.findall(text)


class LspTextDocument(TextDocument):
    @property
    def lines(self) -> Sequence[str]:
        return tuple(lsp_lines(self.source))


class LspWorkspace(Workspace):
    def put_text_document(self, text_document: types.TextDocumentItem, notebook_uri: str | None = None):
        language_id = text_document.language_id
        if language_id is not None and not isinstance(language_id, str):
            log.warning(
                "didOpen %s: languageId %.40r is not a string; dropped, the path decides the language",
                text_document.uri,
                language_id,
            )
            language_id = None
        text = _checked_text(text_document.uri, text_document.text)
        if language_id is not text_document.language_id or text is not text_document.text:
            text_document = attrs.evolve(text_document, language_id=language_id, text=text)
        super().put_text_document(text_document, notebook_uri)

    def update_text_document(
        self, text_doc: types.VersionedTextDocumentIdentifier, change: types.TextDocumentContentChangeEvent
    ):
        text = _checked_text(text_doc.uri, change.text)
        if text is not change.text:
            change = attrs.evolve(change, text=text)
        super().update_text_document(text_doc, change)

    def _create_text_document(self, doc_uri, source=None, version=None, language_id=None) -> TextDocument:
        return LspTextDocument(
            doc_uri,
            source=source,
            version=version,
            language_id=language_id,
            sync_kind=self._sync_kind,
            position_codec=self._position_codec,
        )


def _checked_text(uri: str, text: str) -> str:
    valid = valid_text(text)
    if valid != text:
        log.warning("%s: lone UTF-16 surrogates in the text sent; each is read as U+FFFD", uri)
        return valid
    return text


def use_lsp_lines(workspace: Workspace) -> None:
    """Make a pygls workspace (made by pygls at `initialize`) file its documents with LSP's lines."""
    workspace.__class__ = LspWorkspace
