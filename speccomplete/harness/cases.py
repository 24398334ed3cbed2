"""Completion cases: a document and an LSP cursor position, one JSON object per line.

`{"id": str, "path": str, "text": str, "line": int, "character": int}`, optionally `"label"` (a
language label that overrides detection, e.g. "nl"). Cases drawn from the corpus dev split put the
cursor after the indentation of a real line, so the rest of that line is the ground truth for
next-line exact match.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

from speccomplete.server.language import detect_language
from speccomplete.server.positions import offset_at, utf16_len


@dataclass
class Case:
    id: str
    path: str
    text: str
    line: int
    character: int
    label: str = ""  # a language label that overrides detection: "nl" for README and docs cases

    @property
    def language(self) -> str:
        return self.label or detect_language(self.path, text=self.text)

    @property
    def offset(self) -> int:
        return offset_at(self.text, self.line, self.character)

    @property
    def prefix(self) -> str:
        return self.text[: self.offset]

    @property
    def expected_line(self) -> str:
        rest = self.text[self.offset :]
        return rest.split("\n", 1)[0]


def read_cases(path: str | Path) -> list[Case]:
    cases = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                cases.append(Case(**json.loads(line)))
            except (TypeError, ValueError) as e:
                raise ValueError(f"{path}:{number}: not a case ({e})") from None
    return cases


def write_cases(cases: list[Case], path: str | Path) -> None:
    with open(path, "w") as f:
        for case in cases:
            f.write(json.dumps(case.__dict__) + "\n")


def sample_cases(
    splits_dir: str | Path, per_language: int, seed: int = 0, split: str = "dev", nl_roots: list[str] | None = None
) -> list[Case]:
    """Pick files from `<lang>.<split>.txt` lists and a cursor inside each, deterministically.

    With `nl_roots`, also natural-language cases (READMEs and docs under those package roots, the
    same split rule as the draft corpus); their language is detected as "text".
    """
    rng = random.Random(seed)
    cases = []
    for listing in sorted(Path(splits_dir).glob(f"*.{split}.txt")):
        language = listing.name.split(".")[0]
        files = [p for p in listing.read_text().splitlines() if p.strip()]
        rng.shuffle(files)
        cases += _pick(files, language, language, per_language, rng)
    if nl_roots:
        from speccomplete.decoder.training.corpus import nl_documents

        files = [doc.source for doc in nl_documents(nl_roots, split)]
        rng.shuffle(files)
        cases += _pick(files, "nl", "text", per_language, rng)
    return cases


def _pick(
    files: list[str],
    label: str,
    language: str,
    count: int,
    rng: random.Random,
    max_prefix_chars: int = 3000,
    min_line_chars: int = 10,
) -> list[Case]:
    """Up to `count` cases from `files` in `language`, the cursor after the indentation of a real line."""
    cases: list[Case] = []
    for file in files:
        if len(cases) == count:
            break
        try:
            raw = Path(file).read_bytes()
        except OSError:
            continue
        if len(raw) > 500_000 or b"\0" in raw or detect_language(file) != language:
            continue
        text = raw.decode("utf-8", errors="replace")
        lines = text.split("\n")
        candidates, offset = [], 0
        for number, row in enumerate(lines):
            if number >= 8 and offset <= max_prefix_chars and len(row.strip()) >= min_line_chars:
                candidates.append(number)
            offset += len(row) + 1
        if not candidates:
            continue
        number = rng.choice(candidates)
        row = lines[number]
        indent = row[: len(row) - len(row.lstrip())]
        cases.append(
            Case(f"{label}-{len(cases)}", file, text, number, utf16_len(indent), label if label != language else "")
        )
    return cases


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("cases", help="sample completion cases from corpus split lists")
    p.add_argument("--splits", required=True, help="directory of <lang>.<split>.txt lists of source files")
    p.add_argument("--split", default="dev")
    p.add_argument("--per-language", type=int, default=2)
    p.add_argument("--nl-roots", help="ROOTS.txt of the corpus: also sample natural-language (README/docs) cases")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    return p


def run(args: argparse.Namespace) -> int:
    nl_roots = None
    if args.nl_roots:
        from speccomplete.decoder.training.corpus import package_roots

        nl_roots = package_roots(args.nl_roots)
    cases = sample_cases(args.splits, args.per_language, seed=args.seed, split=args.split, nl_roots=nl_roots)
    write_cases(cases, args.out)
    print(f"wrote {len(cases)} cases to {args.out}")
    return 0
