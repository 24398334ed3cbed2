"""What the subcommands write: files whole or not at all, and numbers in their tables and JSON."""

from __future__ import annotations

import json
import os


def write_json(data: dict, path: str) -> None:
    """Whole or not at all (a time cap may stop a run while it writes): into a side file, then renamed."""
    write_whole(path, json.dumps(data, indent=1))


def write_whole(path: str, text: str) -> None:
    """`text` into `path` through a side file renamed over it: a reader sees the old file or the new one."""
    side = f"{path}.writing"
    with open(side, "w") as f:
        f.write(text)
    os.replace(side, path)


def number(value: float | None, digits: int = 0) -> str:
    """A table's cell: the value with `digits` decimals, "-" where there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def rounded(value: float | None, digits: int) -> float | None:
    """A JSON number to `digits` decimals; None stays None."""
    return None if value is None else round(value, digits)
