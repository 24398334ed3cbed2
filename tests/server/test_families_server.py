"""A target and a smaller draft of each decoder family, given to the real language server as folder paths
(the `target` and `draft` settings), with a tokenizer laid out like the family's code model's: each inline
completion comes back, and it is what the same pipeline shows with the target alone decoding greedily (greedy
speculative decoding writes the target's own tokens).

The draft is the target's first layers with their weights disturbed. Random models agree on few tokens, so
some families' drafts are turned down at every position: there the check is that greedy decoding corrects every
rejected draft to the target's own token. One server per family; each loads two tiny models in a second or two.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.lsp import SERVER_COMMAND, close_document, inline, latest_event, make_client, open_document, wait_for_state
from helpers.tiny_models import FAMILY_BUILDERS, noisy_copy, tiny_llama
from helpers.tokenizers import FAMILY_TOKENIZERS, make_byte_tokenizer
from lsprotocol import types
from pytest_lsp import ClientServerConfig, client_capabilities

from speccomplete.server.completion import Request, complete, load_engine
from speccomplete.server.options import parse_options
from speccomplete.server.prompt import fim_tokens

LAYERS = 3  # the target's; its draft has one fewer
INIT = 0.2  # wider than HF's default, so a random model's next token depends on its context and varies


@dataclass(frozen=True)
class Pair:
    build: Callable  # (seed, vocab size, begin id, end id) -> a tiny random target
    tokenizer: Callable  # () -> the family's tokenizer; its FIM markers, if any, decide the prompt


def _from_builder(name: str) -> Callable:
    def build(seed: int, vocab: int, bos: int | None, eos: int | None):
        return FAMILY_BUILDERS[name](
            seed=seed,
            vocab_size=vocab,
            bos_token_id=bos,
            eos_token_id=eos,
            num_hidden_layers=LAYERS,
            initializer_range=INIT,
        )

    return build


def _llama(seed: int, vocab: int, bos: int | None, eos: int | None):
    return tiny_llama(seed=seed, vocab=vocab, layers=LAYERS, bos=bos, eos=eos, init=INIT)


# Each family with the tokenizer of its code model: Qwen2.5-Coder's for Qwen2 and Qwen3 (which keeps its FIM
# tokens), CodeGemma's for Gemma and Gemma 2, StarCoder2's, and for Llama both CodeLlama's and DeepSeek-Coder's
# (both Llama models). Mistral has no FIM tokens: the prompt is the prefix alone.
PAIRS = {
    "qwen2": Pair(_from_builder("qwen2"), FAMILY_TOKENIZERS["qwen-coder"]),
    "qwen3": Pair(_from_builder("qwen3"), FAMILY_TOKENIZERS["qwen-coder"]),
    "mistral": Pair(_from_builder("mistral"), make_byte_tokenizer),
    "gemma": Pair(_from_builder("gemma"), FAMILY_TOKENIZERS["codegemma"]),
    "gemma2": Pair(_from_builder("gemma2"), FAMILY_TOKENIZERS["codegemma"]),
    "starcoder2": Pair(_from_builder("starcoder2"), FAMILY_TOKENIZERS["starcoder"]),
    "llama-codellama": Pair(_llama, FAMILY_TOKENIZERS["codellama"]),
    "llama-deepseek-coder": Pair(_llama, FAMILY_TOKENIZERS["deepseek-coder"]),
}
assert {name.split("-")[0] for name in PAIRS} >= set(FAMILY_BUILDERS), "a family of tiny_models is not served here"

SOURCE = "def total(values):\n    result = 0\n    for value in values:\n        result += value\n    return result\n"
# (line, character): the end of a line (one line), an empty line in a block (several), the middle of a line
POSITIONS = [(1, 14), (2, 24), (4, 11)]
SETTINGS = {
    "maxTokensSingleLine": 10,
    "maxTokensMultiLine": 14,
    "minConfidence": 0,  # random weights are unsure of every token: the gate would hide every completion
    "debounceMs": 0,
    "quantization": "none",
}


def save_pair(root: Path, pair: Pair) -> tuple[Path, Path]:
    """The target (seed 0) and its draft (fewer layers) as safetensors folders, each with the tokenizer."""
    tokenizer = pair.tokenizer()
    target = pair.build(0, len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    draft = noisy_copy(target, layers=LAYERS - 1, noise=0.1)
    assert draft.config.num_hidden_layers < target.config.num_hidden_layers
    for model, name in ((target, "target"), (draft, "draft")):
        model.save_pretrained(root / name, safe_serialization=True)
        tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft"


def _document(text: str, line: int, character: int) -> str:
    """The source with the cursor's line cut at `character` (what the user has typed so far)."""
    lines = text.split("\n")
    lines[line] = lines[line][:character]
    return "\n".join(lines)


@pytest.mark.parametrize("name", list(PAIRS))
async def test_the_server_completes_with_each_familys_pair(name, tmp_path):
    target, draft = save_pair(tmp_path, PAIRS[name])
    events = tmp_path / "events.jsonl"
    settings = {**SETTINGS, "target": str(target), "draft": str(draft), "telemetryPath": str(events)}
    # the same pipeline in this process, the target decoding alone: what greedy speculation must show
    alone, errors = parse_options({**settings, "draft": "none", "telemetry": False})
    assert not errors
    engine = load_engine(alone)
    assert (engine.fim is None) == (name == "mistral")

    client = await ClientServerConfig(server_command=SERVER_COMMAND, client_factory=make_client).start()
    try:
        await asyncio.wait_for(
            client.initialize_session(
                types.InitializeParams(
                    capabilities=client_capabilities("visual-studio-code"), initialization_options=settings
                )
            ),
            30,
        )
        ready = await wait_for_state(client, "ready", timeout=60)
        assert draft.name in ready["message"] or target.name in ready["message"]
        shown, drafted = [], 0
        for line, character in POSITIONS:
            text = _document(SOURCE, line, character)
            uri = f"file:///work/{name}/{uuid.uuid4().hex}.py"
            open_document(client, uri, text, "python")
            items = await asyncio.wait_for(inline(client, uri, line, character), 30)
            close_document(client, uri)
            event = latest_event(events)
            assert (event["target"], event["draft"]) == (str(target), str(draft))
            drafted += event["drafted"]
            request = Request(uuid.uuid4().hex, text, uri, "python", line, character, "invoked", time.perf_counter())
            want = complete(engine, alone, request, threading.Event()).text
            got = items[0].insert_text if items else ""
            assert got == want, (line, character)
            shown += [got] if got else []
        assert shown, "no completion at any position"
        assert drafted > 0, "the draft never ran"
    finally:
        await asyncio.wait_for(client.shutdown_session(), 30)  # the server exits only once asked to
        await client.stop()
    assert fim_tokens(engine.decoder.tokenizer.get_vocab()) == engine.fim
