"""The protocol fuzzer: seeded streams of damaged LSP messages against `specdec serve` on a tiny model.

Each message starts as a valid one a client sends (completions, edits, settings, cancellations, commands,
unknown methods; never shutdown or exit) and is then damaged at random: its id, "jsonrpc", method,
params or any value inside them replaced by one of the wrong type or range, a message-like object
nested in its params, its JSON cut short or made invalid UTF-8. JSON-RPC 2.0 decides what must be answered:
a message with a valid id (string or integer) gets a response with that id; invalid JSON, and messages whose id is
not valid, get one with id null. Messages go in batches, and each batch waits for its answers.
Then the 16 bad `Content-Length` headers the issue lists, each followed by a valid request that must
be answered. Targets: no crash, no request left unanswered, no traceback in an answer, every response
with an `id` member (null where the request's could not be read), no internal error (-32603) answering an
undamaged request (a bad notification before it must not break it: didOpen re-opens the document the
completions ask about, damaged too), and no error popup but the rejected settings' (a completion that
fails on fuzzed document content, lone surrogates included, would show one).
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

from .check import CheckResult
from .wire import StdioServer, frame, initialize_params, save_tiny_model, wait_for_status

URI = "file:///fuzz/a%20b.py"
TEXT = "import os\n\ndef main(argv):\n    for name in argv:\n        print(name)\n\nclass Point:\n    x = 1\n"
BATCH = 25
ANSWER_TIMEOUT_S = 30.0

WEIRD_VALUES = [
    None, True, False, 0, -1, 2**31, 2**63, 1.5, float("inf"), "", "x" * 10000, "é\u2028\0", [], [1, "a"], {},
    {"jsonrpc": "2.0", "id": 7, "method": "exit"}, {"uri": 5}, -(2**40), "a\ud800", "\udc00b",
]  # fmt: skip
INTERNAL_ERROR = -32603
SETTINGS_POPUP = "specdec: some settings were rejected"  # the only popup a fuzzed message may earn


def _position(rng: random.Random) -> dict:
    return {"line": rng.choice([0, 1, 3, 7, 9, 100]), "character": rng.choice([0, 2, 4, 9, 500])}


def _valid(rng: random.Random, i: int, version: list[int]) -> dict:
    """A well-formed message a client might send."""
    doc = {"uri": URI}
    params: dict
    kind = rng.choice(["inline", "inline", "completion", "change", "cancel", "config", "accept", "open", "unknown"])
    if kind == "inline":
        params = {"textDocument": doc, "position": _position(rng), "context": {"triggerKind": rng.choice([1, 2])}}
        return {"jsonrpc": "2.0", "id": i, "method": "textDocument/inlineCompletion", "params": params}
    if kind == "completion":
        params = {"textDocument": doc, "position": _position(rng)}
        return {"jsonrpc": "2.0", "id": f"s{i}", "method": "textDocument/completion", "params": params}
    if kind == "change":
        version[0] += 1
        start = _position(rng)
        change = {"range": {"start": start, "end": start}, "text": rng.choice(["x", "\n", "    ", "()", "é"])}
        params = {"textDocument": {**doc, "version": version[0]}, "contentChanges": [change]}
        return {"jsonrpc": "2.0", "method": "textDocument/didChange", "params": params}
    if kind == "cancel":
        return {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": rng.randrange(max(i, 1))}}
    if kind == "config":
        key = rng.choice(["maxTokensSingleLine", "debounceMs", "temperature", "gamma", "enabledLanguages"])
        return {
            "jsonrpc": "2.0",
            "method": "workspace/didChangeConfiguration",
            "params": {"settings": {"specdec": {key: rng.choice(WEIRD_VALUES + [8, 0.0, "fixed:2"])}}},
        }
    if kind == "accept":
        params = {"command": "specdec.accept", "arguments": [rng.choice(["nope", 5, None])]}
        return {"jsonrpc": "2.0", "id": i, "method": "workspace/executeCommand", "params": params}
    if kind == "open":
        item = {"uri": f"file:///fuzz/{i}.rs", "languageId": "rust", "version": 1, "text": "fn main() {\n    "}
        if rng.random() < 0.5:  # the document the completions ask about: a damaged one must not poison it
            item = {"uri": URI, "languageId": "python", "version": version[0], "text": TEXT}
        return {"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": item}}
    return {
        "jsonrpc": "2.0",
        "id": i,
        "method": rng.choice(["foo/bar", "textDocument/hover", "initialize"]),
        "params": {},
    }


def _damage_value(rng: random.Random, value):
    """`value` with one leaf somewhere inside replaced by a weird one."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        if rng.random() < 0.2:
            return {k: v for k, v in value.items() if k != key}
        return {**value, key: _damage_value(rng, value[key])}
    if isinstance(value, list) and value and rng.random() < 0.7:
        j = rng.randrange(len(value))
        return [*value[:j], _damage_value(rng, value[j]), *value[j + 1 :]]
    return rng.choice(WEIRD_VALUES)


