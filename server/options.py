"""The server's settings: LSP `initializationOptions`, later changed by `workspace/didChangeConfiguration`.

Keys are camelCase, as LSP clients send them; each maps to the snake_case field below:

    {"backend": "local", "target": "gemma3-270m", "draft": "layers:0,1", "gamma": "heuristic",
     "maxTokensSingleLine": 32, "maxTokensMultiLine": 128, "debounceMs": 100,
     "telemetry": true, "telemetryPath": null, "telemetryText": false,
     "enabledLanguages": ["python", "rust"]}

Unknown keys are logged and ignored (a newer client may send more), except one close to a known key:
that is reported as a probable typo, since it would otherwise do nothing without a word. Each value is
checked against its field's type below (with `Range` bounds and validator functions in `Annotated`);
a value of the wrong type or out of range is reported back as an error naming the key and what it
expects, and that one key keeps its previous value.

Each field's other facts sit in its metadata (`option`): what it does for people (`HELP`), whether a change
reloads the models (`MODEL_FIELDS`) or reopens the event log (`EVENT_LOG_FIELDS`), and whether events record
it (`ServerOptions.settings`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import re
import reprlib
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

from speccomplete.decoder.backends.llamacpp import SPECULATIVE as LLAMACPP_SPECULATIVE
from speccomplete.decoder.drafts import parse_draft_spec
from speccomplete.decoder.gamma import parse_gamma_policy
from speccomplete.decoder.models import DEFAULT_DRAFT, DEFAULT_TARGET, DEFAULT_TREE_NODES
from speccomplete.telemetry.log import DEFAULT_KEEP_BYTES, DEFAULT_KEEP_DAYS

from .gate import DEFAULT_MIN_CONFIDENCE
from .prompt import DEFAULT_BUDGET_CHARS
from .snippets import DEFAULT_CONTEXT_CHARS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Range:
    """Inclusive bounds of a number option, in its `Annotated` type."""

    low: float
    high: float | None = None

    def __contains__(self, value: float) -> bool:
        return self.low <= value and (self.high is None or value <= self.high)

    def describe(self) -> str:
        return f">= {self.low:g}" if self.high is None else f"in [{self.low:g}, {self.high:g}]"


Count = Annotated[int, Range(1)]
# A completion's token limit: beyond any context window we load, a larger one only leaves no room for a prompt.
TokenLimit = Annotated[int, Range(1, 8192)]


def _check_speculative(name: str) -> None:
    if name not in LLAMACPP_SPECULATIVE:
        raise ValueError(f"expected one of {', '.join(LLAMACPP_SPECULATIVE)}")


def option(default: Any, help: str, *, reloads: bool = False, recorded: bool = False, event_log: bool = False) -> Any:
    """A ServerOptions field with its facts: `help`, what it does for people (the README's settings table);
    `reloads`, a change needs the models reloaded; `recorded`, every event records its value (`settings`);
    `event_log`, a change needs the event log reopened."""
    metadata = {"help": help, "reloads": reloads, "recorded": recorded, "event_log": event_log}
    return dataclasses.field(default=default, metadata=metadata)


@dataclass(frozen=True)
class ServerOptions:
    # What decodes (decoder/backends/__init__.py): our decoder (target, draft, gamma, device, dtype and
    # quantization apply), llama.cpp in-process on a GGUF (gguf, llamacpp_speculative), or an
    # OpenAI-compatible server (openai_*).
    backend: Literal["local", "llamacpp", "openai"] = option(
        "local",
        "What decodes: `local` (our speculative decoder), `llamacpp` (llama.cpp in-process on a GGUF) or "
        "`openai` (an OpenAI-compatible server); docs/backends.md.",
        reloads=True,
    )
    target: str = option(
        DEFAULT_TARGET,
        "The model that writes the completion: a packaged alias (`gemma3-270m`, `smollm2-135m`), a local "
        "directory of safetensors, a `.gguf` file or a Hugging Face id.",
        reloads=True,
    )
    draft: Annotated[str, parse_draft_spec] = option(
        DEFAULT_DRAFT,
        "What proposes tokens for the target to verify: `ngram+self` (prompt lookup, else the target drafting "
        "for itself), `ngram`, `auto` (the shipped trained draft), `eagle3`, `layers:0,1`, `none`, a draft "
        "folder or a model; the syntax is in decoder/drafts/spec.py.",
        reloads=True,
    )
    device: str = option(
        "auto",
        "`auto` (CUDA where there is a GPU), `cpu`, `cuda`, `cuda:1`, ...",
        reloads=True,
    )
    dtype: str = option(
        "auto",
        "`auto` (bfloat16 on CUDA, float32 on the CPU), `float32`, `bfloat16`, `float16`.",
        reloads=True,
    )
    # the target's linear weights: int8 (decoder/kernels.py), none (fp32), auto (int8 where it runs: the CPU)
    quantization: Literal["auto", "none", "int8"] = option(
        "auto",
        "The target's linear weights: `auto` (int8 on the CPU), `none`, `int8`.",
        reloads=True,
    )
    compile_step: bool | Literal["auto"] = option(
        "auto",
        "On the CPU, compile the target's step once per machine, in the background, keep it in the model cache "
        "and load it at later starts; answers come from the eager step until it is in use (`optimizing` in "
        "the status). `auto`: for a target of 100M parameters or more. `specdec precompile` builds it ahead.",
        reloads=True,
    )
    gguf: str | None = option(
        None,
        "`llamacpp` backend: the GGUF file (default: the packaged target's own).",
        reloads=True,
    )
    llamacpp_speculative: Annotated[str, _check_speculative] = option(
        "none",
        "`llamacpp` backend: llama.cpp's draftless speculation (`none`, `ngram-simple`, `ngram-map-k`, "
        "`ngram-map-k4v`, `ngram-mod`, `ngram-cache`).",
        reloads=True,
    )
    openai_url: str = option(
        "http://127.0.0.1:8080/v1",
        "`openai` backend: the server's base URL, up to `/v1`.",
        reloads=True,
    )
    openai_model: str | None = option(
        None,
        "`openai` backend: the model name the server knows (default: its default).",
        reloads=True,
    )
    openai_api_key_env: str = option(
        "OPENAI_API_KEY",
        "`openai` backend: the environment variable that holds the API key, if any.",
        reloads=True,
    )
    gamma: Annotated[str, parse_gamma_policy] = option(
        "heuristic",
        "Drafted tokens per round: an integer, `heuristic[:START:MAX]` (adapts per language) or `cost[:C:V]`.",
        recorded=True,
    )
    draft_confidence: Annotated[float, Range(0, 1)] = option(
        0.0,
        "A model draft stops proposing when its own probability falls below this.",
        recorded=True,
    )
    draft_tree_nodes: Annotated[int, Range(0, 24)] = option(
        DEFAULT_TREE_NODES,
        "The most drafts of a round's draft tree: the draft's next-best continuations too, verified in one pass. "
        "Under an adaptive `gamma`, each language drafts trees only while they commit tokens faster than chains "
        "on this machine. 0: one chain a round.",
        recorded=True,
    )
    max_tokens_single_line: TokenLimit = option(
        32,
        "Token limit for a completion of the rest of a line.",
        recorded=True,
    )
    max_tokens_multi_line: TokenLimit = option(
        128,
        "Token limit for a multi-line completion (at an empty line or after a block opener).",
        recorded=True,
    )
    # chosen with `specdec quality` at a few budgets (docs/quality.md, "A block in stages")
    block_budget_ms: Annotated[int, Range(0, 60_000)] = option(
        300,
        "A multi-line completion is answered with the lines decoded this long after the request, cut at a line "
        "end; accepting them asks for the block's next lines (0: the whole block at once).",
        recorded=True,
    )
    temperature: Annotated[float, Range(0, 10)] = option(
        0.0,
        "0: greedy (the target's own choice); above 0: sampled, still lossless.",
        recorded=True,
    )
    # completions the target was less sure of are not shown (server/gate.py); 0 shows every completion
    min_confidence: Annotated[float, Range(0, 1)] = option(
        DEFAULT_MIN_CONFIDENCE,
        "Completions the target was less sure of are not shown: the geometric mean of its probabilities for the "
        "shown tokens (0 shows every completion); docs/quality.md.",
        recorded=True,
    )
    # for automatic triggers; an invoked completion starts at once. Bounded: a request waits this long.
    debounce_ms: Annotated[int, Range(0, 5000)] = option(
        100,
        "Automatic requests wait at least this long for more typing before decoding, and up to 3x as long: as "
        "long as keeps what decodes started between your keys cost under 3% of a core, at your recent pace. "
        "Invoked ones start at once.",
    )
    prefill_on_edit: bool = option(
        True,
        "At the first edit in a document whose prompt the model has not read, read it while the user types on, "
        "so that the completion at the next pause prefills only what changed.",
        recorded=True,
    )
    telemetry: bool = option(
        True,
        "Record one event per completion on this machine (no source text unless `telemetryText`).",
        event_log=True,
    )
    # None: telemetry.log.default_path()
    telemetry_path: str | None = option(
        None,
        "The event file (default: `~/.local/share/specdec/events.jsonl`).",
        event_log=True,
    )
    telemetry_text: bool = option(
        False,
        "Also store the completion text in events (opt-in: it is your source code).",
    )
    # retention (telemetry/log.py): rotated files older than this are deleted; 0 keeps them whatever their age
    telemetry_retention_days: Annotated[float, Range(0, 36500)] = option(
        DEFAULT_KEEP_DAYS,
        "Rotated event files older than this are deleted (0: kept whatever their age).",
        event_log=True,
    )
    telemetry_max_megabytes: Annotated[int, Range(1, 1_000_000)] = option(
        DEFAULT_KEEP_BYTES // 2**20,
        "The event files together stay under this; the oldest rotated ones go first.",
        event_log=True,
    )
    telemetry_source: Literal["editor", "eval"] = option(
        "editor",
        "What produced the events: `editor`, or `eval` for the harness.",
    )
    track_outcomes: bool = option(
        True,
        "Record accepted and rejected outcomes (off for headless runs where nobody accepts).",
    )
    reject_after_s: Annotated[float, Range(0, 86400)] = option(
        10.0,
        "A shown completion not accepted within this many seconds is recorded as rejected.",
    )
    enabled_languages: tuple[str, ...] | None = option(
        None,
        "Only these languages get completions (names as in speccomplete/languages.py); null: every language.",
    )
    prompt_budget_chars: Count = option(
        DEFAULT_BUDGET_CHARS,
        "Characters of the document around the cursor that go into the prompt.",
        recorded=True,
    )
    # definitions this file names and windows of other open documents, before the prompt (server/snippets.py)
    context_budget_chars: Annotated[int, Range(0, 100_000)] = option(
        DEFAULT_CONTEXT_CHARS,
        "Characters, over `promptBudgetChars`, for context from beyond the prompt: signatures of definitions in "
        "this file that the code above the cursor names, and the most similar lines of other open documents in "
        "the same language (0: none; off by default, as it did not improve the default target's completions: "
        "docs/quality.md).",
        recorded=True,
    )
    max_document_chars: Count = option(
        1_000_000,
        "Larger documents get no completion (and are not tokenized).",
    )
    # the prompt's last token is written again by the model (decoder/healing.py)
    token_healing: bool = option(
        True,
        "The model writes the prompt's last token again, choosing among the tokens that start with its text, so "
        "a prompt cut after `= ` or a comment's ` ` ends where its tokenizer would cut (`local` backend); "
        "docs/quality.md.",
        recorded=True,
    )

    def language_enabled(self, language: str) -> bool:
        return self.enabled_languages is None or language in self.enabled_languages

    def settings(self) -> dict:
        """The decoding settings an event records (the fields marked `recorded`)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata["recorded"]}


