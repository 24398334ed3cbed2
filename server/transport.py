"""How messages reach the server: stdio, or TCP on loopback for one authenticated client at a time.

Both read frames with server/jsonrpc.py and hand each checked message to the protocol
(server/protocol_patches.py's `Protocol.receive`); every malformed one is answered there, not dropped.

TCP: any local user can reach a loopback port, so a connection must open with `initialize` carrying
`initializationOptions.token`, the token of this launch: `$SPECDEC_TOKEN` when the client that starts the
server sets it, else a random one written to a file only the user can read (`token_path`). Only one
client holds the session: another connection is refused while it does, so nobody else can read its
notifications or change its settings (`telemetryPath` is a file the server writes). When the client
leaves, the server forgets its documents, keeps its models and waits for the next one.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Protocol as TypingProtocol

from lsprotocol import types

from .early_stdin import EarlyStdin
from .jsonrpc import INVALID_REQUEST, PARSE_ERROR, Frames, FramingError, Reply, check, parse

log = logging.getLogger(__name__)

TOKEN_ENV = "SPECDEC_TOKEN"
AUTH_TIMEOUT_S = 10.0  # a connection that has not sent its initialize by then is closed


class Receiver(TypingProtocol):
    """What the transport hands messages to: server/protocol_patches.py's Protocol."""

    def reply(self, reply: Reply) -> None: ...

    def receive(self, message: dict) -> None: ...


def deliver(receiver: Receiver, frames: Frames, frame: bytes | FramingError) -> None:
    """Answer a bad frame or message, or pass the message on; never raises (it would end the session)."""
    try:
        _deliver(receiver, frames, frame)
    except Exception:
        log.exception("could not handle a message")


def _deliver(receiver: Receiver, frames: Frames, frame: bytes | FramingError) -> None:
    if isinstance(frame, FramingError):
        log.warning("framing error: %s", frame.reason)
        receiver.reply(Reply(None, PARSE_ERROR, f"Parse error: {frame.reason}"))
        return
    value = parse(frame)
    if isinstance(value, Reply):
        head = frames.split_bad_body(frame)
        if len(head) < len(frame):  # the next frame began inside: what came before it may be whole
            value = parse(head)
    if isinstance(value, Reply):
        log.warning("unparsable message: %s", value.message)
        receiver.reply(value)
        return
    checked = check(value)
    if checked is None:
        log.warning("dropping a malformed notification or response")
    elif isinstance(checked, Reply):
        log.warning("malformed message: %s", checked.message)
        receiver.reply(checked)
    else:
        receiver.receive(checked)


def encode(payload: dict) -> bytes:
    body = json.dumps(payload).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


# ---------------------------------------------------------------------------------------------- stdio


async def _serve_stdio(receiver: Receiver, stdin: EarlyStdin) -> None:
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()

    def sink(chunk: bytes | None) -> None:  # from stdin's thread: works for pipes, files and consoles everywhere
        if chunk is None:
            loop.call_soon_threadsafe(reader.feed_eof)
        else:
            loop.call_soon_threadsafe(reader.feed_data, chunk)

    stdin.attach(sink)
    frames = Frames(reader)
    while (frame := await frames.next()) is not None:
        deliver(receiver, frames, frame)


def serve_stdio(receiver: Receiver, stdin: EarlyStdin | None = None) -> None:
    """Serve the messages on stdin; `stdin`: the reader started before the server's imports, if one was."""
    asyncio.run(_serve_stdio(receiver, stdin or EarlyStdin(sys.stdin.buffer)))


# ------------------------------------------------------------------------------------------------ TCP


def token_path(port: int) -> Path:
    """Where the launch's token is written: $XDG_RUNTIME_DIR/specdec, else ~/.cache/specdec, per port."""
    base = os.environ.get("XDG_RUNTIME_DIR") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specdec" / f"tcp-{port}.token"


def write_token(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        path.unlink()  # a file or link left there by anyone else is not written through
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def presented_token(message: dict) -> str | None:
    params = message.get("params")
    options = params.get("initializationOptions") if isinstance(params, dict) else None
    token = options.get("token") if isinstance(options, dict) else None
    return token if isinstance(token, str) else None


class Session(TypingProtocol):
    """What TCP needs of the server beyond the Receiver: to take a connection's writer and to end a session."""

    def attach(self, writer) -> None: ...

    def detach(self) -> None: ...


class TcpServer:
    def __init__(self, receiver: Receiver, session: Session, token: str):
        self.receiver, self.session, self.token = receiver, session, token
        self.busy = False

    async def refuse(self, writer: asyncio.StreamWriter, msg_id, code: int, message: str) -> None:
        log.warning("refusing a TCP connection: %s", message)
        writer.write(encode({"jsonrpc": "2.0", "id": msg_id, "error": {"code": code, "message": message}}))
        try:
            await writer.drain()
        finally:
            writer.close()

    async def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = Frames(reader)
        try:
            first = await asyncio.wait_for(frames.next(), AUTH_TIMEOUT_S)
        except TimeoutError:
            writer.close()
            return
        if first is None:
            writer.close()
            return
        message = check(parse(first)) if not isinstance(first, FramingError) else None
        if not isinstance(message, dict) or message.get("method") != types.INITIALIZE or "id" not in message:
            msg_id = message.get("id") if isinstance(message, dict) else None
            await self.refuse(writer, msg_id, INVALID_REQUEST, "the first message must be initialize")
            return
        token = presented_token(message)
        if token is None or not hmac.compare_digest(token.encode(), self.token.encode()):
            await self.refuse(writer, message["id"], INVALID_REQUEST, "initializationOptions.token is missing or wrong")
            return
        if self.busy:
            await self.refuse(writer, message["id"], INVALID_REQUEST, "another client holds this server's session")
            return
        self.busy = True
        log.info("TCP client connected")
        try:
            self.session.attach(writer)
            deliver(self.receiver, frames, first)
            while (frame := await frames.next()) is not None:
                deliver(self.receiver, frames, frame)
        finally:
            log.info("TCP client left; waiting for the next one")
            self.session.detach()
            self.busy = False
            writer.close()


def serve_tcp(receiver: Receiver, session: Session, port: int) -> None:
    """Listen on 127.0.0.1:port (0: any free port); the port and where the token is go to stderr."""

    async def main() -> None:
        token = os.environ.get(TOKEN_ENV) or secrets.token_urlsafe(32)
        listener = await asyncio.start_server(TcpServer(receiver, session, token).connection, "127.0.0.1", port)
        bound = listener.sockets[0].getsockname()[1]  # never another interface: completions are source code
        where = f"${TOKEN_ENV}"
        if not os.environ.get(TOKEN_ENV):
            path = token_path(bound)
            write_token(path, token)
            where = str(path)
        print(
            f"specdec: listening on 127.0.0.1:{bound}; a client sends the token in {where} as "
            "initializationOptions.token",
            file=sys.stderr,
            flush=True,
        )
        async with listener:
            await listener.serve_forever()

    asyncio.run(main())
