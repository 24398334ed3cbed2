"""What the real-editor tests (test_editors.py, test_vscode_install.py) share: where things are, running a
driver in its own process group, and saving what it left. The `editors` fixture is in conftest.py."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VSIX = REPO / "clients" / "vscode" / "specdec-vscode.vsix"
CACHE = Path(os.environ.get("SPECDEC_EDITORS_CACHE", Path.home() / ".cache" / "specdec-editors"))
ARTIFACTS = Path(os.environ.get("SPECDEC_EDITOR_ARTIFACTS", REPO / "out" / "editor-tests"))
# Loading the models (the first use converts the GGUF) plus decoding on a shared CPU.
TIMEOUT_S = 1200


def save_artifacts(name: str, work: Path, output: str) -> Path:
    dest = ARTIFACTS / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    (dest / "output.txt").write_text(output)
    for f in work.glob("*"):
        if f.is_file() and f.suffix in (".log", ".txt", ".png", ".jsonl", ".json"):
            shutil.copy(f, dest)
    return dest


def run_node(name: str, cmd: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run a driver (`env` over this process's environment) and print its output: (exit status, output)."""
    # Its own process group, so a timeout also ends the editor, browser, pip and server it started.
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\n{name}: timed out after {TIMEOUT_S} s"
    print(output)
    return proc.returncode, output
