"""A stand-in language server for neovim_logic_test.lua: fast and predictable where the real one is neither.

Over stdio, it answers `initialize`, keeps each document's text (full sync), and answers
`textDocument/inlineCompletion` after $FAKE_LSP_DELAY_MS with one item per candidate below that
starts with what the cursor's line holds after its indentation (the candidate's rest, as the real
server's typed-along reuse does). `$/cancelRequest` makes a request answer RequestCancelled. Every
message received is appended to $FAKE_LSP_LOG as a JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import threading

CANDIDATES = ["return foo(a)\n    # done", "return 2"]
DELAY_S = int(os.environ.get("FAKE_LSP_DELAY_MS", "0")) / 1000
LOG = os.environ.get("FAKE_LSP_LOG")

documents: dict[str, str] = {}
cancelled: set = set()
lock = threading.Lock()


def read() -> dict | None:
    length = None
    while True:
        line = sys.stdin.buffer.readline()
        if not line:
            return None
        line = line.strip()
        if not line:
            break
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return json.loads(sys.stdin.buffer.read(length))


def send(message: dict) -> None:
    body = json.dumps({"jsonrpc": "2.0", **message}).encode()
    with lock:
        sys.stdout.buffer.write(b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        sys.stdout.buffer.flush()


def items_at(uri: str, position: dict) -> list[dict]:
    line = documents.get(uri, "").split("\n")[position["line"]]
    typed = line[: position["character"]].lstrip(" ")
    return [
        {
            "insertText": candidate[len(typed) :],
            "range": {"start": position, "end": position},
            "command": {"title": "accept", "command": "specdec.accept", "arguments": [f"{n}:{typed}"]},
        }
        for n, candidate in enumerate(CANDIDATES)
        if candidate.startswith(typed) and len(candidate) > len(typed)
    ]


def answer_later(msg_id, result_fn) -> None:
    def answer():
        if msg_id in cancelled:
            send({"id": msg_id, "error": {"code": -32800, "message": "cancelled"}})
        else:
            send({"id": msg_id, "result": result_fn()})

    threading.Timer(DELAY_S, answer).start()


def main() -> None:
    while (message := read()) is not None:
        if LOG:
            with open(LOG, "a") as f:
                f.write(json.dumps(message) + "\n")
        method, msg_id, params = message.get("method"), message.get("id"), message.get("params") or {}
        if method == "initialize":
            capabilities = {
                "textDocumentSync": 1,
                "inlineCompletionProvider": True,
                "completionProvider": {},
                "executeCommandProvider": {"commands": ["specdec.accept"]},
            }
            send({"id": msg_id, "result": {"capabilities": capabilities}})
        elif method == "textDocument/didOpen":
            documents[params["textDocument"]["uri"]] = params["textDocument"]["text"]
        elif method == "textDocument/didChange":
            documents[params["textDocument"]["uri"]] = params["contentChanges"][-1]["text"]
        elif method == "textDocument/inlineCompletion":
            items = items_at(params["textDocument"]["uri"], params["position"])  # the text as asked about
            answer_later(msg_id, lambda items=items: {"items": items})
        elif method == "$/cancelRequest":
            cancelled.add(params["id"])
        elif method == "exit":
            return
        elif msg_id is not None:  # shutdown, executeCommand, completion, ...
            send({"id": msg_id, "result": None})


if __name__ == "__main__":
    main()