# Derived from the fields' metadata (`option`). The settings tables in README.md are generated from HELP and
# the fields' types and defaults (tools/settings_doc.py), so they cannot go stale.
HELP = {f.name: f.metadata["help"] for f in dataclasses.fields(ServerOptions)}  # what each setting does, for people
# fields whose change needs the models reloaded (or the backend rebuilt); the rest apply to the next request
MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(ServerOptions) if f.metadata["reloads"])
# fields whose change needs the event log reopened (server/lsp.py's configure)
EVENT_LOG_FIELDS = tuple(f.name for f in dataclasses.fields(ServerOptions) if f.metadata["event_log"])


def _camel_to_snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def snake_to_camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


@functools.cache
def field_types() -> dict[str, Any]:
    return get_type_hints(ServerOptions, include_extras=True)


class _Mismatch(ValueError):
    """A value that does not have the field's type; the caller says what the type expects."""


def describe(hint: Any) -> str:
    """What a field's type accepts, in the words of a JSON settings file: "an integer >= 1"."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        ranges = [m.describe() for m in args[1:] if isinstance(m, Range)]
        return " ".join([describe(args[0]), *ranges])
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args if a is not type(None)) + (
            ", or null" if type(None) in args else ""
        )
    if origin is Literal:
        return " or ".join(repr(a) for a in args)
    if origin is tuple:
        return f"a list of {describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a non-empty string"}[hint]


def structure(value: Any, hint: Any) -> Any:
    """`value` (as JSON decoded it) converted to the type `hint`; a ValueError when it does not fit."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is Annotated:
        value = structure(value, args[0])
        for meta in args[1:]:
            if isinstance(meta, Range):
                if value not in meta:
                    raise _Mismatch
            elif callable(meta):  # a validator: raises ValueError with its own message
                meta(value)
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return structure(value, option)
            except _Mismatch:
                pass
        raise _Mismatch
    if origin is Literal:
        if value in args:
            return value
        raise _Mismatch
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if not isinstance(value, list):
            raise _Mismatch
        return tuple(structure(item, args[0]) for item in value)
    checks: dict[Any, Callable[[Any], bool]] = {
        bool: lambda v: isinstance(v, bool),
        int: lambda v: isinstance(v, int) and not isinstance(v, bool),
        float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        str: lambda v: isinstance(v, str) and bool(v),
    }
    if hint not in checks:
        raise TypeError(f"no settings rule for the type {hint!r}")
    if not checks[hint](value):
        raise _Mismatch
    return float(value) if hint is float else value


