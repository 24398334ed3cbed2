"""VS Code's first run without a terminal: the packaged extension in a clean code-server profile, a
project that is not the clone, no specdec anywhere and only the system Python; one click on "Set up specdec"
makes the managed environment and starts the server, and ghost text comes while typing. The driver
(vscode_install_test.mjs) times the click to the ghost text and its parts; they go to the test's output, against
the target, and to out/editor-tests/vscode-install/install.json for a closing note.

Slow (a cold pip install of torch and speccomplete's dependencies, and a first GGUF conversion), so outside the
fast suite like test_editors.py; clients/tests/run.sh packages the extension (with its bundled wheel) and runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from editor_support import TIMEOUT_S, VSIX, run_node, save_artifacts

# The target for the click on "Set up specdec" to the first ghost text: a minute, on 2 vCPUs at load <= 2.
TARGET_S = 60
# No step of the wait without progress for longer than this: what specdec's notification and status bar item show.
STILL_TARGET_S = 5


def test_vscode_sets_up_server(editors, tmp_path):
    assert VSIX.exists(), f"{VSIX} is missing: run `npm run package` in clients/vscode"
    env = {
        "CODE_SERVER": editors["CODE_SERVER"],
        "VSIX": str(VSIX),
        "WORK": str(tmp_path),
        "PATH": f"{editors['NODE24']}/bin:{os.environ['PATH']}",
        "TIMEOUT_MS": str((TIMEOUT_S - 120) * 1000),
    }
    if os.environ.get("SPECDEC_SETUP_SCREENSHOT_DIR"):
        env["SCREENSHOT_DIR"] = os.environ["SPECDEC_SETUP_SCREENSHOT_DIR"]
    cmd = [f"{editors['NODE24']}/bin/node", "clients/tests/vscode_install_test.mjs"]
    returncode, output = run_node("vscode-install", cmd, env)
    dest = save_artifacts("vscode-install", tmp_path, output)
    if returncode != 0:
        pytest.fail(f"the driver failed (exit {returncode}); artifacts in {dest}\n{output[-4000:]}")
    result = json.loads((tmp_path / "install.json").read_text())
    parts = ", ".join(f"{k} {v}" for k, v in result["parts"].items())
    print(f"click to ghost text: {result['clickToGhostS']} s ({parts}); {dest / 'install.json'}")
    print(f"venv made with {result['python']}")
    assert result["found"] == "the managed environment"
    assert result["markerWritten"]
    assert result["ghost"].strip()
    # the server start's modules were compiled beside pip: most of the list (clients/setup/compile_ahead.py)
    ahead = result["compiledAhead"]
    print(f"compiled ahead beside pip: {ahead}")
    assert ahead and ahead["exit"] == "0" and ahead["compiled"] >= ahead["listed"] // 2, ahead
    if subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode if shutil.which("nvidia-smi") else True:
        assert result["torch"] and "+cpu" in result["torch"], result["torch"]  # no CUDA torch without a GPU
    # The time is reported against the target, not asserted: a speed target is a measurement, and these VMs
    # drift (the same run took 164-172 s on one day and 204 s on a slower one, alone on the machine both times).
    load = result["load"]
    print(f"load average during the run: mean {load['mean']}, max {load['max']} on {load['cpus']} CPUs")
    met = "met" if result["clickToGhostS"] <= TARGET_S else "MISSED"
    print(f"target click to ghost text <= {TARGET_S} s: {met} ({result['clickToGhostS']} s)")
    still = result["longestStillS"]
    met = "met" if still <= STILL_TARGET_S else "MISSED"
    print(f"target nothing shown standing still > {STILL_TARGET_S} s: {met} ({still} s on {result['stillShowing']!r})")
