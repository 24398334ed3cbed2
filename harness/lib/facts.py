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
        **cpu_facts(),
    }


CPUINFO = Path("/proc/cpuinfo")
# The vector extensions that decide which kernels run and how fast (decoder/int8_rows.py, oneDNN, Inductor):
# "AMD EPYC" alone has named three kinds of host here, one with AVX2 only, two with AVX-512 VNNI.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8", "amx_bf16")


def cpu_facts() -> dict[str, Any]:
    """The CPU as /proc/cpuinfo names it (`lscpu`'s model name), its family and model numbers (which tell apart
    hosts of one name), and which of ISA_FLAGS it has."""
    fields: dict[str, str] = {}
    try:
        for line in CPUINFO.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    flags = set(fields.get("flags", "").split())
    return {
        "cpu": fields.get("model name") or platform.processor() or None,
        "cpu_family_model": f"{fields['cpu family']}/{fields.get('model')}" if "cpu family" in fields else None,
        "cpu_isa": [flag for flag in ISA_FLAGS if flag in flags],
    }


def cpu_line(facts: dict[str, Any]) -> str:
    """The CPU for a table's header: `AMD EPYC (26/2: avx2 fma avx512f avx512_vnni)`."""
    parts = [f"{facts['cpu_family_model']}:"] if facts.get("cpu_family_model") else []
    parts += facts.get("cpu_isa") or []
    return f"{facts.get('cpu')} ({' '.join(parts)})" if parts else str(facts.get("cpu"))


def write_summary(path: str | Path, rows: dict[str, Any]) -> dict[str, Any]:
    """Write `rows` and the device facts as JSON to `path`; returns what was written."""
    summary = rows | {"device": device_facts()}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(summary, indent=1) + "\n")
    return summary
