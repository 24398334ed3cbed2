"""The ratchet: a draft that came back from a lent GPU becomes the shipped EAGLE-3 draft when it is better than the
draft it started from, whatever a CPU bench says, so that the next lending continues from it and nothing is lost.

    python -m tools.ratchet FILES_AT                 # FILES_AT: the train call's files (train.json, draft/)
    python -m tools.ratchet FILES_AT --install       # and copy the new draft into decoder/weights/

It joins the returned parts into a commit-ready folder (`--out`, default out/ratchet/<draft>) and checks their
hash against train.json; checks the training started from the shipped draft (`--init draft:...<draft>`); and
compares the dev acceptance after training with the dev acceptance of the draft it started from, both measured in
that run on the same dev sequences (train.json's dev_after and dev_before, "all", expected acceptance at step 0).
Higher: the folder gets the returned config.json, card (README.md) and weights, the shipped folder's licence
files, and lineage.json, the shipped draft's lineage with this lending added (its tokens, tokens/s, the corpus
text it trained on, from the pack's plan, and the dev acceptance per language before and after); the card gains a
table of that lineage. Not higher: nothing is written, and it exits 1. Whether the new draft becomes the product's
default is a separate decision, made by the CPU bench (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

from tools.gpu.returns import join_parts, sha256_file

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "decoder" / "weights" / "gemma3-270m-eagle3"
WEIGHTS = "model.safetensors"
LINEAGE = "lineage.json"
LICENCE_FILES = ("NOTICE", "GEMMA_TERMS.txt")
CARD_LINEAGE = "## Lineage"  # the card's section this tool writes


class RatchetRefused(ValueError):
    """The returned draft is not taken: unreadable, not what the machine wrote, or not better."""


def overall_acceptance(dev: dict | None, which: str) -> float:
    if not dev or "all" not in dev:
        raise RatchetRefused(f"train.json has no dev_{which} for all languages: the run measured no dev acceptance")
    return float(dev["all"]["expected_acceptance"])


def started_from(command: str) -> str | None:
    """The draft folder a train command continued from (`--init draft:FOLDER`), or None."""
    words = shlex.split(command)
    for flag, value in zip(words, words[1:]):
        if flag == "--init" and value.startswith("draft:"):
            return value.removeprefix("draft:")
    return None


def read_lineage(shipped: Path) -> dict[str, Any]:
    """The shipped draft's lineage; a draft without one was trained where no lending was (its config says how)."""
    path = shipped / LINEAGE
    if path.is_file():
        return json.loads(path.read_text())
    config = json.loads((shipped / "config.json").read_text()).get("specdec", {})
    tokens = int(config.get("tokens_seen", 0))
    return {"tokens": tokens, "lendings": [], "before_lendings": {"tokens": tokens, "command": config.get("command")}}


def per_language(dev: dict) -> dict[str, float]:
    return {language: round(float(m["expected_acceptance"]), 4) for language, m in sorted(dev.items())}


def lending_record(summary: dict, date: str | None, plan: dict | None) -> dict[str, Any]:
    facts = summary.get("device") or {}
    packed = (plan or {}).get("corpus") or {}
    # how far into each language's seeded file order the lending's pack took text: the next pack starts there
    corpus = {"seed": packed["seed"], "files_taken": packed["files_taken"]} if "files_taken" in packed else None
    return {
        "date": date or (facts.get("date_utc") or "")[:10] or None,
        "device": facts.get("gpu") or facts.get("cpu"),
        "tokens": int(summary["tokens"]),
        "tokens_per_s": round(float(summary.get("tokens_per_s") or 0)),
        "steps": summary.get("steps"),
        "corpus": corpus,
        "model_sha256": summary["model_sha256"],
        "dev_before": per_language(summary["dev_before"]),
        "dev_after": per_language(summary["dev_after"]),
    }


def lineage_table(lineage: dict) -> str:
    rows = [
        CARD_LINEAGE,
        "",
        f"Trained on {lineage['tokens']:,} tokens in all, over {len(lineage['lendings'])} lent GPU session(s) after "
        f"{lineage.get('before_lendings', {}).get('tokens', 0):,} before them (`lineage.json`, written by "
        "`python -m tools.ratchet`). Dev acceptance: Σmin(p,q) at step 0 on that session's dev sequences, all "
        "languages, for the draft it started from and for the one it returned.",
        "",
        "| date | device | tokens | tokens/s | in all | dev acceptance before → after |",
        "|---|---|---|---|---|---|",
    ]
    total = lineage.get("before_lendings", {}).get("tokens", 0)
    for lending in lineage["lendings"]:
        total += lending["tokens"]
        rows.append(
            f"| {lending['date'] or '?'} | {lending['device'] or '?'} | {lending['tokens']:,} "
            f"| {lending['tokens_per_s']:,} | {total:,} "
            f"| {lending['dev_before']['all']:.3f} → {lending['dev_after']['all']:.3f} |"
        )
    latest = lineage["lendings"][-1] if lineage["lendings"] else None
    if latest:
        rows += ["", "| language | before | after |", "|---|---|---|"]
        rows += [
            f"| {lang} | {latest['dev_before'][lang]:.3f} | {latest['dev_after'][lang]:.3f} |"
            for lang in latest["dev_after"]
            if lang in latest["dev_before"]
        ]
    return "\n".join(rows) + "\n"


