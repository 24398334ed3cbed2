"""Completion cases: a document and an LSP cursor position, one JSON object per line.

`{"id": str, "path": str, "text": str, "line": int, "character": int}`, optionally `"label"` (a
language label that overrides detection, e.g. "nl"), `"neighbours"` (`[{"path": str, "text": str}]`:
other files open in the editor, as its other tabs; written only when there are some), `"workspace"` (the
folder of its project, whose other files `specdec bench --compare-workspace` lets a lookup copy from) and
`"cut": true`.
Cases drawn from the corpus dev split put the cursor after the indentation of a real line, so the rest of
that line is the ground truth for next-line exact match; with `--mid-line`, inside the same line's text
instead (the user paused while typing it), marked `cut`: the rest of the line is the ground truth; with
`--line-end`, at the end of the line before it, a finished line (the server answers it with a single line), marked
`line_end`: the next line, cut out, is the ground truth (the user paused after finishing a line).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from speccomplete.server.language import detect_language
from speccomplete.server.positions import offset_at, utf16_len
from speccomplete.server.prompt import build_prompt


@dataclass
class Case:
    id: str
    path: str
    text: str
    line: int
    character: int
    label: str = ""  # a language label that overrides detection: "nl" for README and docs cases
    neighbours: list[dict] = field(default_factory=list)  # other open documents: {"path": str, "text": str}
    cut: bool = False  # the rest of the cursor's line is the reference, cut out before the request (mid-line)
    line_end: bool = False  # at the end of a finished line: the next line is the reference, cut out before the request
    workspace: str = ""  # the folder of the case's project, whose other files a lookup may copy from

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

    @property
    def next_line(self) -> str:
        """The line after the cursor's ("" for the last line)."""
        rest = self.text[self.offset :]
        return rest.split("\n", 2)[1] if rest.count("\n") else ""


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
            row = dict(case.__dict__)
            if not row["neighbours"]:
                del row["neighbours"]  # case files without open documents stay as they were
            for flag in ("cut", "line_end", "workspace"):
                if not row[flag]:
                    del row[flag]
            f.write(json.dumps(row) + "\n")


def sample_cases(
    splits_dir: str | Path,
    per_language: int,
    seed: int = 0,
    split: str = "dev",
    nl_roots: list[str] | None = None,
    neighbours: int = 0,
    mid_line: bool = False,
    line_end: bool = False,
    refill: bool = False,
    workspace_roots: list[str] | None = None,
) -> list[Case]:
    """Pick files from `<lang>.<split>.txt` lists and a cursor inside each, deterministically.

    With `nl_roots`, also natural-language cases (READMEs and docs under those package roots, the
    same split rule as the draft corpus); their language is detected as "text". With `neighbours`,
    each case also carries up to that many other files of its list as open documents (`_neighbours`),
    drawn apart from the cases: the same seed draws the same cases with and without them. With `mid_line`,
    the cursor is inside the same lines' text, at a point drawn from the file and line alone (`_mid_line`). With
    `line_end`, the cursor is at the end of the line before the drawn one, drawn among lines whose previous line is
    finished (`_finished`): other lines than without it. With `refill`, a list with fewer usable files than
    `per_language` gives its files more cursors, at other rows, until it has `per_language` cases.
    """
    rng = random.Random(seed)
    pick = partial(
        _pick, count=per_language, rng=rng, neighbours=neighbours, mid_line=mid_line, line_end=line_end, refill=refill
    )
    cases = []
    for listing in sorted(Path(splits_dir).glob(f"*.{split}.txt")):
        language = listing.name.split(".")[0]
        files = [p for p in listing.read_text().splitlines() if p.strip()]
        rng.shuffle(files)
        cases += pick(files, language, language)
    if nl_roots:
        from speccomplete.decoder.training.corpus import nl_documents

        files = [doc.source for doc in nl_documents(nl_roots, split)]
        rng.shuffle(files)
        cases += pick(files, "nl", "text")
    for case in cases:
        roots = [root for root in workspace_roots or () if Path(case.path).is_relative_to(root)]
        case.workspace = max(roots, key=len, default="")
    return cases


