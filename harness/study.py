"""`specdec study`: the disparity study's three research questions over a case set, in one resumable command.

- RQ1 and RQ2: every case is decoded by AR and by each draft at the product's γ policy, greedy, twice: a
  block (max_new_tokens, no stop string: every decoder writes the same length, so tokens/s compare) and a
  single line (the server's single-line request: stop at the line's end, its token limit). Every run
  starts cold (an empty cache, a fresh γ policy of its own), so no run depends on the ones before it.
- RQ3: `specdec sweep`'s grid (AR and fixed γ × temperature) with the product's draft (`--draft`) on
  the first cases of each language, pooled per resource group.

Every run is one CompletionEvent (source "study"), appended to DIR/events/<part>.jsonl as soon as it ends; a
restart reads them and decodes only the runs not there yet, and because runs are cold, a resumed study counts
what an uninterrupted one does. This module runs the study; study.json, study.md and the plots are made from
the events alone by speccomplete.telemetry.analysis.study (`--from-events` remakes them without decoding), and
DIR/report/ is `specdec report` on the block runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from speccomplete.decoder.engine import DecodeOptions, SpeculativeDecoder
from speccomplete.decoder.gamma import parse_gamma_policy
from speccomplete.server.filters.decode_stops import stop_strings
from speccomplete.server.options import ServerOptions
from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import EventLog

from .lib.cases import Case, read_cases
from .lib.grid import grid_settings, parse_list, run_sweep
from .lib.model_args import add_model_args, device_name, load

if TYPE_CHECKING:
    from speccomplete.decoder.drafts import Drafter

# The drafts studied when --drafts is not given, as far as they exist for the target: the lookup alone, the
# product's default, an untrained draft (the target's first two layers), the shipped CPU-trained draft and
# the shipped EAGLE-3 draft. A draft that resolves to one already listed (auto is layers:0,1 for a target no
# trained draft ships for) runs once.
DEFAULT_DRAFTS = ("ngram", "ngram+self", "layers:0,1", "auto", "eagle3")
PARTS = ("block", "line", "rq3")  # the event files under DIR/events/
AR = "none"  # the draft label of AR runs, as events name it
EVENT_LOG_BYTES = 1 << 40  # the study's event files never rotate: a restart reads one file per part
# study.json's first keys, what its runs were made with: --from-events keeps them from the study.json it remakes
RUN_FACTS = (
    "command",
    "target",
    "device",
    "quantization",
    "gamma",
    "max_new_tokens",
    "max_line_tokens",
    "seed",
    "device_facts",
)


@dataclass
class StudyDraft:
    label: str  # as events name it (drafts.draft_label)
    decoder: SpeculativeDecoder  # the draft at the product's γ policy


def event_key(part: str, event: dict) -> tuple:
    """What makes a run one of the study's: a rerun of the same key replaces it."""
    settings = event.get("settings") or {}
    return (part, event.get("case_id"), event.get("draft"), str(settings.get("gamma")), settings.get("temperature"))


def part_path(out: Path, part: str) -> Path:
    return out / "events" / f"{part}.jsonl"


