"""`specdec cases`: code cases from split lists, natural-language cases from package docs."""

from __future__ import annotations

import json
import os
from pathlib import Path

from speccomplete.harness.lib.cases import Case, read_cases, sample_cases, write_cases


def test_cases_round_trip_and_cursor(tmp_path):
    text = "def f(x):\n    return x + 1\n\nfn main() {\n    let y = 2;\n}\n"
    cases = [Case("py-0", "a.py", text, 1, 4), Case("rs-0", "b.rs", text, 4, 4)]
    write_cases(cases, tmp_path / "c.jsonl")
    back = read_cases(tmp_path / "c.jsonl")
    assert [c.__dict__ for c in back] == [c.__dict__ for c in cases]
    assert back[0].prefix.endswith("    ") and back[0].expected_line == "return x + 1"
    assert [c.language for c in back] == ["python", "rust"]


def test_code_and_nl_cases(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    code = package / "m.py"
    code.write_text("".join(f"value_{i} = compute({i})\n" for i in range(20)))
    (package / "README.md").write_text("".join(f"This paragraph explains part {i} of it.\n" for i in range(20)))
    splits = tmp_path / "splits"
    splits.mkdir()
    (splits / "python.dev.txt").write_text(f"{code}\n")
    cases = sample_cases(splits, per_language=1, seed=0, split="dev")
    assert [(c.id, c.language, c.label) for c in cases] == [("python-0", "python", "")]
    # docs go to dev or train by a hash of their directory, like the draft's corpus; one side has it
    nl = [
        c
        for split in ("train", "dev")
        for c in sample_cases(splits, per_language=1, seed=0, split=split, nl_roots=[str(tmp_path)])
        if c.label == "nl"
    ]
    assert len(nl) == 1 and nl[0].language == "nl" and nl[0].path.endswith("README.md")
    assert nl[0].expected_line.startswith("This paragraph explains part")
    write_cases(nl, tmp_path / "cases.jsonl")
    assert read_cases(tmp_path / "cases.jsonl") == nl


def test_neighbours_round_trip(tmp_path):
    text = "def f(x):\n    return x + 1\n"
    open_docs = [{"path": "pkg/util.py", "text": "def g():\n    pass\n"}, {"path": "pkg/ü.py", "text": "é = 1\n"}]
    cases = [Case("py-0", "pkg/a.py", text, 1, 4, neighbours=open_docs), Case("py-1", "pkg/b.py", text, 1, 4)]
    write_cases(cases, tmp_path / "c.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert rows[0]["neighbours"] == open_docs and "neighbours" not in rows[1]  # none: written as before
    assert read_cases(tmp_path / "c.jsonl") == cases
    # a case file from before neighbours existed still loads, with none
    old = {"id": "py-0", "path": "a.py", "text": text, "line": 1, "character": 4, "label": ""}
    (tmp_path / "old.jsonl").write_text(json.dumps(old) + "\n")
    assert read_cases(tmp_path / "old.jsonl")[0].neighbours == []


def _tree(tmp_path):
    """pkg/ with four usable Python files, and what must never open beside them; a lone/ and other/ beside pkg/."""

    def code(name: str) -> str:
        return "".join(f"{name}_{i} = compute({i})  # line {i}\n" for i in range(30))

    root = tmp_path / "repo"
    files = {
        "pkg/a.py": code("a"),
        "pkg/b.py": code("b"),
        "pkg/c.py": code("c"),
        "pkg/d.py": code("d"),
        "pkg/big.py": code("big") * 150,  # over 100,000 bytes: a case may come from it, not a neighbour
        "pkg/nul.py": code("nul") + "\0",
        "pkg/m.rs": code("m"),  # another language in the same directory
        "pkg/sub/e.py": code("e"),
        "lone/x.py": code("x"),  # alone in its directory: its neighbours come from under repo/
        "other/y.py": code("y"),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    splits = tmp_path / "splits"
    splits.mkdir()
    listed = [n for n in files if n.endswith(".py")] + ["pkg/missing.py"]
    (splits / "python.dev.txt").write_text("".join(f"{root / n}\n" for n in listed))
    (splits / "rust.dev.txt").write_text(f"{root / 'pkg/m.rs'}\n")
    return root, splits


def test_neighbours_are_other_files_of_the_directory_and_language(tmp_path):
    root, splits = _tree(tmp_path)
    cases = sample_cases(splits, per_language=20, seed=3, split="dev", neighbours=2)
    by_path = {os.path.relpath(c.path, root): c for c in cases}
    assert {"pkg/a.py", "pkg/big.py", "pkg/sub/e.py", "lone/x.py", "pkg/m.rs"} <= set(by_path)
    usable = {"pkg/a.py", "pkg/b.py", "pkg/c.py", "pkg/d.py"}
    for name, case in by_path.items():
        opened = [os.path.relpath(n["path"], root) for n in case.neighbours]
        assert name not in opened and len(set(opened)) == len(opened)
        for n in case.neighbours:
            assert n["text"] == Path(n["path"]).read_text()
        if name.startswith("pkg/") and name.endswith(".py") and name != "pkg/sub/e.py":
            assert len(opened) == 2 and set(opened) <= usable - {name}  # never big.py, nul.py, m.rs or missing.py
        elif name == "pkg/m.rs":
            assert opened == []  # no other Rust file in its list
    # fewer than 2 in its directory: the rest from under the parent directory, of the same language
    lone = [os.path.relpath(n["path"], root) for n in by_path["lone/x.py"].neighbours]
    assert len(lone) == 2 and set(lone) <= usable | {"pkg/sub/e.py", "other/y.py"}
    sub = [os.path.relpath(n["path"], root) for n in by_path["pkg/sub/e.py"].neighbours]
    assert len(sub) == 2 and set(sub) <= usable
    # deterministic
    again = sample_cases(splits, per_language=20, seed=3, split="dev", neighbours=2)
    assert [(c.path, c.line, c.neighbours) for c in again] == [(c.path, c.line, c.neighbours) for c in cases]


GOLDEN = {  # what sample_cases drew before neighbours existed: (id, path under repo/, line, character)
    0: [
        ("python-0", "lone/x.py", 19, 0),
        ("python-1", "other/y.py", 26, 0),
        ("python-2", "pkg/b.py", 14, 0),
        ("rust-0", "pkg/m.rs", 24, 0),
    ],
    1: [
        ("python-0", "pkg/sub/e.py", 14, 0),
        ("python-1", "other/y.py", 11, 0),
        ("python-2", "lone/x.py", 23, 0),
        ("rust-0", "pkg/m.rs", 8, 0),
    ],
    7: [
        ("python-0", "other/y.py", 24, 0),
        ("python-1", "pkg/d.py", 14, 0),
        ("python-2", "pkg/b.py", 9, 0),
        ("rust-0", "pkg/m.rs", 10, 0),
    ],
}


def test_neighbours_or_none_draw_the_cases_drawn_before_neighbours_existed(tmp_path):
    root, splits = _tree(tmp_path)
    for seed, want in GOLDEN.items():
        cases = sample_cases(splits, per_language=3, seed=seed, split="dev")
        got = [(c.id, os.path.relpath(c.path, root), c.line, c.character) for c in cases]
        assert got == want, seed
        assert all(c.neighbours == [] for c in cases)
        with_neighbours = sample_cases(splits, per_language=3, seed=seed, split="dev", neighbours=2)
        assert [(c.id, os.path.relpath(c.path, root), c.line, c.character) for c in with_neighbours] == want
        assert any(c.neighbours for c in with_neighbours)


def test_mid_line_cases_are_the_same_rows_with_the_cursor_inside_the_text(tmp_path):
    root, splits = _tree(tmp_path)
    for seed, want in GOLDEN.items():
        cases = sample_cases(splits, per_language=3, seed=seed, split="dev", mid_line=True)
        assert [(c.id, os.path.relpath(c.path, root), c.line) for c in cases] == [w[:3] for w in want], seed
        for case in cases:
            row = case.text.split("\n")[case.line]
            typed = case.prefix[case.prefix.rfind("\n") + 1 :]
            assert case.cut and typed.strip() and len(case.expected_line.rstrip()) >= 2
            assert typed + case.expected_line == row
        again = sample_cases(splits, per_language=3, seed=seed, split="dev", mid_line=True)
        assert [(c.path, c.line, c.character) for c in again] == [(c.path, c.line, c.character) for c in cases]
    write_cases(cases, tmp_path / "mid.jsonl")
    assert read_cases(tmp_path / "mid.jsonl") == cases
    assert all(json.loads(line)["cut"] for line in (tmp_path / "mid.jsonl").read_text().splitlines())


def test_line_end_cases_put_the_cursor_at_the_end_of_a_finished_line(tmp_path):
    # blocks whose first line opens a block (the server asks for a block there) and whose others are finished
    block = "def f_{0}(x):\n    y = compute({0}, x)\n    return y + {0}\n\n"
    code = tmp_path / "m.py"
    code.write_text("".join(block.format(i) for i in range(12)))
    splits = tmp_path / "splits"
    splits.mkdir()
    (splits / "python.dev.txt").write_text(f"{code}\n")
    lines = set()
    for seed in range(12):
        (case,) = sample_cases(splits, per_language=1, seed=seed, split="dev", line_end=True)
        row = case.text.split("\n")[case.line]
        assert case.line_end and not case.cut and case.prefix.endswith(row) and case.expected_line == ""
        # only `return` lines are drawn: the line before `y = ...` opens a block (`def f_0(x):`, where the server
        # asks for a block) and the line before `def` is empty
        assert row == f"    y = compute({case.line // 4}, x)" and case.next_line == f"    return y + {case.line // 4}"
        again = sample_cases(splits, per_language=1, seed=seed, split="dev", line_end=True)
        assert (again[0].line, again[0].character) == (case.line, case.character)
        lines.add(case.line)
    assert len(lines) > 1  # the seed draws the line
    write_cases([case], tmp_path / "end.jsonl")
    assert read_cases(tmp_path / "end.jsonl") == [case]
    assert json.loads((tmp_path / "end.jsonl").read_text())["line_end"] is True


def test_refill_gives_a_small_list_more_cursors_at_other_rows(tmp_path):
    root, splits = _tree(tmp_path)
    plain = sample_cases(splits, per_language=4, seed=0, split="dev")
    refilled = sample_cases(splits, per_language=4, seed=0, split="dev", refill=True)
    rust = [c for c in refilled if c.id.startswith("rust")]
    assert [c.id for c in rust] == ["rust-0", "rust-1", "rust-2", "rust-3"]  # one file, four rows
    assert {c.path for c in rust} == {str(root / "pkg/m.rs")} and len({c.line for c in rust}) == 4
    # a list with enough files draws as without refill, and the first cursor of each file is the same
    python = [c for c in refilled if c.id.startswith("python")]
    assert [(c.path, c.line) for c in python] == [(c.path, c.line) for c in plain if c.id.startswith("python")]
    assert [c for c in plain if c.id.startswith("rust")][0].line == rust[0].line
