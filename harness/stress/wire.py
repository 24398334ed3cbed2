"""Raw LSP on the wire, for the checks that send what no well-behaved client would: `specdec serve` as a
subprocess, bytes written as given, and every frame it sends back recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from ..tiny_gguf import bytes_to_unicode

SERVER_COMMAND = [sys.executable, "-m", "speccomplete", "serve"]


def tiny_llama_config(
    vocab: int = 258,
    layers: int = 2,
    hidden: int = 32,
    init: float = 0.02,
    max_pos: int = 4096,
    eos: int | None = 257,
    bos: int | None = 256,
):
    """The tiny Llama's config, its one definition (tests/helpers/tiny_models.py builds its tiny_llama from
    it): 4 heads over 2 key-value heads, an MLP twice the hidden width. The defaults are save_tiny_model's:
    the byte vocabulary (token i is byte i, then <s> and </s>)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_pos,
        bos_token_id=bos,
        eos_token_id=eos,
        pad_token_id=None,
        initializer_range=init,
    )


def save_tiny_model(path: Path, seed: int = 0) -> Path:
    """A random two-layer Llama (tiny_llama_config) with a byte-level tokenizer (token i is byte i, then <s>
    and </s>), as tests/helpers/lsp.py's save_random_model builds it: garbage completions, but it loads in a
    second."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    config = tiny_llama_config()
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    spelled = bytes_to_unicode()
    tokenizer = Tokenizer(models.BPE(vocab={spelled[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>").save_pretrained(path)
    return path


def frame(message) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class FrameParser:
    """Splits what the server writes into JSON messages (the server frames correctly)."""

    def __init__(self):
        self.buffer = b""

    def feed(self, data: bytes) -> list[dict]:
        self.buffer += data
        out = []
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            headers = self.buffer[:end].decode("ascii", "replace").split("\r\n")
            length = next(int(h.split(":", 1)[1]) for h in headers if h.lower().startswith("content-length"))
            if len(self.buffer) < end + 4 + length:
                break
            out.append(json.loads(self.buffer[end + 4 : end + 4 + length]))
            self.buffer = self.buffer[end + 4 + length :]
        return out


class Inbox:
    """What the server sent: responses by id (null ids in a list) and notifications, in arrival order."""

    def __init__(self):
        self.lock = threading.Condition()
        self.responses: dict = {}  # id -> response
        self.null_id: list[dict] = []
        self.notifications: list[dict] = []

    def add(self, message: dict) -> None:
        with self.lock:
            if "method" in message:
                self.notifications.append(message)
            elif message.get("id") is None:
                self.null_id.append(message)
            else:
                self.responses[message["id"]] = message
            self.lock.notify_all()

    def wait_for(self, ids, timeout: float) -> set:
        """Wait until every id in `ids` has a response; returns those still missing."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while missing := {i for i in ids if i not in self.responses}:
                left = deadline - time.monotonic()
                if left <= 0:
                    return missing
                self.lock.wait(left)
        return set()


class StdioServer:
    """`specdec serve` over pipes, its stdout parsed on a thread and its stderr kept (last lines and counts)."""

    def __init__(self, env: dict | None = None):
        self.process = subprocess.Popen(
            SERVER_COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, **(env or {})},
        )
        self.inbox = Inbox()
        self.stderr_lines = 0
        self.tracebacks = 0
        self.completion_failures = 0  # server/completion.py logs each; the user sees one as a popup
        self.stderr_tail: deque[str] = deque(maxlen=20)
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()

    def _read_stdout(self) -> None:
        parser = FrameParser()
        assert self.process.stdout is not None
        while data := os.read(self.process.stdout.fileno(), 65536):
            for message in parser.feed(data):
                self.inbox.add(message)

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            line = raw.decode(errors="replace").rstrip()
            self.stderr_lines += 1
            self.tracebacks += line.startswith("Traceback")
            self.completion_failures += line.endswith(
                ": completion failed"
            )  # log.exception's line; its traceback follows
            self.stderr_tail.append(line)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def send(self, data: bytes) -> bool:
        """Write raw bytes; False if the server is gone."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(data)
            self.process.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def request(self, msg_id, method: str, params, timeout: float = 30.0) -> dict | None:
        self.send(frame({"jsonrpc": "2.0", "id": msg_id, "method": method, "params": params}))
        self.inbox.wait_for([msg_id], timeout)
        return self.inbox.responses.get(msg_id)

    def notify(self, method: str, params) -> None:
        self.send(frame({"jsonrpc": "2.0", "method": method, "params": params}))

    def stop(self) -> int | None:
        """Shut down politely, then kill; returns the exit code."""
        if self.alive:
            self.request("stop-shutdown", "shutdown", None, timeout=10)
            self.notify("exit", None)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process.wait()
        return self.process.returncode


def initialize_params(options: dict) -> dict:
    return {"processId": os.getpid(), "capabilities": {}, "initializationOptions": options}


def wait_for_status(inbox: Inbox, states=("ready", "error"), timeout: float = 120.0) -> dict | None:
    deadline = time.monotonic() + timeout
    with inbox.lock:
        while True:
            for note in inbox.notifications:
                if note.get("method") == "specdec/status" and note["params"].get("state") in states:
                    return note["params"]
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            inbox.lock.wait(left)
