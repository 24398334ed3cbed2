"""The machine a command ran on, beside its numbers: the facts every summary and benchmark JSON carries (`--summary`
of eval, finetune and train-eagle3; `device_facts` in bench, stepcost and study JSON; tests/conftest.py's
--summary-json), so a file read later, a lent GPU's among them, says where and when it was measured."""

from __future__ import annotations

import json
import platform
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any


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
