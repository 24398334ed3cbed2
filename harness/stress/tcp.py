"""TCP mode against a second local client: `specdec serve --tcp` with one editor connected, then intruders.

The first client connects with the launch's token (server/transport.py) and opens a document. Then,
while it holds the session, connections try: no initialize first, no token, a wrong token, the right
token. Each must be refused and closed, must read nothing of the first client's session, and the first
client must still be answered with its settings unchanged. When it leaves, the next client with the token is
served with the models still loaded. The token file must be readable by its owner only.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path

from .check import CheckResult
from .wire import SERVER_COMMAND, FrameParser, frame, initialize_params, save_tiny_model

URI = "file:///tcp/main.py"


class Connection:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.parser = FrameParser()
        self.received: list[dict] = []
        self.closed = False

    def send(self, message) -> None:
        self.sock.sendall(frame(message))

    def read_until(self, done, timeout: float = 30.0) -> bool:
        """Read until done(self.received) or the server closes (or resets) or the time runs out; True if done."""
        deadline = time.monotonic() + timeout
        while not done(self.received):
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return False
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return False
            except ConnectionError:  # a reset: the server closed it while we wrote (what a refusal races with)
                data = b""
            if not data:
                self.closed = True
                return done(self.received)
            self.received += self.parser.feed(data)
        return True

    def response(self, msg_id, timeout: float = 30.0) -> dict | None:
        self.read_until(lambda got: any(m.get("id") == msg_id for m in got), timeout)
        return next((m for m in self.received if m.get("id") == msg_id), None)

    def close(self) -> None:
        self.sock.close()


def _start(model: Path, workdir: Path) -> tuple[subprocess.Popen, int, str, Path]:
    env = {**os.environ, "XDG_RUNTIME_DIR": str(workdir)}
    env.pop("SPECDEC_TOKEN", None)
    server = subprocess.Popen([*SERVER_COMMAND, "--tcp", "--port", "0"], stderr=subprocess.PIPE, env=env, text=True)
    assert server.stderr is not None
    for line in server.stderr:  # "specdec: listening on 127.0.0.1:PORT; ... the token in PATH as ..."
        if "listening on 127.0.0.1:" in line:
            port = int(line.split("127.0.0.1:")[1].split(";")[0])
            path = Path(line.split("the token in ")[1].split(" as ")[0])
            threading.Thread(target=server.stderr.read, daemon=True).start()  # a full pipe would block it
            return server, port, path.read_text().strip(), path
    raise RuntimeError("the TCP server did not start")


def _session(port: int, token: str, options: dict, workdir: Path) -> Connection:
    client = Connection(port)
    client.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                 "params": initialize_params({**options, "token": token})})  # fmt: skip
    if client.response(1) is None or "error" in (client.response(1) or {}):
        raise RuntimeError(f"the first client was not served: {client.received[-3:]}")
    client.send({"jsonrpc": "2.0", "method": "initialized", "params": {}})
    client.read_until(lambda got: any(m.get("params", {}).get("state") == "ready" for m in got), 120)
    return client


def _complete(client: Connection, msg_id) -> dict | None:
    params = {"textDocument": {"uri": URI}, "position": {"line": 1, "character": 4}, "context": {"triggerKind": 1}}
    client.send({"jsonrpc": "2.0", "id": msg_id, "method": "textDocument/inlineCompletion", "params": params})
    return client.response(msg_id, 60)


def run(seed: int, full: bool, workdir: Path) -> CheckResult:
    result = CheckResult("tcp", seed, full)
    model = save_tiny_model(workdir / "tiny-model")
    telemetry = workdir / "tcp-events.jsonl"
    options = {"target": str(model), "draft": "ngram", "quantization": "none", "telemetryPath": str(telemetry)}
    server, port, token, token_file = _start(model, workdir)
    m = result.metrics
    try:
        mode = stat.S_IMODE(token_file.stat().st_mode)
        m["token_file_mode"] = oct(mode)
        first = _session(port, token, options, workdir)
        first.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": URI, "languageId": "python", "version": 1, "text": "def main():\n    "}}})  # fmt: skip
        m["first_answered_before"] = _complete(first, 2) is not None

        stolen = workdir / "stolen.jsonl"
        intruders = {
            "no initialize": [{"jsonrpc": "2.0", "id": 1, "method": "workspace/didChangeConfiguration"}],
            "no token": [{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": initialize_params({})}],
            "wrong token": [
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": initialize_params({"token": token[:-1] + "x"}),
                }
            ],  # fmt: skip
            "right token": [
                {
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "initialize",
                    "params": initialize_params({"token": token, "telemetryPath": str(stolen)}),
                }
            ],  # fmt: skip
        }
        refused, leaked = 0, 0
        for name, messages in intruders.items():
            intruder = Connection(port)
            for message in messages:
                intruder.send(message)
            settings = {"settings": {"specdec": {"telemetryPath": str(stolen), "maxTokensSingleLine": 1}}}
            try:
                intruder.send({"jsonrpc": "2.0", "method": "workspace/didChangeConfiguration", "params": settings})
            except OSError:
                pass  # already closed on it
            _complete(first, f"during-{name}")  # the first client's session makes notifications meanwhile
            intruder.read_until(lambda got: False, timeout=3)  # all it gets, until the server closes it
            errors = [r for r in intruder.received if "error" in r]
            others = [r for r in intruder.received if "error" not in r]
            refused += intruder.closed and len(errors) == 1
            leaked += len(others)
            if others or not intruder.closed:
                result.notes.append(f"{name}: closed={intruder.closed}, received {intruder.received[:3]}")
            intruder.close()
        m["intruders"], m["intruders_refused"], m["messages_leaked_to_intruders"] = len(intruders), refused, leaked
        after = _complete(first, 3)
        m["first_answered_after"] = after is not None and "error" not in after
        m["telemetry_path_changed"] = stolen.exists()
        first.send({"jsonrpc": "2.0", "id": 4, "method": "shutdown"})  # a client that leaves without exit
        first.response(4)
        first.close()
        time.sleep(0.5)
        began = time.perf_counter()
        second = _session(port, token, options, workdir)
        m["next_client_ready_s"] = round(time.perf_counter() - began, 2)
        second.send({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
            "uri": URI, "languageId": "python", "version": 1, "text": "def main():\n    "}}})  # fmt: skip
        m["next_client_served"] = _complete(second, 2) is not None
        second.close()
        m["server_alive"] = server.poll() is None
    finally:
        server.kill()
        server.wait()
    result.target("token file mode", m.get("token_file_mode"), "0o600", m.get("token_file_mode") == "0o600")
    result.target("intruders refused and closed", f"{refused} of {len(intruders)}", "all", refused == len(intruders))
    result.target("messages an intruder read", leaked, "== 0", leaked == 0)
    result.target("an intruder changed telemetryPath", m.get("telemetry_path_changed"), "no", not stolen.exists())
    result.target(
        "first client answered throughout",
        m.get("first_answered_before") and m.get("first_answered_after"),
        "yes",
        bool(m.get("first_answered_before") and m.get("first_answered_after")),
    )
    result.target("next client served", m.get("next_client_served"), "yes", bool(m.get("next_client_served")))
    return result
