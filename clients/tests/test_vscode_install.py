"""VS Code's first run without a terminal (issue 43): the packaged extension in a clean code-server profile, a
project that is not the clone, no specdec anywhere and only the system Python; one click on "Set up specdec"
makes the managed environment and starts the server, and ghost text comes while typing. The driver
(vscode_install_test.mjs) times the click to the ghost text and its parts; they go to the test's output and to
out/editor-tests/vscode-install/install.json for the issue's closing note.

Slow (a cold pip install of torch and speccomplete's dependencies, and a cold GGUF conversion), so outside the
fast suite like test_editors.py; clients/tests/run.sh packages the extension (with its bundled wheel) and runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VSIX = REPO / "clients" / "vscode" / "specdec-vscode.vsix"
CACHE = Path(os.environ.get("SPECDEC_EDITORS_CACHE", Path.home() / ".cache" / "specdec-editors"))
ARTIFACTS = Path(os.environ.get("SPECDEC_EDITOR_ARTIFACTS", REPO / "out" / "editor-tests"))
TIMEOUT_S = 1200
# Issue 43's target for the click on "Set up specdec" to the first ghost text, on the 2-core Xeon.
TARGET_S = 180


@pytest.fixture(scope="session")
def editors() -> dict[str, str]:
    env_file = CACHE / "editors.env"
    if not env_file.exists():
        pytest.fail(f"{env_file} is missing: run clients/tests/setup-editors.sh first")
    return dict(line.split("=", 1) for line in env_file.read_text().split())


def save_artifacts(work: Path, output: str) -> Path:
    dest = ARTIFACTS / "vscode-install"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    (dest / "output.txt").write_text(output)
    for f in work.glob("*"):
        if f.is_file() and f.suffix in (".log", ".png", ".json"):
            shutil.copy(f, dest)
    return dest


def test_vscode_sets_up_server(editors, tmp_path):
    assert VSIX.exists(), f"{VSIX} is missing: run `npm run package` in clients/vscode"
    env = {
        **os.environ,
        "CODE_SERVER": editors["CODE_SERVER"],
        "VSIX": str(VSIX),
        "WORK": str(tmp_path),
        "PATH": f"{editors['NODE24']}/bin:{os.environ['PATH']}",
        "TIMEOUT_MS": str((TIMEOUT_S - 120) * 1000),
    }
    if os.environ.get("SPECDEC_SETUP_SCREENSHOT_DIR"):
        env["SCREENSHOT_DIR"] = os.environ["SPECDEC_SETUP_SCREENSHOT_DIR"]
    cmd = [f"{editors['NODE24']}/bin/node", "clients/tests/vscode_install_test.mjs"]
    # Its own process group, so a timeout also ends the editor, browser, pip and server it started.
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\nvscode-install: timed out after {TIMEOUT_S} s"
    print(output)
    dest = save_artifacts(tmp_path, output)
    if proc.returncode != 0:
        pytest.fail(f"the driver failed (exit {proc.returncode}); artifacts in {dest}\n{output[-4000:]}")
    result = json.loads((tmp_path / "install.json").read_text())
    parts = ", ".join(f"{k} {v}" for k, v in result["parts"].items())
    print(f"click to ghost text: {result['clickToGhostS']} s ({parts}); {dest / 'install.json'}")
    print(f"venv made with {result['python']}")
    assert result["found"] == "the managed environment"
    assert result["markerWritten"]
    assert result["ghost"].strip()
    if subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode if shutil.which("nvidia-smi") else True:
        assert result["torch"] and "+cpu" in result["torch"], result["torch"]  # no CUDA torch without a GPU
    # The target is for the machine alone: with other work on its cores (a 1-minute load average above their
    # count), every part stretches, so the time is reported but not held to the target.
    load = result["load"]
    print(f"load average during the run: mean {load['mean']}, max {load['max']} on {load['cpus']} CPUs")
    if load["mean"] <= load["cpus"]:
        assert result["clickToGhostS"] <= TARGET_S, f"{result['clickToGhostS']} s from the click to ghost text"