def ratchet(files: Path, shipped: Path, out: Path, date: str | None = None, plan: dict | None = None) -> dict[str, Any]:
    """Write the commit-ready folder `out` from the returned `files`, or raise RatchetRefused."""
    summary_path = files / "train.json"
    if not summary_path.is_file():
        raise RatchetRefused(f"no train.json in {files}")
    summary = json.loads(summary_path.read_text())
    origin = started_from(summary.get("command", ""))
    if origin is None or Path(origin).name != shipped.name:
        raise RatchetRefused(
            f"the run did not continue from the shipped draft {shipped.name} (--init {origin or 'fresh'}): "
            "its dev acceptance before says nothing of the shipped draft"
        )
    before = overall_acceptance(summary.get("dev_before"), "before")
    after = overall_acceptance(summary.get("dev_after"), "after")
    if after <= before:
        raise RatchetRefused(f"dev acceptance {after:.3f} after training is not above {before:.3f} before it")
    returned = files / "draft"
    if not any(returned.glob(f"{WEIGHTS}.part-*")):
        raise RatchetRefused(f"no {WEIGHTS}.part-* in {returned}: the train call returned no draft")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if sha256_file(join_parts(returned, WEIGHTS, into=out / WEIGHTS)) != summary["model_sha256"]:
        shutil.rmtree(out)
        raise RatchetRefused("the joined weights' sha256 is not train.json's model_sha256: a part is missing or bad")
    for name in ("config.json", "README.md"):
        shutil.copy2(returned / name, out / name)
    for name in LICENCE_FILES:
        if (shipped / name).is_file():
            shutil.copy2(shipped / name, out / name)
    lineage = read_lineage(shipped)
    lineage["lendings"].append(lending_record(summary, date, plan))
    lineage["tokens"] = lineage["tokens"] + int(summary["tokens"])
    (out / LINEAGE).write_text(json.dumps(lineage, indent=1) + "\n")
    card = (out / "README.md").read_text()
    card = card.split(f"\n{CARD_LINEAGE}\n")[0].rstrip() + "\n\n" + lineage_table(lineage)
    (out / "README.md").write_text(card)
    return {"before": before, "after": after, "tokens": lineage["tokens"], "folder": str(out)}


def install(folder: Path, shipped: Path) -> None:
    """Replace the shipped draft's files with `folder`'s (its licence files stay)."""
    for file in folder.iterdir():
        shutil.copy2(file, shipped / file.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", type=Path, help="the train call's returned files: train.json and draft/")
    parser.add_argument("--shipped", type=Path, default=SHIPPED, help="the shipped draft folder it continued from")
    parser.add_argument("--out", type=Path, help="the commit-ready folder (default: out/ratchet/<draft>)")
    parser.add_argument("--date", help="the lending's date (default: the one train.json's device facts give)")
    parser.add_argument("--install", action="store_true", help="copy the new draft into the shipped folder")
    parser.add_argument(
        "--plan",
        type=Path,
        default=REPO / ".carry" / "plan.json",
        help="the pack's plan.json (tools/gpu/pack.py): which text the lending trained on, for the next pack",
    )
    args = parser.parse_args(argv)
    out = args.out or REPO / "out" / "ratchet" / args.shipped.name
    plan = json.loads(args.plan.read_text()) if args.plan.is_file() else None
    if plan is None:
        print(f"ratchet: no pack plan at {args.plan}: the lineage will not say which text this lending saw")
    try:
        result = ratchet(args.files, args.shipped, out, args.date, plan)
    except RatchetRefused as e:
        print(f"ratchet: kept the shipped draft: {e}", file=sys.stderr)
        return 1
    print(
        f"ratchet: dev acceptance {result['before']:.3f} -> {result['after']:.3f}; {result['tokens']:,} tokens in "
        f"all; the new draft is in {out}"
    )
    if args.install:
        install(out, args.shipped)
        print(f"ratchet: installed into {args.shipped}; commit it")
    else:
        print(f"ratchet: python -m tools.ratchet {args.files} --install puts it in {args.shipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
