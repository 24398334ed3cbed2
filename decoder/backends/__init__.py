"""Decode backends: what turns a prompt into a completion behind the server's pipeline.

Every backend has the decoder's contract (`generate(prompt, DecodeOptions) -> Generation`, see
decoder/engine.py): it streams, stops on the stop strings and on `stop_when`, honours `cancel`, and
fills `GenerationStats` with what it can measure. The server picks one by its `backend` option:

    local     our speculative decoder (decoder/engine.py)
    llamacpp  llama.cpp in-process from the xllamacpp wheel, on a GGUF, with its own speculation (llamacpp.py)
    openai    any OpenAI-compatible /v1/completions server: llama-server, vLLM, Ollama, TGI (openai_compatible.py)

The external ones import their engines lazily, so the local path never loads them.
"""

from __future__ import annotations

from typing import Protocol

from ..engine import DecodeOptions, Generation

BACKENDS = ("local", "llamacpp", "openai")


class TextDecoder(Protocol):
    def generate(self, prompt: str, options: DecodeOptions) -> Generation: ...
