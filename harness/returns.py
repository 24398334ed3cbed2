"""What a command run on a lent GPU brings back through the device tool's $OUT: a summary JSON with the
machine's facts beside the numbers, and large files cut into parts the tool returns (16 MiB a file at most).

Each command that runs there writes its own summary (`--summary FILE`), so gpu/step.sh keeps only the calls.
"""

from __future__ import annotations

import hashlib
import json
import platform
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PART_BYTES = 15 * 2**20  # under the tool's 16 MiB a file


def device_facts() -> dict[str, Any]:
    """Where and when: the date, Python, torch and transformers versions, and the GPU as nvidia-smi names it."""

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    try:
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        gpu = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        gpu = None
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(),
        "torch": installed("torch"),
        "transformers": installed("transformers"),
        "gpu": gpu,
        "cpu": _cpu_model(),
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def write_summary(path: str | Path, rows: dict[str, Any]) -> dict[str, Any]:
    """Write `rows` and the device facts as JSON to `path`; returns what was written."""
    summary = rows | {"device": device_facts()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(2**22):
            digest.update(block)
    return digest.hexdigest()


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