def _check(name: str, value: Any) -> Any:
    """The value converted to the field's type, or a ValueError saying what was expected."""
    hint = field_types()[name]
    try:
        return structure(value, hint)
    except _Mismatch:
        raise ValueError(f"expected {describe(hint)}") from None


def parse_options(raw: Any, base: ServerOptions | None = None) -> tuple[ServerOptions, list[str]]:
    """Apply the settings in `raw` on top of `base`: (new options, one error message per rejected key).

    Rejected keys keep their value from `base`, so a typo in one setting loses no other.
    """
    base = base or ServerOptions()
    if raw is None:
        return base, []
    if not isinstance(raw, dict):
        return base, [f"settings must be an object, got {type(raw).__name__}"]
    names = {f.name for f in dataclasses.fields(ServerOptions)}
    changes: dict[str, Any] = {}
    errors: list[str] = []
    for key, value in raw.items():
        name = _camel_to_snake(key)
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.85)
            if close:  # a mistyped setting would otherwise do nothing, silently
                errors.append(f"{key}: unknown setting (did you mean {snake_to_camel(close[0])}?)")
            else:
                log.info("ignoring unknown setting %r", key)
            continue
        try:
            changes[name] = _check(name, value)
        except ValueError as e:
            errors.append(f"{key}: {e} (got {reprlib.repr(value)})")
    return dataclasses.replace(base, **changes), errors


def models_changed(old: ServerOptions, new: ServerOptions) -> bool:
    return any(getattr(old, name) != getattr(new, name) for name in MODEL_FIELDS)
