"""stdin, read from the moment `specdec serve` starts.

A first start spends seconds importing what the server runs on before its event loop exists. Meanwhile a thread
reads stdin and holds what comes until the loop takes it (`attach`), and looks at the first message on the way:
`initialize`, whose settings name the model. `on_initialize` hears them at once, so that a first start can begin
converting that model (decoder/packaged.py, `convert_ahead`) beside the imports. This module imports nothing heavy:
it is started before the server's modules are imported.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable
from typing import BinaryIO

log = logging.getLogger(__name__)

Sink = Callable[[bytes | None], None]  # a chunk of stdin; None: its end
FIRST_FRAME_LIMIT = 1 << 20  # a first message larger than this is passed on without a look
_LENGTH = re.compile(rb"content-length:\s*(\d+)", re.IGNORECASE)


class EarlyStdin:
    """A thread copying `stream` to a sink, holding the chunks until one is attached. The first frame's
    `initializationOptions`, if it is an `initialize`, go to `on_initialize` before the frame is passed on;
    anything it cannot read there is left for the server's own framing to answer."""

    def __init__(self, stream: BinaryIO, on_initialize: Callable[[dict], None] | None = None):
        self.fd = stream.fileno()
        self.on_initialize = on_initialize
        self.first: bytes | None = b"" if on_initialize else None  # the first frame's bytes so far; None: done
        self.lock = threading.Lock()
        self.held: list[bytes | None] = []
        self.sink: Sink | None = None
        threading.Thread(target=self._read, name="specdec-stdin", daemon=True).start()

    def attach(self, sink: Sink) -> None:
        """From now on every chunk goes to `sink`, those held first, in order."""
        with self.lock:
            for chunk in self.held:
                sink(chunk)
            self.held.clear()
            self.sink = sink

    def _read(self) -> None:
        try:
            while data := os.read(self.fd, 65536):
                if self.first is not None:
                    self._look(data)
                self._pass(data)
        except OSError as e:  # stdin closed under it: the server sees its end, as at EOF
            log.warning("stdin: %s", e)
        finally:
            self._pass(None)

    def _look(self, data: bytes) -> None:
        try:
            self._look_at(data)
        except Exception as e:  # the server answers a bad message itself: here it is only not looked at
            self.first = None
            log.debug("the first message was not looked at: %s", e)

    def _pass(self, chunk: bytes | None) -> None:
        with self.lock:
            if self.sink is None:
                self.held.append(chunk)
                return
            sink = self.sink
        sink(chunk)  # only this thread passes chunks once attached, so their order holds

    def _look_at(self, data: bytes) -> None:
        first = (self.first or b"") + data
        header_end = first.find(b"\r\n\r\n")
        length = _LENGTH.search(first, 0, header_end) if header_end >= 0 else None
        if header_end < 0 or length is None:
            self.first = first if header_end < 0 and len(first) < FIRST_FRAME_LIMIT else None
            return
        body_end = header_end + 4 + int(length.group(1))
        if len(first) < body_end:
            self.first = first if body_end <= FIRST_FRAME_LIMIT else None
            return
        self.first = None
        message = json.loads(first[header_end + 4 : body_end])
        params = message.get("params") if isinstance(message, dict) else None
        if message.get("method") == "initialize" and isinstance(params, dict):
            options = params.get("initializationOptions")
            assert self.on_initialize is not None
            self.on_initialize(options if isinstance(options, dict) else {})