def _damage(rng: random.Random, message: dict, i: int) -> dict:
    message = dict(message)
    what = rng.choice(["id", "jsonrpc", "method", "params", "params", "params", "none"])
    if what == "id":
        message["id"] = rng.choice([{"a": 1}, [i], 1.5, True, None, f"s{i}", i])
    elif what == "jsonrpc":
        message["jsonrpc"] = rng.choice(["1.0", 2.0, None, ""])
    elif what == "method":
        if "id" in message and rng.random() < 0.5:
            message["method"] = rng.choice(["textDocument/didOpen", "initialized", "$/cancelRequest"])
        elif rng.random() < 0.5:
            message.pop("id", None)  # a request sent as a notification: nothing to answer
        else:
            message["method"] = rng.choice([5, None, ["x"]])
    elif what == "params":
        message["params"] = _damage_value(rng, message.get("params"))
    return message


def _expected(message) -> str:
    """'id' (a response with the message's id), 'null' (one with id null) or 'none', as JSON-RPC 2.0 says:
    a message whose id is unknown is answered with id null if it is no valid request or notification."""
    if not isinstance(message, dict):
        return "null"
    msg_id = message.get("id")
    valid_id = isinstance(msg_id, str) or (isinstance(msg_id, int) and not isinstance(msg_id, bool))
    if "id" in message:
        return "id" if valid_id else "null"
    if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        return "null"
    return "none"  # a notification, even a malformed one: nothing to answer


def _body(rng: random.Random, message) -> tuple[bytes, bool]:
    """The message's JSON, sometimes broken: returns (body, still valid JSON)."""
    body = json.dumps(message).encode()
    roll = rng.random()
    if roll < 0.04:
        return body[: rng.randrange(1, len(body))], False
    if roll < 0.06:
        return body[:-1] + b"\xff\xfe}", False
    if roll < 0.07:
        return b"[" * 100_000, False  # nesting deeper than any parser's stack
    if roll < 0.08:
        return json.dumps([message, message]).encode(), True  # a batch: LSP has none
    return body, True


