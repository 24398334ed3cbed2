"""llama.cpp in-process, from the xllamacpp wheel: a GGUF decoded by llama.cpp's own server loop.

One slot, so the prompt cache carries over between requests (`cache_prompt`): an editor asks about
the same file again and again, and only what changed is prefilled. Its speculation is llama.cpp's
own (`speculative`: an n-gram method), set when the model loads.

Stop strings go to llama.cpp, which cuts at them and ends the request normally, so its final
timings (prefill, draft_n, draft_n_accepted) arrive. The syntax predicate and cancellation can only
close the stream from our side; llama.cpp then cancels the task, and the draft totals of that
request are lost (the event says "unreported").
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import struct
import time
from pathlib import Path
from typing import Any

from ..engine import DecodeOptions, Generation
from ..stats import GenerationStats
from .text_stop import TextStop, finish_reason

log = logging.getLogger(__name__)

# llama.cpp's speculative methods that need no second model, by the names its CLI gives them
SPECULATIVE = ("none", "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")


class LlamaCppError(RuntimeError):
    """llama.cpp refused a request (e.g. a prompt longer than its context)."""


class LlamaCppDecoder:
    """`generate` is batch-1 and not thread-safe, like SpeculativeDecoder's."""

    def __init__(
        self,
        gguf: str | Path,
        *,
        speculative: str = "none",
        threads: int = 0,
        context: int = 8192,
        cache_prompt: bool = True,  # False: every request prefills from scratch (a benchmark's cold runs)
    ):
        import xllamacpp

        if speculative not in SPECULATIVE:
            raise ValueError(f"llama.cpp speculative method must be one of {SPECULATIVE}, got {speculative!r}")
        if not Path(gguf).is_file():
            raise FileNotFoundError(f"no GGUF file at {gguf}")
        self.gguf = str(gguf)
        self.speculative = speculative
        self.threads = threads or len(os.sched_getaffinity(0))
        self.cache_prompt = cache_prompt
        params = xllamacpp.CommonParams()
        params.model.path = self.gguf
        params.n_ctx = context
        params.n_parallel = 1  # one slot: its cache is the previous request's prompt
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        if speculative != "none":
            kind = "COMMON_SPECULATIVE_TYPE_" + speculative.upper().replace("-", "_")
            params.speculative.types = [getattr(xllamacpp.common_speculative_type, kind)]
        self.server = xllamacpp.Server(params)  # its HTTP side listens on a loopback port (listening_address)
        _never_destroyed(self.server)

    @property
    def label(self) -> str:
        return f"llama.cpp {Path(self.gguf).name}, speculative {self.speculative}"

    def generate(self, prompt: str | list[int], options: DecodeOptions) -> Generation:
        if options.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {options.max_new_tokens}")
        start = time.perf_counter()
        request: dict[str, Any] = {
            "prompt": prompt,  # text, or token ids as our tokenizer made them
            "max_tokens": options.max_new_tokens,
            "stop": [s for s in options.stop_strings if s],
            "stream": True,
            "cache_prompt": self.cache_prompt,
            "timings_per_token": True,  # prompt counts in every chunk, so a stream we close still has them
            **_sampling(options),
        }
        stop = TextStop(options)
        stats = GenerationStats()
        last: dict[str, Any] = {}
        errors: list[str] = []

        def on_chunk(chunk: dict) -> bool:
            if "choices" not in chunk:  # an error object
                errors.append(str(chunk.get("message") or chunk.get("error") or chunk))
                return True
            last.clear()
            last.update(chunk)
            piece = chunk["choices"][0].get("text") or ""
            if piece and not stats.ttft_ms:
                stats.ttft_ms = _ms(start)
            return stop.add(piece)

        self.server.handle_completions(request, on_chunk)
        if errors:
            raise LlamaCppError(errors[0])
        text = stop.close()
        finish = stop.finish or finish_reason((last.get("choices") or [{}])[0].get("finish_reason"), options)
        _fill_stats(stats, last, finish_seen=stop.finish is None, speculative=self.speculative != "none")
        stats.finish_reason = finish
        stats.total_ms = _ms(start)
        return Generation(text, [], finish, stats)


def _never_destroyed(server) -> None:
    """Keep `server` alive until the process exits. xllamacpp's Server destructor can wait forever for its
    loop thread: the second Server destroyed in a process hung in ~Server (std::thread::join) in each of
    several tries, and so did a test that made and dropped one. A server reloaded with new settings therefore
    keeps the old llama.cpp context's memory; the process's exit frees it, and destroys nothing."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(server))


class GGUFVocabulary:
    """`token in vocabulary` for a GGUF's token list, without decoding its (for Gemma 262k) strings.

    GGUF stores each string as a little-endian uint64 length and its bytes, so a token is in the
    file's token list where that exact record occurs: one C-speed search of the mapped file.
    """

    def __init__(self, gguf: str | Path):
        with open(gguf, "rb") as f:
            self.data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def __contains__(self, token: object) -> bool:
        if not isinstance(token, str):
            return False
        raw = token.encode()
        return self.data.find(struct.pack("<Q", len(raw)) + raw) >= 0


def _sampling(options: DecodeOptions) -> dict[str, Any]:
    params = options.sampling
    if params.temperature <= 0:
        return {"temperature": 0.0}
    # plain temperature sampling, as ours: llama.cpp's default top-k/top-p/min-p cut the tail
    out: dict[str, Any] = {"temperature": params.temperature, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
    if options.seed is not None:
        out["seed"] = options.seed
    return out


def _fill_stats(stats: GenerationStats, last: dict, *, finish_seen: bool, speculative: bool) -> None:
    timings = last.get("timings") or {}
    cached = int(timings.get("cache_n", 0))
    stats.prompt_tokens = cached + int(timings.get("prompt_n", 0))
    stats.prompt_reused_tokens = cached
    stats.prefill_ms = float(timings.get("prompt_ms", 0.0))
    stats.new_tokens = int(timings.get("predicted_n", 0))
    if not speculative:
        stats.draft_counts = "totals"  # none drafted: the zeros are the real totals
    elif finish_seen:
        stats.draft_counts = "totals"
        stats.drafted = int(timings.get("draft_n", 0))
        stats.accepted = int(timings.get("draft_n_accepted", 0))
    else:
        stats.draft_counts = "unreported"  # we closed the stream: the final totals never came


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1000
