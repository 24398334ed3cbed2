"""Silence when unsure: show a completion only where the target was sure enough of it.

The evidence is the target's own log-probability of each token the shown text came from
(decoder/engine.py, Generation.logprobs), summed up as their geometric mean: 1.0 when the target was
certain of every token, lower as it hesitated; `confidence` over the whole completion,
`first_line_confidence` over its first line. A completion whose first line's confidence is below
`minConfidence` is not shown (the event's outcome is "empty"). The default comes from the curve of shown
rate against next-line similarity on the dev split (docs/quality.md). Backends that report no
log-probabilities (llama.cpp, an OpenAI server) give no evidence, and their completions are always shown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from speccomplete.decoder.engine import Generation

# The default `minConfidence`: on the dev split, the highest threshold that still shows a completion for
# most requests (docs/quality.md, "The confidence gate", has the curve and what it buys).
DEFAULT_MIN_CONFIDENCE = 0.35


@dataclass(frozen=True)
class Evidence:
    tokens: int  # the generated tokens the shown text came from
    confidence: float | None  # exp(mean log-probability) over those tokens; None without log-probabilities
    min_probability: float | None  # the least sure of them
    first_line_confidence: float | None = None  # the same over the tokens of its first line


def evidence(generation: Generation, shown: str, tokenizer=None) -> Evidence:
    """The evidence for `shown`, a prefix of generation.text after trimming."""
    logprobs = generation.logprobs
    if not shown or not logprobs:
        return Evidence(0, None, None)
    healed = len(generation.healed)  # the first tokens write the healed end of the prompt before `shown`
    used = _tokens_behind(generation.token_ids, healed + len(shown), tokenizer) if tokenizer else len(logprobs)
    kept = logprobs[: max(1, used)]
    first_line = len(shown.split("\n", 1)[0]) or 1
    if first_line == len(shown) or not tokenizer:  # a single line: the same tokens
        first = len(kept)
    else:
        first = _tokens_behind(generation.token_ids, healed + first_line, tokenizer)
    return Evidence(len(kept), _geometric_mean(kept), math.exp(min(kept)), _geometric_mean(kept[: max(1, first)]))


def _geometric_mean(logprobs: list[float]) -> float:
    return math.exp(sum(logprobs) / len(logprobs))


def silenced(found: Evidence, min_confidence: float) -> bool:
    """Judged on the first line: what the user reads first, and on the dev split the better predictor of
    the real next line (docs/quality.md: at the same shown rate, more exact lines than the whole's)."""
    return found.first_line_confidence is not None and found.first_line_confidence < min_confidence


def _tokens_behind(token_ids: list[int], chars: int, tokenizer) -> int:
    """The fewest leading tokens whose text covers `chars` characters (a binary search over decodes)."""
    low, high = 1, len(token_ids)
    while low < high:
        middle = (low + high) // 2
        if len(tokenizer.decode(token_ids[:middle], skip_special_tokens=True)) >= chars:
            high = middle
        else:
            low = middle + 1
    return low
