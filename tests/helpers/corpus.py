"""Source files on disk, laid out the way `specdec corpus` reads them."""

from __future__ import annotations

from pathlib import Path


def write_python_splits(root: Path, files: int) -> Path:
    """`root/splits` with python.train.txt and python.dev.txt, each listing `files` small Python sources
    (what `specdec corpus --splits` reads); returns the splits folder."""
    source = "def add(a, b):\n    return a + b\n\nprint(add(1, 2))\n" * 8
    splits = root / "splits"
    splits.mkdir()
    for split in ("train", "dev"):
        paths = []
        for i in range(files):
            path = root / f"{split}{i}.py"
            path.write_text(source.replace("add", f"add{i}"))
            paths.append(str(path))
        (splits / f"python.{split}.txt").write_text("\n".join(paths) + "\n")
    return splits
