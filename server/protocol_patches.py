"""pygls' LSP protocol, patched where it leaves a client without an answer or shows it a traceback.

server/transport.py feeds it checked messages; server/lsp.py's server runs on it.
"""

from __future__ import annotations

import logging

from lsprotocol import types
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.protocol import LanguageServerProtocol, lsp_method

from .jsonrpc import INTERNAL_ERROR, INVALID_REQUEST, SERVER_NOT_INITIALIZED, Reply

log = logging.getLogger(__name__)


class AnsweredError(JsonRpcInvalidParams):
    """A malformed request that has already been answered with an error."""


class Protocol(LanguageServerProtocol):
    """pygls' LSP protocol, fed checked messages by server/transport.py, answering every request.

    `receive` adds what pygls leaves out: requests before `initialize`, a second `initialize` and requests
    after `shutdown` get LSP's errors instead of silence, and no error sent to the client carries a
    traceback (the log has it)."""

    initialized = False  # this session has received its initialize request

    def reply(self, reply: Reply) -> None:
        self._send_data(reply.payload())

    def receive(self, message: dict) -> None:
        method, msg_id = message.get("method"), message.get("id")
        is_request = "id" in message and "method" in message
        refusal = self.refusal(method)
        if refusal is not None:
            if is_request:
                self.reply(Reply(msg_id, *refusal))
            else:
                log.warning("dropping %s: %s", method, refusal[1])
            return
        if is_request and method == types.INITIALIZE:
            self.initialized = True
        try:
            structured = self.structure_message(message)
        except AnsweredError:
            return
        except JsonRpcException as e:  # a notification pygls cannot read; nobody to answer
            log.warning("dropping a malformed %s: %s", method, e.__cause__ or e)
            return
        try:
            self.handle_message(structured)
        except Exception as e:  # pygls fails on some values it let through (a dict as $/cancelRequest's id)
            log.exception("could not handle %s", method)
            if is_request:
                self.reply(Reply(msg_id, INTERNAL_ERROR, f"internal error: {type(e).__name__}"))

    def refusal(self, method) -> tuple[int, str] | None:
        """Why a message with `method` is not handled now (LSP's error code and message), or None.
        Responses to the server's own requests (no method) are always handled."""
        if method is None or method == types.EXIT:
            return None
        if method == types.INITIALIZE and self.initialized:
            return INVALID_REQUEST, "initialize was already received"
        if not self.initialized and method != types.INITIALIZE:
            return SERVER_NOT_INITIALIZED, "the server is not initialized"
        if self._shutdown:
            return INVALID_REQUEST, "the server is shutting down"
        return None

    def end_session(self) -> None:
        """Forget the session (its client left): the next client starts with initialize."""
        for future in self._request_futures.values():
            future.cancel()
        self._request_futures.clear()
        self._workspace = None
        self._shutdown = False
        self.initialized = False
        self.writer = None

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams):
        # server/positions.py counts UTF-16 code units, LSP's default; never negotiate UTF-8 or UTF-32.
        general = params.capabilities.general
        if general is not None and general.position_encodings:
            general.position_encodings = [types.PositionEncodingKind.Utf16]
        return (yield from super().lsp_initialize(params))

    def structure_message(self, data):
        try:
            return super().structure_message(data)
        except JsonRpcException as e:
            # pygls logs a request it cannot parse and never answers it, so the client would wait forever.
            if "id" in data and "method" in data:
                detail = str(e.__cause__ or e)[:300]
                error = JsonRpcInvalidParams(f"malformed {data['method']} params: {detail}")
                self._send_response(data["id"], error=error.to_response_error())
                raise AnsweredError(error.message) from e
            raise

    def _send_response(self, msg_id, result=None, error=None):
        if error is not None and error.data is not None:
            log.error("error answered to request %s: %s %s", msg_id, error.message, error.data)
            error = types.ResponseError(error.code, error.message)  # a traceback is for the log, not the client
        if error is not None and msg_id is None:  # pygls would drop the null id (Reply.payload says why)
            self._send_data(Reply(None, error.code, error.message).payload())
            return
        super()._send_response(msg_id, result, error)
