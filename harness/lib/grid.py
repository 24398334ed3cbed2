"""The decoder over a grid of fixed γ and temperatures, AR included, one event a run: what `specdec sweep` runs,
and `specdec study` for RQ3.

For every case and temperature the grid runs plain AR (γ 0, no draft) and each fixed γ on the same prompt ids with
the same seed, in an order rotated case by case so drift in machine speed hits every setting alike.
"""

from __future__ import annotations

import time

from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import parse_gamma_policy
from speccomplete.decoder.sampling import SamplingParams
from speccomplete.decoder.target_steps import EagerTarget
from speccomplete.telemetry.events import CompletionEvent, Source
from speccomplete.telemetry.log import EventLog

from .cases import Case


def parse_list(text: str, kind=float) -> list:
    try:
        values = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"not a comma-separated list of {kind.__name__}: {text!r}") from None
    if not values:
        raise ValueError(f"empty list: {text!r}")
    return values


def grid_settings(gammas: list[int], temperatures: list[float]) -> list[tuple[int, float]]:
    """(γ, temperature) per run of one case: AR (γ 0) first at each temperature, then each γ."""
    return [(gamma, t) for t in temperatures for gamma in [0] + [g for g in gammas if g != 0]]


def run_sweep(
    cases: list[Case],
    target,
    tokenizer,
    drafter,
    log: EventLog,
    *,
    gammas: list[int],
    temperatures: list[float],
    max_new_tokens: int,
    max_prompt_tokens: int,
    target_name: str,
    draft_name: str,
    device: str,
    seed: int = 0,
    source: Source = "sweep",
    progress=None,
) -> int:
    """Decode every case at every grid point and write one event per run, of `source` (`specdec study` runs the
    grid too); returns the number of runs."""
    if drafter is None and any(gammas):
        raise ValueError("a γ sweep needs a draft (--draft is 'none')")
    # One cache the decoders take turns on: a drafter attaches to the steps of the decoder built with it, and a
    # SelfDrafter drafts only on those, so decoders with steps of their own would leave every γ but the last
    # undrafted.
    steps = EagerTarget(target, drafter.target_taps if drafter is not None else ())
    decoders = {0: SpeculativeDecoder(target, tokenizer, steps=steps)}
    for gamma in gammas:
        if gamma:
            decoders[gamma] = SpeculativeDecoder(
                target, tokenizer, drafter, parse_gamma_policy(str(gamma)), steps=steps
            )
    grid = grid_settings(gammas, temperatures)
    ar = decoders[0]
    prompts = [ar.fit_prompt(ar.encode(c.prefix), max_new_tokens, max_prompt_tokens)[0] for c in cases]
    for gamma in decoders:  # warm-up: allocator, kernels, thread pools
        decoders[gamma].generate(prompts[0][-64:], DecodeOptions(max_new_tokens=4))
    runs = 0
    for i, (case, ids) in enumerate(zip(cases, prompts)):
        for gamma, temperature in grid[i % len(grid) :] + grid[: i % len(grid)]:
            options = DecodeOptions(max_new_tokens=max_new_tokens, sampling=SamplingParams(temperature), seed=seed)
            steps.truncate(0)  # cold: no run reuses the prompt another one prefilled
            start = time.perf_counter()
            generation = decoders[gamma].generate(ids, options)
            latency_ms = 1000 * (time.perf_counter() - start)
            log.write(
                CompletionEvent.from_stats(
                    generation.stats.to_dict(),
                    language=case.language,
                    trigger="invoked",
                    multiline=True,
                    latency_ms=latency_ms,
                    target=target_name,
                    draft=draft_name if gamma else "none",
                    device=device,
                    settings={
                        "gamma": str(gamma),
                        "temperature": temperature,
                        "max_new_tokens": max_new_tokens,
                        "seed": seed,
                    },
                    case_id=case.id,
                    source=source,
                )
            )
            runs += 1
            if progress:
                progress(case, gamma, temperature)
    return runs