def _pick(
    files: list[str],
    label: str,
    language: str,
    count: int,
    rng: random.Random,
    max_prefix_chars: int = 3000,
    min_line_chars: int = 10,
    neighbours: int = 0,
    mid_line: bool = False,
    line_end: bool = False,
    refill: bool = False,
) -> list[Case]:
    """Up to `count` cases from `files` in `language`, the cursor after the indentation of a real line (or
    inside its text: `mid_line`; or at the end of the finished line before it: `line_end`); each with up to
    `neighbours` other files of `files` as open documents. With `refill`, the files that gave a case give
    another, pass after pass, while there are fewer than `count`."""
    cases: list[Case] = []
    drawn_rows: dict[str, set[int]] = {}  # file -> the rows drawn from it

    def draw(file: str) -> Case | None:
        """A case of `file` at a row not drawn from it yet; None where it has none."""
        text = _read_source(file, 500_000)
        if text is None or detect_language(file) != language:
            return None
        lines = text.split("\n")
        taken = drawn_rows.get(file, set())
        candidates, offset = [], 0
        for number, row in enumerate(lines):
            if number >= 8 and offset <= max_prefix_chars and len(row.strip()) >= min_line_chars:
                candidates.append(number)
            offset += len(row) + 1
        candidates = [n for n in candidates if n not in taken]
        if line_end:
            candidates = [n for n in candidates if lines[n - 1].strip() and not lines[n - 1].endswith("\r")]
        drawn = rng.choice(candidates) if candidates else None
        while line_end and drawn is not None and not _finished(text, lines, drawn, language):
            candidates.remove(drawn)  # the server asks for a block at the end of its previous line: draw again
            drawn = rng.choice(candidates) if candidates else None
        if drawn is None:
            return None
        drawn_rows.setdefault(file, set()).add(drawn)
        label_if_other = label if label != language else ""
        if line_end:
            row = lines[drawn - 1]
            case = Case(f"{label}-{len(cases)}", file, text, drawn - 1, utf16_len(row), label_if_other, line_end=True)
        else:
            row = lines[drawn]
            column = _mid_line(file, drawn, row) if mid_line else len(row) - len(row.lstrip())
            case = Case(
                f"{label}-{len(cases)}", file, text, drawn, utf16_len(row[:column]), label_if_other, cut=mid_line
            )
        if neighbours > 0:
            # a generator of its own: the cases drawn are the same with and without neighbours
            choose = random.Random(file)
            case.neighbours = _neighbours(file, files, language, neighbours, choose)
        return case

    # one cursor a file, in the shuffled order; with `refill`, then another for each file that gave one
    sources = files
    while len(cases) < count and sources:
        before = len(cases)
        for file in sources:
            if len(cases) == count:
                break
            case = draw(file)
            if case is not None:
                cases.append(case)
        if len(cases) == before or not refill:
            break
        sources = [file for file in files if file in drawn_rows]
    return cases


def _finished(text: str, lines: list[str], number: int, language: str) -> bool:
    """Whether the line before row `number` is finished: with that row cut out and the cursor at the end of the
    line before, the server would ask for a single line (not a block opener, not an empty line)."""
    offset = sum(len(row) + 1 for row in lines[:number]) - 1
    document = text[:offset] + text[offset + 1 + len(lines[number]) :]
    return not build_prompt(document, offset, language).multiline


def _mid_line(file: str, number: int, row: str) -> int:
    """A cursor inside the row's text, where typing might pause: at least one character typed after the
    indentation and two left. Drawn from the file and row alone, so the rows drawn are those without it."""
    start = len(row) - len(row.lstrip()) + 1
    return random.Random(f"{file}:{number}").randint(start, len(row.rstrip()) - 2)


def _neighbours(file: str, listing: list[str], language: str, count: int, rng: random.Random) -> list[dict]:
    """Up to `count` other files of `listing` open beside `file`, as `{"path", "text"}`: first those in its
    directory, then, if too few, others under the parent directory; each of `language`, readable, at most
    100,000 bytes and without NUL bytes. Candidates are sorted, then shuffled with `rng` (deterministic)."""
    own = Path(file)
    near = sorted({p for p in listing if p.strip() and Path(p) != own and Path(p).is_relative_to(own.parent.parent)})
    near = [p for p in near if detect_language(p) == language]
    same_dir = [p for p in near if Path(p).parent == own.parent]
    elsewhere = [p for p in near if Path(p).parent != own.parent]
    rng.shuffle(same_dir)
    rng.shuffle(elsewhere)
    chosen: list[dict] = []
    for path in same_dir + elsewhere:
        if len(chosen) == count:
            break
        text = _read_source(path, 100_000)
        if text is not None:
            chosen.append({"path": path, "text": text})
    return chosen


def _read_source(path: str, max_bytes: int) -> str | None:
    """The file's text, or None where it cannot be read, is over `max_bytes` or holds a NUL byte."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    if len(raw) > max_bytes or b"\0" in raw:
        return None
    return raw.decode("utf-8", errors="replace")