BAD_FRAMES = {
    "non-numeric": b"Content-Length: abc\r\n\r\n{}",
    "negative": b"Content-Length: -5\r\n\r\n{}",
    "1e12": b"Content-Length: 1000000000000\r\n\r\n{}",
    "1e22": b"Content-Length: 99999999999999999999999\r\n\r\n{}",
    "exponent": b"Content-Length: 1e3\r\n\r\n{}",
    "short": b'Content-Length: 10\r\n\r\n{"jsonrpc": "2.0", "method": "initialized", "params": {}}',
    "long": b'Content-Length: 90\r\n\r\n{"jsonrpc": "2.0", "method": "initialized", "params": {}}',
    "lowercase name": b'content-length: 56\r\n\r\n{"jsonrpc": "2.0", "method": "initialized", "params": {}}',
    "LF-only": b'Content-Length: 56\n\n{"jsonrpc": "2.0", "method": "initialized", "params": {}}',
    "no length": b'Content-Type: application/json\r\n\r\n{"jsonrpc": "2.0"}',
    "garbage line": b"Hello there\r\n\r\n",
    "two lengths": b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "spaces": b'Content-Length:   56  \r\n\r\n{"jsonrpc": "2.0", "method": "initialized", "params": {}}',
    "invalid UTF-8": b"Content-Length: 4\r\n\r\n\xff\xfe\xfd\xfc",
    "empty body": b"Content-Length: 0\r\n\r\n",
    "200 KB header line": b"X-Padding: " + b"a" * 200_000 + b"\r\nContent-Length: 2\r\n\r\n{}",
}


def fuzz_messages(server: StdioServer, rng: random.Random, count: int, result: CheckResult) -> None:
    version = [1]
    expected_ids: list = []
    unanswered: list = []
    expected_null = 0
    undamaged_ids: list = []  # requests sent as _valid made them: no internal error may answer one
    for start in range(0, count, BATCH):
        batch_ids = []
        for i in range(start, min(count, start + BATCH)):
            valid = _valid(rng, 1000 + i, version)
            message = _damage(rng, valid, 1000 + i) if rng.random() < 0.7 else valid
            body, parses = _body(rng, message)
            kind = _expected(json.loads(body)) if parses else "null"
            if kind == "id":
                batch_ids.append(message["id"])
                if message == valid and body == json.dumps(valid).encode():
                    undamaged_ids.append(message["id"])
            expected_null += kind == "null"
            if not server.send(b"Content-Length: %d\r\n\r\n" % len(body) + body):
                break
        probe = f"probe{start}"
        server.send(frame({"jsonrpc": "2.0", "id": probe, "method": "textDocument/completion", "params": {
            "textDocument": {"uri": URI}, "position": {"line": 0, "character": 0}}}))  # fmt: skip
        batch_ids.append(probe)
        undamaged_ids.append(probe)
        expected_ids += batch_ids
        unanswered += server.inbox.wait_for(batch_ids, ANSWER_TIMEOUT_S)
        if not server.alive:
            result.notes.append(f"the server died after message {start + BATCH}: {list(server.stderr_tail)[-3:]}")
            break
    never = server.inbox.wait_for(unanswered, 5.0)  # late answers count as hangs above, but are not lost
    with_traceback = [r for r in server.inbox.responses.values() if "traceback" in json.dumps(r.get("error", {}))]
    without_id = [r for r in server.inbox.null_id if "id" not in r]  # JSON-RPC 2.0: id is in every response
    responses = server.inbox.responses
    internal = [i for i in undamaged_ids if responses.get(i, {}).get("error", {}).get("code") == INTERNAL_ERROR]
    result.metrics.update(
        messages=count,
        requests=len(expected_ids),
        answered_late_or_never=len(unanswered),
        never_answered=len(never),
        null_id_answers=len(server.inbox.null_id),
        null_id_expected=expected_null,
        answers_with_traceback=len(with_traceback),
        answers_without_id=len(without_id),
        undamaged_requests=len(undamaged_ids),
        internal_errors_on_undamaged=len(internal),
    )
    if unanswered:
        result.notes.append(f"unanswered ids (first 5): {sorted(map(str, unanswered))[:5]}")
    if without_id:
        result.notes.append(f"answers without id (first 3): {without_id[:3]}")
    if internal:
        result.notes.append(f"-32603 on undamaged requests (first 3): {[responses[i] for i in internal[:3]]}")


