"""Framing and JSON-RPC checks (server/jsonrpc.py): what bytes become, and what each bad message is answered."""

from __future__ import annotations

import asyncio
import json

import pytest

from speccomplete.server.jsonrpc import (
    INVALID_PARAMS,
    INVALID_REQUEST,
    PARSE_ERROR,
    Frames,
    FramingError,
    Reply,
    check,
    parse,
)

PROBE = {"jsonrpc": "2.0", "id": 7, "method": "shutdown"}


def framed(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def read_all(data: bytes, chunk: int = 7) -> list:
    """Every frame `Frames` reads from `data`, fed in small pieces (a header may arrive split)."""

    async def go():
        reader = asyncio.StreamReader()
        for i in range(0, len(data), chunk):
            reader.feed_data(data[i : i + chunk])
        reader.feed_eof()
        frames = Frames(reader)
        out = []
        while (frame := await frames.next()) is not None:
            if isinstance(frame, bytes) and isinstance(parse(frame), Reply):
                head = frames.split_bad_body(frame)  # as server/transport.py does
                frame = head if head != frame and not isinstance(parse(head), Reply) else FramingError("bad body")
            out.append(frame if isinstance(frame, FramingError) else json.loads(frame))
        return out

    return asyncio.run(go())


@pytest.mark.parametrize(
    "bad",
    [
        b"Content-Length: abc\r\n\r\n{}",
        b"Content-Length: -5\r\n\r\n{}",
        b"Content-Length: 1000000000000\r\n\r\n{}",
        b"Content-Length: 1e3\r\n\r\n{}",
        b"Content-Type: application/json\r\n\r\n{}",
        b"Hello\r\n\r\n",
        b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        b'Content-Length: 10\r\n\r\n{"jsonrpc": "2.0", "method": "initialized"}',
        b"X-Padding: " + b"a" * 200_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
    ],
)
def test_a_bad_frame_is_one_error_and_the_next_message_is_read(bad):
    frames = read_all(bad + framed(PROBE))
    assert isinstance(frames[0], FramingError)
    assert frames[-1] == PROBE, "reading resumed at the next header"
    assert sum(isinstance(f, FramingError) for f in frames) == 1, f"one error for the bad frame: {frames}"


@pytest.mark.parametrize(
    "header",
    [b"content-length: %d\r\n\r\n", b"Content-Length: %d\n\n", b"Content-Length:   %d  \r\nContent-Type: x\r\n\r\n"],
)
def test_lenient_headers_are_read(header):
    body = json.dumps(PROBE).encode()
    assert read_all(header % len(body) + body + framed(PROBE)) == [PROBE, PROBE]


def test_a_too_long_content_length_loses_neither_message():
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "shutdown"}).encode()
    frames = read_all(b"Content-Length: %d\r\n\r\n" % (len(body) + 30) + body + framed(PROBE))
    assert frames == [json.loads(body), PROBE]


@pytest.mark.parametrize(
    "message, code, answer_id",
    [
        ([PROBE, PROBE], INVALID_REQUEST, None),  # a batch
        ("hello", INVALID_REQUEST, None),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "shutdown"}, INVALID_REQUEST, None),
        ({"jsonrpc": "2.0", "id": True, "method": "shutdown"}, INVALID_REQUEST, None),
        ({"jsonrpc": "1.0", "id": 3, "method": "shutdown"}, INVALID_REQUEST, 3),
        ({"foo": "boo"}, INVALID_REQUEST, None),
        ({"jsonrpc": "2.0", "method": 1, "params": "bar"}, INVALID_REQUEST, None),
        ({"jsonrpc": "2.0", "id": 4, "method": "textDocument/didOpen", "params": {}}, INVALID_REQUEST, 4),
        ({"jsonrpc": "2.0", "id": "x", "method": "textDocument/completion", "params": 5}, INVALID_PARAMS, "x"),
    ],
)
def test_malformed_messages_are_answered_as_json_rpc_says(message, code, answer_id):
    reply = check(message)
    assert isinstance(reply, Reply) and reply.code == code and reply.id == answer_id


def test_invalid_json_is_a_parse_error():
    for body in (b"{not json", b"\xff\xfe", b"[" * 100_000):
        reply = parse(body)
        assert isinstance(reply, Reply) and reply.code == PARSE_ERROR and reply.id is None


def test_well_formed_messages_pass_and_broken_notifications_are_not_answered():
    request = {"jsonrpc": "2.0", "id": 1, "method": "textDocument/completion", "params": {}}
    response = {"jsonrpc": "2.0", "id": "srv-1", "result": None}
    assert check(request) is request and check(response) is response
    no_params = {"jsonrpc": "2.0", "id": 2, "method": "shutdown", "params": None}
    assert check(no_params) is no_params, "clients send null params for shutdown and exit"
    assert check({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": 5}) is None
    assert check({"jsonrpc": "1.0", "id": 9, "result": 1}) is None, "a broken response has nobody to answer"
