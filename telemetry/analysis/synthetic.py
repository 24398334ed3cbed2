"""Synthetic events for timing the report on a million events (no model involved).

Each language gets its own per-token acceptance α; rounds draw geometric bursts, so the
histograms, counts and times are mutually consistent like the decoder's. Events can also look like
another backend's: llama.cpp's keep only the totals drafted and accepted, vLLM's no draft counts.
"""

from __future__ import annotations

import json
import uuid

import numpy as np

# A fixed workload, so timings stay comparable from one run to the next: the languages of the report's
# default groups, and natural language.
LANGUAGES = [
    "python",
    "cpp",
    "java",
    "c",
    "javascript",
    "go",
    "lua",
    "haskell",
    "ruby",
    "rust",
    "typescript",
    "zig",
    "elixir",
    "ocaml",
    "nl",
]


def write_synthetic(
    path: str,
    n: int,
    seed: int = 0,
    gammas=(0, 1, 2, 4, 8, 16, 32),
    temperatures=(0.0, 0.5, 1.0),
    drafts=("layers:0,1", "tuned"),
    cases_per_language: int = 200,
    backend: str = "local",
    draft_counts: str = "rounds",
) -> None:
    """n events over languages × cases × (AR + drafts × γ × T); one in ten gets an outcome record.

    draft_counts "totals" keeps drafted and accepted and zeroes the per-round counts (rounds, rejected
    rounds, gammas, histogram), as llama.cpp reports; "unreported" zeroes drafted and accepted too.
    The same seed draws the same completions whatever the counts, so the kinds can be compared.
    """
    rng = np.random.default_rng(seed)
    alpha = {lang: a for lang, a in zip(LANGUAGES, np.linspace(0.85, 0.45, len(LANGUAGES)))}
    with open(path, "w") as f:
        for i in range(n):
            lang = LANGUAGES[rng.integers(len(LANGUAGES))]
            gamma = int(gammas[rng.integers(len(gammas))])
            draft = "none" if gamma == 0 else drafts[rng.integers(len(drafts))]
            temperature = float(temperatures[rng.integers(len(temperatures))])
            a = alpha[lang] + (0.05 if draft == "tuned" else 0.0)
            tokens, hist, rejected, rounds = 0, [0] * (gamma + 1), 0, 0
            while tokens < 64:
                rounds += 1
                burst = min(int(rng.geometric(1 - a)) - 1, gamma) if gamma else 0
                if gamma:
                    hist[burst] += 1
                    rejected += burst < gamma
                tokens += burst + 1
            accepted = sum(k * c for k, c in enumerate(hist))
            total_ms = rounds * (100 + 10 * gamma) + rng.normal(0, 5)
            request_id = uuid.uuid4().hex
            drafted = gamma * rounds
            if draft_counts != "rounds":  # taken after every draw, so the rng stream is the same
                rounds, rejected, hist = 0, 0, []
            if draft_counts == "unreported":
                drafted, accepted = 0, 0
            event = {
                "schema": 1,
                "time": 1.7e9 + i,
                "request_id": request_id,
                "language": lang,
                "trigger": "automatic",
                "multiline": bool(i % 2),
                "prompt_tokens": 500,
                "prompt_truncated_tokens": 0,
                "generated_tokens": tokens,
                "drafted": drafted,
                "accepted": accepted,
                "rounds": rounds,
                "rejected_rounds": rejected,
                "gammas": [gamma] * rounds,
                "accepted_histogram": hist if gamma else [],
                "draft_ms": 10.0 * drafted,
                "verify_ms": 100.0 * rounds,
                "prefill_ms": 50.0,
                "total_ms": total_ms,
                "ttft_ms": 150.0,
                "latency_ms": total_ms + 5,
                "finish_reason": "length",
                "target": "gemma3-270m",
                "draft": draft,
                "device": "cpu",
                "backend": backend,
                "draft_counts": draft_counts,
                "settings": {"gamma": str(gamma), "temperature": temperature, "max_new_tokens": 64},
                "outcome": "shown",
                "accepted_chars": None,
                "case_id": f"{lang}-{rng.integers(cases_per_language)}",
                "source": "sweep",
                "text": None,
            }
            f.write(json.dumps(event, separators=(",", ":")) + "\n")
            if i % 10 == 0:
                f.write(
                    json.dumps(
                        {
                            "schema": 1,
                            "record": "outcome",
                            "time": 1.7e9 + i + 1,
                            "request_id": request_id,
                            "outcome": "accepted" if rng.random() < a else "rejected",
                            "accepted_chars": None,
                        }
                    )
                    + "\n"
                )
