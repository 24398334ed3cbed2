"""`specdec sweep`: the decoder over a grid of fixed γ and temperatures, AR included, as events.

For every case and temperature the grid runs plain AR (γ 0, no draft) and each fixed γ on the
same prompt ids with the same seed, in an order rotated case by case so drift in machine speed
hits every setting alike. Each run is one CompletionEvent (source "sweep"); `specdec report`
pairs the speculative runs with the AR run of the same case and temperature for speedup. The grid
itself is lib/grid.py (`specdec study` runs it too).
"""

from __future__ import annotations

import argparse

from speccomplete.telemetry.log import EventLog

from .lib.cases import read_cases
from .lib.grid import grid_settings, parse_list, run_sweep
from .lib.model_args import add_model_args, device_name, load


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("sweep")
    p.add_argument("--cases", required=True)
    p.add_argument("--gammas", default="1,2,4,8,16,32", help="fixed γ values; AR (γ 0) always runs too")
    p.add_argument("--temperatures", default="0,0.5,1.0")
    p.add_argument("--events", required=True, help="append the events here (JSONL)")
    p.add_argument("--languages", help="only cases in these languages, e.g. python,rust,lua")
    p.add_argument("--limit", type=int, help="use only the first N cases (after --languages)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0, help="sampling seed, the same for every grid point")
    add_model_args(p)
    return p


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from speccomplete.decoder.drafts import draft_label

    gammas = parse_list(args.gammas, int)
    temperatures = parse_list(args.temperatures, float)
    cases = read_cases(args.cases)
    if args.languages:
        wanted = set(parse_list(args.languages, str))
        cases = [c for c in cases if c.language in wanted]
    if args.limit:
        cases = cases[: args.limit]
    if not cases:
        raise ValueError(f"no cases in {args.cases} for languages {args.languages}")
    loaded = load(args)
    target, tokenizer, decoder = loaded.target, loaded.tokenizer, loaded.decoder
    runs = len(cases) * len(grid_settings(gammas, temperatures))
    log = EventLog(args.events)
    if not log.enabled:
        raise ValueError("SPECDEC_TELEMETRY turns event writing off; unset it to run a sweep")
    with log, tqdm(total=runs, desc="sweep", unit="run") as bar:

        def progress(case, gamma, temperature):
            bar.set_postfix_str(f"{case.id} γ={gamma} T={temperature:g}")
            bar.update(1)

        run_sweep(
            cases,
            target,
            tokenizer,
            decoder.drafter,
            log,
            gammas=gammas,
            temperatures=temperatures,
            max_new_tokens=args.max_new_tokens,
            max_prompt_tokens=args.max_prompt_tokens,
            target_name=args.target,
            draft_name=draft_label(args.draft, target),
            device=device_name(target),
            seed=args.seed,
            progress=progress,
        )
    print(f"wrote {runs} events to {args.events}")
    return 0
