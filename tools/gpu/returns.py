"""What a lent GPU brings back through the device tool's $OUT: large files cut into parts the tool returns (16 MiB a
file at most), joined again here; and the hash that checks them.

    python tools/gpu/returns.py split FILE DEST   # FILE into DEST/NAME.part-00, -01, ... (gpu/step.sh, after training)

Standard library only, and importable on its own: gpu/step.sh runs it by its path on the machine, where
PYTHONSAFEPATH keeps the repo root (and so `tools`) off the path. Here, `tools.gpu.returns` (the pack, the ratchet).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

PART_BYTES = 15 * 2**20  # under the tool's 16 MiB a file


def sha256_file(path: str | Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def split_into_parts(path: str | Path, folder: str | Path, part_bytes: int = PART_BYTES) -> list[str]:
    """Cut `path` into `folder`/NAME.part-00, -01, ... of at most `part_bytes`; returns the part names.

    `cat NAME.part-* > NAME` joins them (`join_parts`)."""
    path, folder = Path(path), Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{path.name}.part-*"):
        old.unlink()
    names: list[str] = []
    with open(path, "rb") as f:
        while block := f.read(part_bytes):
            name = f"{path.name}.part-{len(names):02d}"
            (folder / name).write_bytes(block)
            names.append(name)
    return names


def join_parts(folder: str | Path, name: str, into: str | Path | None = None) -> Path:
    """Join `folder`/NAME.part-* back into `folder`/NAME and remove the parts; or, given `into`, into that file
    and leave the parts (a folder the device tool brought back is read-only)."""
    folder = Path(folder)
    parts = sorted(folder.glob(f"{name}.part-*"))
    if not parts:
        raise FileNotFoundError(f"no {name}.part-* in {folder}")
    joined = Path(into) if into is not None else folder / name
    with open(joined, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    if into is None:
        for part in parts:
            part.unlink()
    return joined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/gpu/returns.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    split = sub.add_parser("split", help=f"cut FILE into DEST/NAME.part-NN of {PART_BYTES // 2**20} MiB at most")
    split.add_argument("file", type=Path)
    split.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    parts = split_into_parts(args.file, args.dest)
    print(f"returns: {args.file.name} in {len(parts)} parts into {args.dest}: {' '.join(parts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
