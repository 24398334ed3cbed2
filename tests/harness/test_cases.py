"""`specdec cases`: code cases from split lists, natural-language cases from package docs."""

from __future__ import annotations

from speccomplete.harness.cases import Case, read_cases, sample_cases, write_cases


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
