"""One completion is one event: a plain, versioned record that serializes to one JSON line.

Producers (the server, `specdec bench`, `specdec eval`, `specdec sweep`, `specdec study`) build events with
`CompletionEvent.from_stats(stats.to_dict(), **fields)`; the editor's verdict arrives later as an
outcome record (see telemetry.log.EventLog.update_outcome) and analysis joins the latest one.
"""

from __future__ import annotations

import time as _time
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, get_args

SCHEMA = 1

Trigger = Literal["automatic", "invoked"]
# The server writes shown, empty (nothing to offer), error or cancelled (the document changed or the
# request was cancelled); the editor's verdict on a shown completion arrives later as accepted,
# partial (the user typed along part of it) or rejected.
Outcome = Literal["shown", "accepted", "partial", "rejected", "cancelled", "error", "empty"]
Source = Literal["eval", "bench", "sweep", "study", "editor"]
# Why an answer is empty (outcome "empty", "cancelled" or "error"):
# - "gate": the first line's confidence is under minConfidence;
# - "finished-line": the cursor is at the end of a finished line and the model only ended the line;
# - "scope": trimmed to nothing at the end of the enclosing scope;
# - "filter:<module>": a server/filters module cut it all (open-ended, so the field is a plain string);
# - "no-text": the model wrote nothing, or only retyped the closers after the cursor;
# - "cancelled" (a newer request or $/cancelRequest), "stale" (the document changed meanwhile);
# - "language-off", "too-large", "binary": refused before decoding; "error": it failed.
EMPTY_REASONS = (
    "gate",
    "finished-line",
    "scope",
    "no-text",
    "cancelled",
    "stale",
    "language-off",
    "too-large",
    "binary",
    "error",
)
# Why decoding stopped, as the producer reports it: the decoder's reasons (eos, length, stop,
# predicate, cancelled), "budget" for a block the server answered with its lines so far at its time
# budget, "reused" for a completion the server served again without decoding, and "" when nothing was
# decoded. Telemetry keeps its own list rather than importing the decoder's
# type (the two packages never import each other); tests/telemetry/test_events.py checks that it
# covers the decoder's. Not checked when an event is built: a reason the decoder adds later must
# not make the server fail to record a completion.
FinishReason = Literal["", "eos", "length", "stop", "predicate", "cancelled", "budget", "reused"]
# What the backend reported of its drafting: every round (ours: drafted, accepted, rejected_rounds,
# the histogram), totals only (llama.cpp's draft_n and draft_n_accepted: no rounds, so no α̂), or
# nothing (an OpenAI-compatible server such as vLLM reports no per-request draft counts).
DraftCounts = Literal["rounds", "totals", "unreported"]
# A block answered in stages: "first", its lines decoded within the time budget (more may follow);
# "continued", the block decoded on from where an accepted "first" ended. None: answered whole.
Stage = Literal["first", "continued"]

TRIGGERS: tuple[Trigger, ...] = get_args(Trigger)
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
SOURCES: tuple[Source, ...] = get_args(Source)
FINISH_REASONS: tuple[FinishReason, ...] = get_args(FinishReason)
DRAFT_COUNTS: tuple[DraftCounts, ...] = get_args(DraftCounts)
STAGES: tuple[Stage, ...] = get_args(Stage)

# GenerationStats.to_dict() keys that map onto event fields under another name.
_STATS_RENAMES = {"new_tokens": "generated_tokens"}


@dataclass
class CompletionEvent:
    schema: int = SCHEMA
    time: float = field(default_factory=_time.time)  # unix seconds when the completion finished
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    language: str = ""
    trigger: Trigger = "automatic"
    multiline: bool = False
    prompt_tokens: int = 0
    prompt_truncated_tokens: int = 0
    prompt_reused_tokens: int = 0  # already in the decoder's cache from the previous request
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    rejected_rounds: int = 0
    lookup_drafted: int = 0  # of drafted/accepted, tokens copied from the context (hybrid draft)
    lookup_accepted: int = 0
    lookup_rejected_rounds: int = 0  # of rejected_rounds, those whose drafts were copied from the context
    gammas: list[int] = field(default_factory=list)  # drafts proposed per round
    accepted_histogram: list[int] = field(default_factory=list)  # [n] = drafting rounds that accepted n
    draft_ms: float = 0.0
    verify_ms: float = 0.0
    prefill_ms: float = 0.0
    total_ms: float = 0.0  # inside the decoder
    ttft_ms: float = 0.0
    latency_ms: float = 0.0  # end to end in the producer: prompt building, decoding, trimming
    finish_reason: FinishReason = ""
    target: str = ""
    draft: str = ""  # "none" for plain autoregressive decoding
    device: str = ""
    backend: str = "local"  # the decode backend: local (ours), llamacpp (in-process) or openai (an HTTP server)
    draft_counts: DraftCounts = "rounds"
    settings: dict = field(default_factory=dict)  # gamma policy, temperature, max_new_tokens, ...
    outcome: Outcome = "shown"
    empty_reason: str | None = None  # why nothing was shown: one of EMPTY_REASONS or "filter:<module>"
    stage: Stage | None = None  # of a block answered in stages (None: whole)
    debounce_ms: float | None = None  # the server's wait for more typing before latency_ms began (its producer's)
    accepted_chars: int | None = None
    case_id: str | None = None  # set by eval/bench/sweep/study harnesses
    source: Source | None = None
    text: str | None = None  # the completion text, only when the user opted in

    def __post_init__(self):
        if self.trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {TRIGGERS}, got {self.trigger!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.draft_counts not in DRAFT_COUNTS:
            raise ValueError(f"draft_counts must be one of {DRAFT_COUNTS}, got {self.draft_counts!r}")
        if self.source is not None and self.source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES} or None, got {self.source!r}")
        if self.stage is not None and self.stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES} or None, got {self.stage!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CompletionEvent:
        """The inverse of to_dict. Newer schemas and unknown keys are errors, not silently dropped."""
        schema = data.get("schema", SCHEMA)
        if schema > SCHEMA:
            raise ValueError(f"event schema {schema} is newer than this reader's ({SCHEMA})")
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown event fields: {sorted(unknown)}")
        return cls(**data)

    @classmethod
    def from_stats(cls, stats: dict, **fields_: object) -> CompletionEvent:
        """An event from `GenerationStats.to_dict()` plus the producer's fields (language, target, ...).

        Derived statistics (alpha, mean_accepted, tokens_per_s) are not stored: the analysis
        recomputes them from the counts, pooled the right way.
        """
        known = {f.name for f in fields(cls)}
        from_stats = {_STATS_RENAMES.get(k, k): v for k, v in stats.items()}
        base = {k: v for k, v in from_stats.items() if k in known}
        base["gammas"] = list(base.get("gammas", []))
        base["accepted_histogram"] = list(base.get("accepted_histogram", []))
        return cls(**(base | fields_))
