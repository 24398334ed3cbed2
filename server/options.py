"""The server's settings: LSP `initializationOptions`, later changed by `workspace/didChangeConfiguration`.

Keys are camelCase, as LSP clients send them; each maps to the snake_case field below:

    {"target": "gemma3-270m", "draft": "layers:0,1", "gamma": "heuristic",
     "maxTokensSingleLine": 32, "maxTokensMultiLine": 128, "debounceMs": 150,
     "telemetry": true, "telemetryPath": null, "telemetryText": false,
     "enabledLanguages": ["python", "rust"]}

Unknown keys are logged and ignored (a newer client may send more). A value of the wrong type or
out of range is reported back as an error, and that one key keeps its previous value.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any

from speccomplete.decoder.gamma import parse_gamma_policy
from speccomplete.decoder.models import DEFAULT_DRAFT, DEFAULT_TARGET

log = logging.getLogger(__name__)

# Fields whose change needs the models reloaded; the rest apply to the next request.
MODEL_FIELDS = ("target", "draft", "device", "dtype")


@dataclass(frozen=True)
class ServerOptions:
    target: str = DEFAULT_TARGET  # packaged alias, local directory or HF id
    draft: str = DEFAULT_DRAFT  # ngram+self (lookup, then the target with a cut head), ngram+none (lookup only), ngram+auto (lookup, then the shipped trained draft), self, auto, layers:0,1, ngram, none, a folder or a model spec
    device: str = "auto"
    dtype: str = "auto"
    gamma: str = "heuristic"  # an integer >= 0, heuristic[:START:MAX] or cost[:C:V]
    draft_confidence: float = 0.0
    max_tokens_single_line: int = 32
    max_tokens_multi_line: int = 128
    temperature: float = 0.0
    debounce_ms: int = 150  # for automatic triggers; an invoked completion starts at once
    telemetry: bool = True
    telemetry_path: str | None = None  # None: telemetry.log.default_path()
    telemetry_text: bool = False  # store completion text in events (opt-in: it is source code)
    telemetry_source: str = "editor"  # what produced the events: editor, or eval for the harness
    track_outcomes: bool = True  # record accepted/rejected; off for headless runs where nobody accepts
    reject_after_s: float = 10.0  # a shown completion not accepted within this is recorded rejected
    enabled_languages: tuple[str, ...] | None = None  # grammar names; None enables every language
    prompt_budget_chars: int = 2000  # ~570 tokens: prefill runs ~175 tokens/s on a 2-core CPU, so context costs latency
    max_document_chars: int = 1_000_000  # larger documents get no completion (and are not tokenized)

    def language_enabled(self, language: str) -> bool:
        return self.enabled_languages is None or language in self.enabled_languages

    def settings(self) -> dict:
        """The decoding settings an event records."""
        return {"gamma": self.gamma, "draft_confidence": self.draft_confidence, "temperature": self.temperature,
                "max_tokens_single_line": self.max_tokens_single_line,
                "max_tokens_multi_line": self.max_tokens_multi_line, "prompt_budget_chars": self.prompt_budget_chars}


def _camel_to_snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def _check(name: str, value: Any) -> Any:
    """The value converted to the field's type, or a ValueError saying what was expected."""
    if name in ("telemetry", "telemetry_text", "track_outcomes"):
        if not isinstance(value, bool):
            raise ValueError("expected true or false")
        return value
    if name in ("max_tokens_single_line", "max_tokens_multi_line", "prompt_budget_chars", "max_document_chars"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError("expected an integer >= 1")
        return value
    if name == "debounce_ms":
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("expected an integer >= 0")
        return value
    if name in ("temperature", "draft_confidence", "reject_after_s"):
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise ValueError("expected a number >= 0")
        if name == "draft_confidence" and value > 1:
            raise ValueError("expected a number in [0, 1]")
        return float(value)
    if name == "enabled_languages":
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise ValueError("expected a list of language names, or null for all")
        return tuple(value)
    if name == "telemetry_path":
        if value is not None and (not isinstance(value, str) or not value):
            raise ValueError("expected a file path, or null for the default")
        return value
    if name == "telemetry_source":
        if value not in ("editor", "eval"):
            raise ValueError("expected 'editor' or 'eval'")
        return value
    if not isinstance(value, str) or not value:  # target, draft, device, dtype, gamma
        raise ValueError("expected a non-empty string")
    if name == "gamma":
        parse_gamma_policy(value)
    return value


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
            log.info("ignoring unknown setting %r", key)
            continue
        try:
            changes[name] = _check(name, value)
        except ValueError as e:
            errors.append(f"{key}: {e} (got {value!r})")
    return dataclasses.replace(base, **changes), errors


def models_changed(old: ServerOptions, new: ServerOptions) -> bool:
    return any(getattr(old, name) != getattr(new, name) for name in MODEL_FIELDS)

