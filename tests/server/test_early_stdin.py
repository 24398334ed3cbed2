"""stdin read from `specdec serve`'s start (server/early_stdin.py): every byte reaches the server, in order, whenever
it attaches; the first message's settings are heard as soon as it is whole, and only if it is an `initialize`."""

from __future__ import annotations

import json
import os
import queue
import threading

import pytest

from speccomplete.server.early_stdin import EarlyStdin


def frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


INITIALIZE = frame(
    {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"initializationOptions": {"target": "x"}}}
)
INITIALIZED = frame({"jsonrpc": "2.0", "method": "initialized", "params": {}})


class Pipe:
    """An os.pipe whose read end an EarlyStdin reads; `write` sends bytes, `close` ends the stream."""

    def __init__(self):
        self.read_fd, self.write_fd = os.pipe()
        self.reader = os.fdopen(self.read_fd, "rb", buffering=0)

    def write(self, data: bytes) -> None:
        os.write(self.write_fd, data)

    def close(self) -> None:
        os.close(self.write_fd)


def received(sink_queue: queue.Queue) -> bytes:
    """Everything the sink got, up to the end of the stream."""
    chunks = []
    while (chunk := sink_queue.get(timeout=10)) is not None:
        chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("split", [None, 5, 30, len(INITIALIZE) - 1])
def test_the_first_initialize_is_heard_at_once_and_every_byte_is_passed_on_in_order(split):
    pipe, heard, sink = Pipe(), queue.Queue(), queue.Queue()
    stdin = EarlyStdin(pipe.reader, on_initialize=heard.put)
    parts = [INITIALIZE] if split is None else [INITIALIZE[:split], INITIALIZE[split:]]
    for part in parts:  # the frame may come in pieces
        pipe.write(part)
    assert heard.get(timeout=10) == {"target": "x"}  # before anything is attached: while the server imports
    stdin.attach(sink.put)
    pipe.write(INITIALIZED + b"garbage")
    pipe.close()
    assert received(sink) == INITIALIZE + INITIALIZED + b"garbage"
    assert heard.empty()  # the first message only


@pytest.mark.parametrize(
    "first",
    [
        INITIALIZED,  # not an initialize
        b"Content-Length: 5\r\n\r\n{nope",  # not JSON: the server's framing answers it
        frame({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": []}),  # params not an object
        b"Content-Type: x\r\n\r\n{}",  # no length
    ],
)
def test_a_first_message_that_is_not_a_readable_initialize_is_passed_on_unheard(first):
    pipe, heard, sink = Pipe(), [], queue.Queue()
    stdin = EarlyStdin(pipe.reader, on_initialize=heard.append)
    stdin.attach(sink.put)
    pipe.write(first + INITIALIZE)
    pipe.close()
    assert received(sink) == first + INITIALIZE
    assert heard == []


def test_settings_that_are_not_an_object_are_heard_as_none_set():
    pipe, heard, sink = Pipe(), queue.Queue(), queue.Queue()
    stdin = EarlyStdin(pipe.reader, on_initialize=heard.put)
    message = frame({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"initializationOptions": 3}})
    pipe.write(message)
    assert heard.get(timeout=10) == {}
    stdin.attach(sink.put)
    pipe.close()
    assert received(sink) == message


def test_a_failing_listener_loses_no_bytes():
    pipe, sink, called = Pipe(), queue.Queue(), threading.Event()

    def listener(settings: dict) -> None:
        called.set()
        raise RuntimeError("no")

    stdin = EarlyStdin(pipe.reader, on_initialize=listener)
    pipe.write(INITIALIZE)
    pipe.close()
    assert called.wait(10)
    stdin.attach(sink.put)
    assert received(sink) == INITIALIZE


def test_a_length_past_reading_is_passed_on_unheard():
    pipe, heard, sink = Pipe(), [], queue.Queue()
    stdin = EarlyStdin(pipe.reader, on_initialize=heard.append)
    huge = b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n{}"  # int() refuses so many digits
    pipe.write(huge + INITIALIZE)
    pipe.close()
    stdin.attach(sink.put)
    assert received(sink) == huge + INITIALIZE and heard == []
