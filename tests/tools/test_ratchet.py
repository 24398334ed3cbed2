"""The ratchet (tools/ratchet.py): a draft back from a lent GPU is taken when its dev acceptance rose over the draft
it continued from, joined and checked, its lineage carried on; otherwise nothing is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools import ratchet
from tools.gpu.returns import sha256_file, split_into_parts

WEIGHTS = b"weights of the trained draft " * 1000


def shipped_draft(root: Path) -> Path:
    folder = root / "weights" / "tiny-eagle3"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"specdec": {"tokens_seen": 1000, "command": "train here"}}))
    (folder / "model.safetensors").write_bytes(b"old weights")
    (folder / "README.md").write_text("# the old card\n")
    (folder / "NOTICE").write_text("licence notice\n")
    return folder


def returned_files(root: Path, before: float, after: float, init: str = "draft:decoder/weights/tiny-eagle3") -> Path:
    """What a train call brings back: train.json and draft/ with the weights in parts."""
    files = root / "files"
    draft = files / "draft"
    draft.mkdir(parents=True)
    (draft / "config.json").write_text(json.dumps({"specdec": {"tokens_seen": 5000}}))
    (draft / "README.md").write_text("# EAGLE-3 draft\n\nthe trainer's card\n")
    whole = root / "model.safetensors"
    whole.write_bytes(WEIGHTS)
    assert len(split_into_parts(whole, draft, part_bytes=10_000)) == 3
    summary = {
        "tokens": 5000,
        "steps": 10,
        "tokens_per_s": 1234.5,
        "command": f"specdec train-eagle3 --online --init {init} --max-minutes 7",
        "dev_before": {"all": {"expected_acceptance": before}, "python": {"expected_acceptance": before - 0.01}},
        "dev_after": {"all": {"expected_acceptance": after}, "python": {"expected_acceptance": after + 0.01}},
        "model_sha256": sha256_file(whole),
        "device": {"date_utc": "2026-11-29T03:00:00Z", "gpu": "NVIDIA H200, 580, 143771 MiB"},
    }
    (files / "train.json").write_text(json.dumps(summary))
    return files


def test_a_draft_whose_dev_acceptance_rose_is_taken_and_its_lineage_carried_on(tmp_path):
    shipped = shipped_draft(tmp_path)
    files = returned_files(tmp_path, before=0.18, after=0.48)
    out = tmp_path / "out"
    plan = tmp_path / "plan.json"  # the pack's: how far into each language's seeded file order it took text
    plan.write_text(json.dumps({"corpus": {"seed": 0, "files_taken": {"python": 12, "rust": 7}}}))
    assert ratchet.main([str(files), "--shipped", str(shipped), "--out", str(out), "--plan", str(plan)]) == 0
    assert (out / "model.safetensors").read_bytes() == WEIGHTS
    assert (out / "NOTICE").read_text() == "licence notice\n"  # the licence files stay with the weights
    lineage = json.loads((out / "lineage.json").read_text())
    assert lineage["tokens"] == 6000 and lineage["before_lendings"]["tokens"] == 1000
    (lending,) = lineage["lendings"]
    assert lending["date"] == "2026-11-29" and lending["device"].startswith("NVIDIA H200")
    assert lending["dev_before"] == {"all": 0.18, "python": 0.17} and lending["dev_after"]["all"] == 0.48
    assert lending["corpus"] == {"seed": 0, "files_taken": {"python": 12, "rust": 7}}  # the next pack skips these
    card = (out / "README.md").read_text()
    assert card.startswith("# EAGLE-3 draft") and "| 2026-11-29 | NVIDIA H200" in card and "0.180 → 0.480" in card
    assert (shipped / "model.safetensors").read_bytes() == b"old weights"  # nothing installed without --install

    # the next lending continues the lineage, and --install puts the draft in place
    files2 = returned_files(tmp_path / "next", before=0.48, after=0.55)
    assert (
        ratchet.main([str(files), "--shipped", str(shipped), "--out", str(out), "--install", "--plan", str(plan)]) == 0
    )
    assert (
        ratchet.main(
            [str(files2), "--shipped", str(shipped), "--out", str(tmp_path / "out2"), "--plan", str(tmp_path / "none")]
        )
        == 0
    )
    lineage = json.loads((tmp_path / "out2" / "lineage.json").read_text())
    assert lineage["tokens"] == 11000 and len(lineage["lendings"]) == 2
    assert (tmp_path / "out2" / "README.md").read_text().count("## Lineage") == 1


@pytest.mark.parametrize(
    ("before", "after", "init", "why"),
    [
        (0.48, 0.47, "draft:decoder/weights/tiny-eagle3", "not above"),
        (0.18, 0.48, "fresh", "did not continue from the shipped draft"),
        (0.18, 0.48, "draft:decoder/weights/another-eagle3", "did not continue from the shipped draft"),
    ],
)
def test_a_draft_that_is_not_better_than_its_start_is_not_taken(tmp_path, capsys, before, after, init, why):
    shipped = shipped_draft(tmp_path)
    files = returned_files(tmp_path, before, after, init)
    assert (
        ratchet.main(
            [str(files), "--shipped", str(shipped), "--out", str(tmp_path / "out"), "--plan", str(tmp_path / "none")]
        )
        == 1
    )
    assert why in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_parts_that_do_not_join_into_what_the_machine_wrote_are_refused(tmp_path, capsys):
    shipped = shipped_draft(tmp_path)
    files = returned_files(tmp_path, before=0.18, after=0.48)
    part = sorted((files / "draft").glob("model.safetensors.part-*"))[1]
    part.write_bytes(part.read_bytes()[:-1])
    assert (
        ratchet.main(
            [str(files), "--shipped", str(shipped), "--out", str(tmp_path / "out"), "--plan", str(tmp_path / "none")]
        )
        == 1
    )
    assert "sha256" in capsys.readouterr().err and not (tmp_path / "out").exists()
