"""Any OpenAI-compatible `/v1/completions` server: llama-server, vLLM, Ollama, TGI.

The request streams (server-sent events); closing the connection is how a stop on the syntax
predicate or a cancellation reaches the server, which then aborts the request. Counts come from
the final usage chunk (`stream_options.include_usage`). llama-server adds its `timings` (prefill,
draft_n, draft_n_accepted); other servers (vLLM) report no per-request draft counts, and the stats
say so.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
import urllib.parse
from typing import Any

from ..engine import DecodeOptions, Generation
from ..stats import GenerationStats
from .text_stop import TextStop, finish_reason


class OpenAIError(RuntimeError):
    """The server answered with an error, or not in the completions format."""


class OpenAICompletionsDecoder:
    def __init__(self, url: str, model: str | None = None, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60):
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"expected an http(s) URL such as http://127.0.0.1:8080/v1, got {url!r}")
        self.host: str = parsed.hostname
        self.url = url.rstrip("/")
        self.parsed = parsed
        self.model = model
        self.api_key = os.environ.get(api_key_env) or None
        self.timeout_s = timeout_s

    @property
    def label(self) -> str:
        return f"{self.model or 'default model'} at {self.url}"

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.parsed.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.parsed.port, timeout=self.timeout_s)

    def generate(self, prompt: str | list[int], options: DecodeOptions) -> Generation:
        if options.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {options.max_new_tokens}")
        start = time.perf_counter()
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": options.max_new_tokens,
            "temperature": options.sampling.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.model:
            body["model"] = self.model
        if any(options.stop_strings):
            body["stop"] = [s for s in options.stop_strings if s]
        if options.seed is not None:
            body["seed"] = options.seed
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"

        stop = TextStop(options)
        stats = GenerationStats()
        final: dict[str, Any] = {}
        reason: str | None = None
        connection = self._connection()
        done = threading.Event()
        if options.cancel is not None:
            threading.Thread(target=_close_on_cancel, args=(connection, options.cancel, done), daemon=True).start()
        try:
            connection.request("POST", self.parsed.path.rstrip("/") + "/completions", json.dumps(body), headers)
            response = connection.getresponse()
            if response.status != 200:
                raise OpenAIError(f"{self.url}: HTTP {response.status}: {response.read(2000).decode(errors='replace')}")
            for chunk in _events(response):
                if "error" in chunk:
                    raise OpenAIError(f"{self.url}: {chunk['error']}")
                if chunk.get("usage"):
                    final = chunk
                choices = chunk.get("choices") or []
                if not choices:
                    continue
                reason = choices[0].get("finish_reason") or reason
                piece = choices[0].get("text") or ""
                if piece and not stats.ttft_ms:
                    stats.ttft_ms = _ms(start)
                if stop.add(piece):
                    break  # closing the connection below aborts the request on the server
        except (OSError, http.client.HTTPException) as e:
            if options.cancel is None or not options.cancel.is_set():
                raise OpenAIError(f"cannot reach {self.url}: {e}") from e
            stop.finish = "cancelled"  # _close_on_cancel shut the socket under a blocking read
        finally:
            done.set()
            connection.close()
        if stop.finish is None and options.cancel is not None and options.cancel.is_set():
            stop.finish = "cancelled"  # the shut socket read as the end of the stream
        text = stop.close()
        finish = stop.finish or finish_reason(reason, options)
        _fill_stats(stats, final)
        stats.finish_reason = finish
        stats.total_ms = _ms(start)
        return Generation(text, [], finish, stats)


def _close_on_cancel(connection: http.client.HTTPConnection, cancel, done: threading.Event) -> None:
    """Shut the socket when the request is cancelled, even while the server is still prefilling and
    nothing has arrived to check `cancel` between."""
    while not done.wait(0.02):
        if cancel.is_set():
            if connection.sock is not None:
                try:
                    connection.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            return


def _events(response: http.client.HTTPResponse):
    """The JSON payloads of a server-sent event stream, up to `[DONE]`."""
    for raw in response:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except json.JSONDecodeError as e:
            raise OpenAIError(f"not a completions stream: {data[:200]!r}") from e


def _fill_stats(stats: GenerationStats, final: dict) -> None:
    usage = final.get("usage") or {}
    timings = final.get("timings") or {}  # llama-server only
    stats.prompt_tokens = int(usage.get("prompt_tokens", 0))
    stats.prompt_reused_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    stats.new_tokens = int(usage.get("completion_tokens", 0))
    stats.prefill_ms = float(timings.get("prompt_ms", 0.0))
    if "draft_n" in timings:
        stats.draft_counts = "totals"
        stats.drafted = int(timings["draft_n"])
        stats.accepted = int(timings.get("draft_n_accepted", 0))
    else:
        stats.draft_counts = "unreported"


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
