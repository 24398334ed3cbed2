"""A stand-in language server for neovim_logic_test.lua: fast and predictable where the real one is neither.

Over stdio, it answers `initialize`, keeps each document's text (full sync), and answers
`textDocument/inlineCompletion` after $FAKE_LSP_DELAY_MS with one item per candidate below that
starts with what the cursor's line holds after its indentation (the candidate's rest, as the real
server's typed-along reuse does). Where the line holds only closing brackets and quotes after the
cursor and a candidate's rest retypes them, its item's range covers them (server/closers.py's
contract). Before each answer it sends `specdec/completed` with the outcome and, for an empty answer,
a reason: "finished-line" where the line already holds a whole candidate, else "no-text".
`$/cancelRequest` makes a request answer RequestCancelled. Every message received is appended to
$FAKE_LSP_LOG as a JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import threading

CANDIDATES = ["return foo(a)\n    # done", "return 2", 'print("hi", a)  # done']
CLOSERS = ")]}\"'`"
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


def retypes(text: str, closers: str) -> bool:
    first_line = iter(text.split("\n", 1)[0])
    return all(ch in first_line for ch in closers)


def items_at(uri: str, position: dict) -> list[dict]:
    line = documents.get(uri, "").split("\n")[position["line"]]
    typed = line[: position["character"]].lstrip(" ")
    rest = line[position["character"] :].rstrip(" ")
    closers = rest if rest and all(ch in CLOSERS for ch in rest) else ""  # ASCII: characters are UTF-16 units
    items = []
    for n, candidate in enumerate(CANDIDATES):
        text = candidate[len(typed) :]
        if not candidate.startswith(typed) or not text:
            continue
        replaced = len(closers) if closers and retypes(text, closers) else 0
        end = {"line": position["line"], "character": position["character"] + replaced}
        items.append(
            {
                "insertText": text,
                "range": {"start": position, "end": end},
                "command": {"title": "accept", "command": "specdec.accept", "arguments": [f"{n}:{typed}"]},
            }
        )
    return items


def empty_reason(uri: str, position: dict) -> str:
    line = documents.get(uri, "").split("\n")[position["line"]]
    return "finished-line" if line[: position["character"]].strip() in CANDIDATES else "no-text"


def answer_later(msg_id, uri, result_fn, reason_fn) -> None:
    def answer():
        result = None if msg_id in cancelled else result_fn()
        outcome = "cancelled" if result is None else "shown" if result["items"] else "empty"
        reason = {"cancelled": "cancelled", "shown": None}.get(outcome) or reason_fn()
        completed = {"uri": uri, "requestId": str(msg_id), "outcome": outcome, "latencyMs": 0, "reason": reason}
        send({"method": "specdec/completed", "params": completed})
        if result is None:
            send({"id": msg_id, "error": {"code": -32800, "message": "cancelled"}})
        else:
            send({"id": msg_id, "result": result})

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
            uri, position = params["textDocument"]["uri"], params["position"]
            items = items_at(uri, position)  # the text as asked about
            reason = empty_reason(uri, position)
            answer_later(msg_id, uri, lambda items=items: {"items": items}, lambda reason=reason: reason)
        elif method == "$/cancelRequest":
            cancelled.add(params["id"])
        elif method == "exit":
            return
        elif msg_id is not None:  # shutdown, executeCommand, completion, ...
            send({"id": msg_id, "result": None})


if __name__ == "__main__":
    main()