def read_part(out: Path, part: str) -> dict[tuple, dict]:
    """The events of one part by key, the last of a key winning; a torn last line (a crash) is skipped."""
    path = part_path(out, part)
    events: dict[tuple, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("record") is None:
                events[event_key(part, event)] = event
    return events


def same_study(out: Path, settings: dict) -> None:
    """Record the settings a study's runs were made with (DIR/settings.json), and refuse to go on with others:
    their runs would be pooled with the earlier ones. More cases or drafts may join, and an RQ3 grid later."""
    path = out / "settings.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    used = {k: v for k, v in settings.items() if v not in (None, [])}  # a run without RQ3 sets no grid
    changed = {k: (recorded[k], v) for k, v in used.items() if recorded.get(k) not in (None, [], v)}
    if not changed:
        path.write_text(json.dumps(recorded | used, indent=1))
    else:
        differences = ", ".join(f"{key}: {then} then, {now} now" for key, (then, now) in changed.items())
        raise ValueError(
            f"{out} holds a study made with other settings ({differences}): use another --out, or the same settings"
        )


def per_language(cases: list[Case], count: int) -> list[Case]:
    """The first `count` cases of each language, in case order."""
    seen: dict[str, int] = {}
    picked = []
    for case in cases:
        if seen.get(case.language, 0) < count:
            seen[case.language] = seen.get(case.language, 0) + 1
            picked.append(case)
    return picked


def run_study(
    cases: list[Case],
    ar: SpeculativeDecoder,
    drafts: list[StudyDraft],
    out: str | Path,
    *,
    gamma: str,
    target_name: str,
    device: str,
    max_new_tokens: int = 32,
    max_line_tokens: int = 32,
    max_prompt_tokens: int = 1024,
    rq3_draft: tuple[str, Drafter | None] | None = None,
    gammas: Iterable[int] = (1, 2, 4, 8),
    temperatures: Iterable[float] = (0.0, 0.5, 1.0),
    rq3_per_language: int = 5,
    seed: int = 0,
    max_runs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> int:
    """Decode the runs DIR/events/ does not hold yet, appending each as an event; returns the runs decoded.

    `ar` is the AR decoder (no draft); `rq3_draft` the (label, drafter) of the RQ3 grid, None to skip it.
    `max_runs` stops after that many runs (an RQ3 case's grid counts whole); rerun to go on.
    """
    out = Path(out)
    (out / "events").mkdir(parents=True, exist_ok=True)
    gammas, temperatures = list(gammas), list(temperatures)
    same_study(
        out,
        {
            "target": target_name,
            "gamma": gamma,
            "max_new_tokens": max_new_tokens,
            "max_line_tokens": max_line_tokens,
            "max_prompt_tokens": max_prompt_tokens,
            "rq3_draft": rq3_draft[0] if rq3_draft is not None else None,
            "gammas": gammas,
            "temperatures": temperatures,
            "seed": seed,
        },
    )
    block_done, line_done = read_part(out, "block"), read_part(out, "line")
    decoders = [(AR, "0", ar)] + [(d.label, gamma, d.decoder) for d in drafts]
    todo = [
        (part, case, label, setting, decoder)
        for case in cases
        for label, setting, decoder in decoders
        for part, done in (("block", block_done), ("line", line_done))
        if (part, case.id, label, setting, 0.0) not in done
    ]
    grid = grid_settings(gammas, temperatures)
    rq3_cases: list[Case] = []
    if rq3_draft is not None and rq3_per_language > 0:
        rq3_done = read_part(out, "rq3")
        rq3_label = rq3_draft[0]
        rq3_cases = [
            case
            for case in per_language(cases, rq3_per_language)
            if any(("rq3", case.id, rq3_label if g else AR, str(g), t) not in rq3_done for g, t in grid)
        ]
    runs = 0
    if not todo and not rq3_cases:
        return runs
    say = progress or (lambda _: None)
    for part in PARTS:
        _end_last_line(part_path(out, part))
    logs = {part: EventLog(part_path(out, part), max_bytes=EVENT_LOG_BYTES) for part in PARTS}
    if not logs["block"].enabled:
        raise ValueError("SPECDEC_TELEMETRY turns event writing off; unset it to run a study")
    try:
        prompts: dict[str, list[int]] = {}
        for _, _, decoder in decoders:  # warm-up: allocator, kernels, thread pools; a γ group of its own
            warm_up = DecodeOptions(max_new_tokens=4, gamma_group="warm-up")  # leaves the runs' policy fresh
            _decode(decoder, ar.encode(cases[0].prefix)[-64:], warm_up)
        for part, case, label, setting, decoder in todo:
            if max_runs is not None and runs >= max_runs:
                return runs
            if case.id not in prompts:
                prompts[case.id] = ar.fit_prompt(ar.encode(case.prefix), max_new_tokens, max_prompt_tokens)[0]
            line = part == "line"
            options = DecodeOptions(
                max_new_tokens=max_line_tokens if line else max_new_tokens,
                stop_strings=stop_strings(case.language, multiline=False) if line else (),
                seed=seed,
                gamma_group=f"{case.id}/{part}",  # a fresh γ policy per run: no run depends on the order
            )
            generation, latency_ms = _decode(decoder, prompts[case.id], options)
            stats = generation.stats
            logs[part].write(
                CompletionEvent.from_stats(
                    stats.to_dict(),
                    language=case.language,
                    trigger="invoked",
                    multiline=not line,
                    latency_ms=latency_ms,
                    target=target_name,
                    draft=label,
                    device=device,
                    settings={
                        "gamma": setting,
                        "temperature": 0.0,
                        "max_new_tokens": options.max_new_tokens,
                        "seed": seed,
                        "study": part,
                    },
                    case_id=case.id,
                    source="study",
                )
            )
            runs += 1
            say(f"{part} {case.id} {label}")
        for case in rq3_cases:
            if max_runs is not None and runs >= max_runs:
                return runs
            assert rq3_draft is not None
            runs += run_sweep(
                [case],
                ar.target,
                ar.tokenizer,
                rq3_draft[1],
                logs["rq3"],
                gammas=gammas,
                temperatures=temperatures,
                max_new_tokens=max_new_tokens,
                max_prompt_tokens=max_prompt_tokens,
                target_name=target_name,
                draft_name=rq3_draft[0],
                device=device,
                seed=seed,
                source="study",
                progress=lambda c, g, t: say(f"rq3 {c.id} γ={g} T={t:g}"),
            )
    finally:
        for log in logs.values():
            log.close()
    return runs


def _end_last_line(path: Path) -> None:
    """End a line torn by a crash, so the next event starts a line of its own rather than joining it."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")


def _decode(decoder: SpeculativeDecoder, ids: list[int], options: DecodeOptions):
    decoder.steps.truncate(0)  # cold: decoders on one target may share its cache
    start = time.perf_counter()
    generation = decoder.generate(ids, options)
    return generation, 1000 * (time.perf_counter() - start)


def planned_runs(cases: list[Case], drafts: int, grid: int, rq3_per_language: int) -> int:
    """How many runs a whole study is: AR and each draft, block and line, per case; the grid per RQ3 case."""
    return 2 * (1 + drafts) * len(cases) + grid * len(per_language(cases, rq3_per_language))


def summarize(out: str | Path, **options) -> dict:
    """study.json, study.md and the plots in DIR from DIR/events/ alone; `options` are
    speccomplete.telemetry.analysis.study.summarize_study's (reps, seed, meta, groups, paired_base)."""
    from speccomplete.telemetry.analysis.study import summarize_study

    out = Path(out)
    return summarize_study({part: part_path(out, part) for part in PARTS}, out, **options)


def recorded_facts(out: Path) -> dict:
    """RUN_FACTS of the runs in DIR, as the study that made them recorded them (study.json, else settings.json)."""
    recorded: dict = {}
    for name in ("settings.json", "study.json"):
        if (out / name).exists():
            recorded |= json.loads((out / name).read_text())
    return {key: recorded[key] for key in RUN_FACTS if key in recorded}


def write_summary(out: Path, args: argparse.Namespace, meta: dict) -> int:
    """study.json, study.md, the plots and, unless --no-report, DIR/report/ (`specdec report` on the block runs)."""
    data = summarize(out, reps=args.bootstrap, seed=args.seed, meta=meta)
    if not args.no_report:
        from speccomplete.telemetry.analysis.report import build_report

        build_report([str(part_path(out, "block"))], out / "report", reps=args.bootstrap, seed=args.seed)
    print(f"{data['cases']} cases -> {out / 'study.json'}, {out / 'study.md'}")
    return 0


# --------------------------------------------------------------------------- the command


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("study")
    p.add_argument("--cases", help="the cases (JSONL, `specdec cases`); needed unless --from-events")
    p.add_argument("--out", required=True, help="directory: events/, study.json, study.md, plots (resumes from it)")
    p.add_argument(
        "--from-events",
        action="store_true",
        help="decode nothing and load no model: remake study.json, study.md, the plots and report/ from the "
        "events in --out (the runs' command, target and device kept from its study.json)",
    )
    p.add_argument(
        "--drafts",
        help="drafts compared with AR at the product's γ policy (--gamma), comma-separated draft specs; "
        f"default: those of {','.join(DEFAULT_DRAFTS)} that exist for the target",
    )
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens a block run writes")
    p.add_argument(
        "--max-line-tokens",
        type=int,
        default=ServerOptions.max_tokens_single_line,
        help="token limit of a single-line run (default: the server's, %(default)s)",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--gammas", default="1,2,4,8", help="RQ3: fixed γ values; AR (γ 0) runs too")
    p.add_argument("--temperatures", default="0,0.5,1.0", help="RQ3: sampling temperatures")
    p.add_argument(
        "--rq3-per-language", type=int, default=5, help="RQ3: the grid on the first N cases of each language (0: skip)"
    )
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples")
    p.add_argument("--seed", type=int, default=0, help="sampling and bootstrap seed")
    p.add_argument("--max-runs", type=int, help="stop after this many runs (rerun to go on)")
    p.add_argument("--no-report", action="store_true", help="skip `specdec report` on the block runs (DIR/report/)")
    add_model_args(p)  # --draft: the RQ3 grid's draft; --gamma: the γ policy the drafts run at
    return p


def build_drafts(
    specs: list[str], target, tokenizer, args, explicit: bool, say
) -> list[tuple[str, Drafter | None, Any]]:
    """(label, drafter, draft model) per spec, a label once; a default spec that does not exist for the
    target is left out with a note, a spec given on the command line that does not is an error."""
    from speccomplete.decoder.drafts import build_drafter, draft_label

    built: dict[str, tuple[str, Drafter | None, Any]] = {}
    for spec in specs:
        try:
            label = draft_label(spec, target)
            if label in built or label == AR:
                continue
            drafter, model = build_drafter(spec, target, tokenizer, device=args.device, dtype=args.dtype)
        except ValueError as e:  # DraftLoadError is one
            if explicit:
                raise
            say(f"study: draft {spec} left out: {e}")
            continue
        built[label] = (label, drafter, model)
    return list(built.values())


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from speccomplete.decoder.drafts import draft_label
    from speccomplete.decoder.engine import round_rows
    from speccomplete.decoder.loader import use_cpu_kernels
    from speccomplete.decoder.target_steps import target_steps

    from .lib.facts import device_facts

    out = Path(args.out)
    if args.from_events:
        return write_summary(out, args, recorded_facts(out))
    if not args.cases:
        raise ValueError("--cases is needed to run a study (or --from-events to remake its summary)")
    cases = read_cases(args.cases)
    if not cases:
        raise ValueError(f"no cases in {args.cases}")
    gammas = parse_list(args.gammas, int) if args.rq3_per_language else []
    temperatures = parse_list(args.temperatures, float) if args.rq3_per_language else []
    loaded = load(args, pack=False)
    target, tokenizer = loaded.target, loaded.tokenizer
    say = lambda text: print(text, file=sys.stderr)  # noqa: E731
    explicit = args.drafts is not None
    specs = parse_list(args.drafts, str) if explicit else list(DEFAULT_DRAFTS)
    built = build_drafts(specs, target, tokenizer, args, explicit, say)
    rq3_label = draft_label(args.draft, target)
    rq3_drafter = next((d for label, d, _ in built if label == rq3_label), loaded.decoder.drafter)
    policy = parse_gamma_policy(args.gamma)

    def steps_for(drafter):
        hidden = drafter is not None and drafter.drafts_on_the_target
        taps = drafter.target_taps if drafter is not None else ()
        return target_steps(target, args.steps, round_rows(policy, drafter), hidden=hidden, taps=taps)

    ar_steps = steps_for(None)
    ar = SpeculativeDecoder(target, tokenizer, steps=ar_steps)
    drafts = [
        StudyDraft(
            label,
            SpeculativeDecoder(target, tokenizer, drafter, parse_gamma_policy(args.gamma), steps=steps_for(drafter)),
        )
        for label, drafter, _ in built
    ]
    if not args.no_pack or loaded.quantization == "int8":
        drafters = [loaded.decoder.drafter, *(d for _, d, _ in built)]
        use_cpu_kernels(
            ar_steps,
            target,
            loaded.draft_model,
            *(model for _, _, model in built if model is not None),
            *(module for d in drafters if d is not None for module in d.own_modules),
            int8=loaded.quantization == "int8",
        )
    device = device_name(target)
    grid = len(grid_settings(gammas, temperatures)) if gammas else 0
    total = planned_runs(cases, len(drafts), grid, args.rq3_per_language if gammas else 0)
    done = sum(len(read_part(out, part)) for part in PARTS)
    say(f"study: {len(cases)} cases, drafts {', '.join(d.label for d in drafts)}; {done} of {total} runs done")
    with tqdm(total=total, initial=min(done, total), desc="study", unit="run") as bar:

        def progress(text: str) -> None:
            bar.set_postfix_str(text)
            bar.update(1)

        run_study(
            cases,
            ar,
            drafts,
            out,
            gamma=args.gamma,
            target_name=args.target,
            device=device,
            max_new_tokens=args.max_new_tokens,
            max_line_tokens=args.max_line_tokens,
            max_prompt_tokens=args.max_prompt_tokens,
            rq3_draft=(rq3_label, rq3_drafter) if gammas and rq3_drafter is not None else None,
            gammas=gammas,
            temperatures=temperatures,
            rq3_per_language=args.rq3_per_language,
            seed=args.seed,
            max_runs=args.max_runs,
            progress=progress,
        )
    meta = {
        "command": " ".join(["specdec", *getattr(args, "argv", [])]),
        "target": args.target,
        "device": device,
        "quantization": loaded.quantization,
        "gamma": args.gamma,
        "max_new_tokens": args.max_new_tokens,
        "max_line_tokens": args.max_line_tokens,
        "seed": args.seed,
        "device_facts": device_facts(),
    }
    return write_summary(out, args, meta)
