"""LSP's base protocol read by us, not by pygls: frames off the wire, and JSON-RPC 2.0 checks on each message.

pygls' reader left requests unanswered or the server deaf or dead on malformed input: invalid JSON went
unanswered, a lowercase or non-numeric `Content-Length` made it skip every later message, a huge one made
it exit, and nested objects that looked like messages were parsed as messages. Here:

- Framing is lenient where it is unambiguous (header names in any case, LF or CRLF line ends) and
  recovers where it is not: a bad header block is answered with a parse error and reading resumes at the
  next `Content-Length` header, even one glued to the end of the garbage before it. A body that does not
  parse but holds a header is cut there: its `Content-Length` was too long and the next message follows.
- Every message is checked before pygls sees it (`check`): each request gets an answer, a JSON-RPC
  error if it is not a well-formed request, and nothing is answered that was not a request.

Nothing here knows pygls or the server; server/transport.py wires it up.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from typing import Any

from lsprotocol import types

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SERVER_NOT_INITIALIZED = -32002

MAX_BODY_BYTES = 64 * 1024 * 1024  # far above any document the server completes (ServerOptions.max_document_chars)
MAX_LINE_BYTES = 64 * 1024  # a header line longer than this is garbage
BODY_IDLE_S = 5.0  # a body that stops arriving this long before its Content-Length is cut off
_HEADER = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)


@dataclass
class FramingError:
    """A header block or body that is not a frame; answered with a parse error (id null)."""

    reason: str


class Frames:
    """Bodies of the frames read from `source` (an asyncio.StreamReader), or FramingError for each bad one."""

    def __init__(self, source: asyncio.StreamReader):
        self.source = source
        self.buffer = bytearray()
        self.eof = False
        self.after_error = False  # the last frame was bad: bytes up to the next header belong to it

    async def next(self) -> bytes | FramingError | None:
        """The next body, a FramingError, or None at the end of the stream."""
        length: int | None = None
        problem = ""
        seen = False  # any header line in this block
        while True:
            line = await self._line()
            if line is None:
                return None
            if line is _TOO_LONG:
                problem, seen = problem or "a header line over 64 KiB", True
                continue
            stripped = line.rstrip(b"\r\n")
            if not stripped:
                if seen:
                    break
                continue  # blank lines between messages
            found = _HEADER.search(stripped)
            if found and (found.start() > 0 or problem):
                # a header after bytes that are no frame: a new frame starts at it
                self.buffer[:0] = stripped[found.start() :] + b"\n"
                if self.after_error:  # the rest of a frame already answered: drop it quietly
                    length, problem, seen = None, "", False
                    continue
                return self._error(problem or f"bytes outside a frame: {bytes(stripped[:40])!r}")
            seen = True
            name, colon, value = stripped.partition(b":")
            if not colon:
                problem = problem or f"not a header line: {bytes(stripped[:40])!r}"
            elif name.strip().lower() == b"content-length":
                text = value.strip()
                if not text.isdigit():
                    problem = f"Content-Length is not a number: {bytes(text[:40])!r}"
                elif int(text) > MAX_BODY_BYTES:
                    problem = f"Content-Length {int(text)} is over the limit of {MAX_BODY_BYTES} bytes"
                elif length is not None and length != int(text):
                    problem = "two different Content-Length headers"
                else:
                    length = int(text)
        if problem or length is None:
            return self._error(problem or "no Content-Length header")
        return await self._body(length)

    def _error(self, reason: str) -> FramingError:
        self.after_error = True
        return FramingError(reason)

    async def _line(self):
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0:
                line = bytes(self.buffer[: end + 1])
                del self.buffer[: end + 1]
                return line
            if len(self.buffer) > MAX_LINE_BYTES:
                del self.buffer[: len(self.buffer) - 64]  # keep the tail: a header may start in it
                return _TOO_LONG
            if self.eof:
                return None
            await self._fill()

    async def _body(self, length: int) -> bytes:
        while len(self.buffer) < length and not self.eof:
            try:
                await asyncio.wait_for(self._fill(), BODY_IDLE_S)
            except TimeoutError:
                break
        # Short of its Content-Length when the bytes stop: the body is what came (its parse decides).
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        self.after_error = False
        return body

    def split_bad_body(self, body: bytes) -> bytes:
        """A body that is not a message: a header inside it starts the next frame (its Content-Length
        was too long), so read on from there. Returns what comes before that header."""
        self.after_error = True
        found = _HEADER.search(body)
        if found is None:
            return body
        self.buffer[:0] = body[found.start() :]
        return body[: found.start()]

    async def _fill(self) -> None:
        data = await self.source.read(65536)
        if data:
            self.buffer += data
        else:
            self.eof = True


_TOO_LONG = object()


@dataclass
class Reply:
    """An error to send back instead of handing a message on. id None: JSON null."""

    id: str | int | None
    code: int
    message: str

    def payload(self) -> dict:
        """The response as JSON-RPC 2.0 writes it: `id` always there, null when the request's was unreadable.
        (lsprotocol's converter drops members that are None, so pygls would send no `id` at all.)"""
        return {"jsonrpc": "2.0", "id": self.id, "error": {"code": self.code, "message": self.message}}


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def is_notification(method: str) -> bool:
    """Whether LSP defines `method` as a notification (takes no id, gets no answer)."""
    entry = types.METHOD_TO_TYPES.get(method)
    return entry is not None and entry[0].__name__.endswith("Notification")


def parse(body: bytes) -> Any | Reply:
    """The JSON value of a body, or the parse error to answer."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        return Reply(None, PARSE_ERROR, f"Parse error: {str(e)[:200]}")


def check(message: Any) -> dict | Reply | None:
    """`message` if it is a well-formed JSON-RPC 2.0 request, notification or response; else the error to
    answer (a Reply), or None for a malformed message that must not be answered (a response or notification)."""
    if isinstance(message, list):
        return Reply(None, INVALID_REQUEST, "Invalid Request: batches are not part of LSP")
    if not isinstance(message, dict):
        return Reply(None, INVALID_REQUEST, "Invalid Request: a message is a JSON object")
    has_id = "id" in message
    msg_id = message.get("id")
    if has_id and not _valid_id(msg_id):
        return Reply(None, INVALID_REQUEST, "Invalid Request: an id is a string or an integer")
    answer_to = msg_id if has_id else None
    method = message.get("method")
    if message.get("jsonrpc") != "2.0":
        if "method" not in message and has_id and ("result" in message or "error" in message):
            return None  # a malformed response to one of the server's requests: nobody to answer
        return Reply(answer_to, INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    if "method" not in message:
        if has_id and ("result" in message or "error" in message):
            return message  # a response to one of the server's requests
        return Reply(answer_to, INVALID_REQUEST, "Invalid Request: no method")
    if not isinstance(method, str):
        return Reply(answer_to, INVALID_REQUEST, "Invalid Request: the method is a string")
    params = message.get("params")
    if params is not None and not isinstance(params, (dict, list)):  # null: clients send it for "no params"
        if has_id:
            return Reply(msg_id, INVALID_PARAMS, f"Invalid params: {method} params are an object or an array")
        return None
    if has_id and is_notification(method):
        return Reply(msg_id, INVALID_REQUEST, f"Invalid Request: {method} is a notification and takes no id")
    return message
