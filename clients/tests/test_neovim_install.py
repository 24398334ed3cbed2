"""Neovim's first run without a terminal: the plugin from its folder, a clean home (no venv, no model cache), only
the system Python. `:SpecdecInstall` makes the plugin's venv; then Neovim starts again, as it asks, and ghost
text comes while typing (neovim_test.lua, on the installed server). The install and the restart to the first
ghost text are timed, and go to the test's output, against the target, and to
out/editor-tests/neovim-install/install.json.

Slow (a cold pip install of torch and speccomplete's dependencies, a first GGUF conversion), so outside the fast
suite like test_editors.py; clients/tests/run.sh runs it.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from editor_support import ARTIFACTS, TIMEOUT_S, run_node, save_artifacts

# The target for :SpecdecInstall to the first ghost text, on 2 vCPUs at load <= 2.
TARGET_S = 90


def test_neovim_installs_the_server_and_completes(editors, tmp_path):
    nvim = editors["NVIM_011"]
    home = tmp_path / "home"
    home.mkdir()
    clean = {
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "SPECDEC_CACHE": "",  # the model cache under the clean home
    }
    plugin = ["--headless", "-u", "NONE", "-i", "NONE", "--cmd", "set rtp^=clients/neovim"]
    install = "lua require('specdec.install').install(function(ok) vim.cmd(ok and 'qall!' or 'cquit 1') end)"
    started = time.monotonic()
    returncode, output = run_node("neovim-install", [nvim, *plugin, "-c", install], clean)
    install_s = time.monotonic() - started
    if returncode != 0:
        dest = save_artifacts("neovim-install", tmp_path, output)
        log = home / ".local" / "share" / "nvim" / "specdec" / "install.log"
        pytest.fail(f"`:SpecdecInstall` failed (exit {returncode}); artifacts in {dest}\n{output[-3000:]}\n{log}")
    specdec = home / ".local" / "share" / "nvim" / "specdec" / "venv" / "bin" / "specdec"
    assert specdec.exists(), output[-3000:]

    work = tmp_path / "work"
    work.mkdir()
    env = {
        **clean,
        "SPECDEC_TEST_DIR": str(work),
        "SPECDEC_TEST_CMD": json.dumps([str(specdec), "serve"]),
        "SPECDEC_TEST_TIMEOUT_MS": str((TIMEOUT_S - 60) * 1000),
        "SPECDEC_TEST_DISPLAY": "auto",
        "SPECDEC_TEST_EXPECT": "extmark",
    }
    returncode, output = run_node("neovim-restart", [nvim, *plugin, "-c", "luafile clients/tests/neovim_test.lua"], env)
    if returncode != 0:
        dest = save_artifacts("neovim-install", work, output)
        pytest.fail(f"the restarted Neovim did not complete (exit {returncode}); artifacts in {dest}\n{output[-3000:]}")
    results = json.loads((work / "result.json").read_text())
    ghost_s = results[0]["ghost_after_ms"] / 1000
    total = round(install_s + ghost_s, 1)
    load = os.getloadavg()[0]
    report = {"installToGhostS": total, "installS": round(install_s, 1), "restartToGhostS": round(ghost_s, 1)}
    report["loadAverage1m"] = round(load, 2)
    dest = ARTIFACTS / "neovim-install"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "install.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f":SpecdecInstall to ghost text: {total} s (install {install_s:.1f} s, restart to ghost {ghost_s:.1f} s)")
    # Reported against the target, not asserted: a speed target is a measurement, and these machines drift.
    met = "met" if total <= TARGET_S else "MISSED"
    print(f"target :SpecdecInstall to ghost text <= {TARGET_S} s: {met} ({total} s; load average {load:.2f})")
    assert results[0]["file"] == "greet.py" and results[0]["text"].strip()