def fuzz_framing(server: StdioServer, result: CheckResult) -> None:
    deaf = []
    for name, data in BAD_FRAMES.items():
        probe = f"frame-{name}"
        server.send(data)
        server.send(frame({"jsonrpc": "2.0", "id": probe, "method": "foo/bar", "params": {}}))
        if server.inbox.wait_for([probe], 15.0) or not server.alive:
            deaf.append(name)
    result.metrics.update(bad_frames=len(BAD_FRAMES), bad_frames_next_request_unanswered=len(deaf))
    if deaf:
        result.notes.append(f"not served after: {deaf}")


def run(seed: int, full: bool, workdir: Path) -> CheckResult:
    result = CheckResult("fuzz", seed, full)
    model = save_tiny_model(workdir / "tiny-model")
    server = StdioServer()
    started = time.perf_counter()
    try:
        options = {"target": str(model), "draft": "ngram", "quantization": "none", "debounceMs": 0,
                   "telemetryPath": str(workdir / f"fuzz-{seed}.jsonl")}  # fmt: skip
        init = server.request("init", "initialize", initialize_params(options), timeout=120)
        server.notify("initialized", {})
        status = wait_for_status(server.inbox)
        if init is None or status is None or status.get("state") != "ready":
            result.notes.append(f"no ready server: {init} {status} {list(server.stderr_tail)[-3:]}")
        item = {"uri": URI, "languageId": "python", "version": 1, "text": TEXT}
        server.notify("textDocument/didOpen", {"textDocument": item})
        fuzz_messages(server, random.Random(seed), 10_000 if full else 600, result)
        fuzz_framing(server, result)
        alive = server.alive
    finally:
        popups = [
            n["params"].get("message", "")
            for n in server.inbox.notifications
            if n.get("method") == "window/showMessage"
        ]
        show_messages = len(popups)
        not_settings = [p for p in popups if not p.startswith(SETTINGS_POPUP)]
        code = server.stop()
    m = result.metrics
    m.update(
        seconds=round(time.perf_counter() - started, 1),
        crashed=not alive,
        exit_code=code,
        show_messages=show_messages,
        popups_not_about_settings=len(not_settings),
        completion_failures_logged=server.completion_failures,
        stderr_lines=server.stderr_lines,
        stderr_tracebacks=server.tracebacks,
    )
    result.target("crashes", int(not alive), "== 0", alive)
    result.target("exit code after shutdown and exit", code, "== 0", code == 0)
    result.target(
        "unanswered requests", m.get("answered_late_or_never", -1), "== 0", m.get("answered_late_or_never") == 0
    )
    result.target(
        "tracebacks in answers", m.get("answers_with_traceback", -1), "== 0", m.get("answers_with_traceback") == 0
    )
    result.target(
        "bad frames leaving the next request unanswered",
        m.get("bad_frames_next_request_unanswered", -1),
        "== 0",
        m.get("bad_frames_next_request_unanswered") == 0,
    )
    result.target(
        "id-null answers (parse errors, invalid requests)",
        f"{m.get('null_id_answers')} of {m.get('null_id_expected')}",
        "all",
        m.get("null_id_answers") == m.get("null_id_expected"),
    )
    result.target("responses without id", m.get("answers_without_id", -1), "== 0", m.get("answers_without_id") == 0)
    result.target(
        "internal errors (-32603) on undamaged requests",
        f"{m.get('internal_errors_on_undamaged')} of {m.get('undamaged_requests')}",
        "== 0",
        m.get("internal_errors_on_undamaged") == 0,
    )
    if not_settings:
        result.notes.append(f"popups not about settings (first 3): {not_settings[:3]}")
    result.target("popups not about rejected settings", len(not_settings), "== 0", not not_settings)
    result.target(
        "completion failures logged (each a popup but for the rate limit)",
        server.completion_failures,
        "== 0",
        server.completion_failures == 0,
    )
    # The server allows 3 in any 60 s: a run of 61-120 s may show 6, so count per started minute.
    per_minute = show_messages / math.ceil(max(m["seconds"], 1) / 60)
    result.target("error popups (showMessage) a minute", round(per_minute, 1), "<= 3", per_minute <= 3)
    return result
