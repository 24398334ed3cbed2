"""Neovim's first run without a terminal: the plugin in a fresh clone (no .venv), a clean home (no venv, no model
cache), the Python on PATH. In one Neovim session (neovim_install_test.lua), greet.py is open and setup() finds no
server; `:SpecdecInstall` makes the plugin's venv and starts the server it installed; ghost text must come as the
end of a line is typed. The install, the server's ready and the first ghost text are timed from the install's
start, and go to the test's output, against the target, and to out/editor-tests/neovim-install/install.json.

Slow (a cold pip install of torch and speccomplete's dependencies, a first GGUF conversion), so outside the fast
suite like test_editors.py; clients/tests/run.sh runs it.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from editor_support import ARTIFACTS, REPO, run_node, save_artifacts

# The target for :SpecdecInstall to the first ghost text, on 2 vCPUs at load <= 2.
TARGET_S = 90


def test_neovim_installs_the_server_and_completes(editors, tmp_path):
    nvim = editors["NVIM_011"]
    home = tmp_path / "home"
    home.mkdir()
    env = {
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "SPECDEC_CACHE": "",  # the model cache under the clean home
        "SPECDEC_TEST_DIR": str(tmp_path),
    }
    # the plugin from a clone of its own, as a user has it: no .venv beside it for the finder to find
    clone = tmp_path / "specdec"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    plugin = ["--headless", "-u", "NONE", "-i", "NONE", "--cmd", f"set rtp^={clone / 'clients' / 'neovim'}"]
    driver = clone / "clients" / "tests" / "neovim_install_test.lua"
    returncode, output = run_node("neovim-install", [nvim, *plugin, "-c", f"luafile {driver}"], env)
    if returncode != 0:
        dest = save_artifacts("neovim-install", tmp_path, output)
        log = home / ".local" / "share" / "nvim" / "specdec" / "install.log"
        pytest.fail(f"the first run failed (exit {returncode}); artifacts in {dest}\n{output[-3000:]}\n{log}")
    times = json.loads((tmp_path / "install.json").read_text())
    assert times["ghost"].strip(), times
    load = os.getloadavg()[0]
    report = {
        "installToGhostS": round(times["ghost_ms"] / 1000, 1),
        "installS": round(times["installed_ms"] / 1000, 1),
        "installToReadyS": round(times["ready_ms"] / 1000, 1),
        "ghost": times["ghost"],
        "loadAverage1m": round(load, 2),
    }
    dest = ARTIFACTS / "neovim-install"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "install.json").write_text(json.dumps(report, indent=1) + "\n")
    total = report["installToGhostS"]
    print(
        f":SpecdecInstall to ghost text: {total} s (installed at {report['installS']} s, the server ready at "
        f"{report['installToReadyS']} s); ghost text {times['ghost']!r}"
    )
    # Reported against the target, not asserted: a speed target is a measurement, and these machines drift.
    met = "met" if total <= TARGET_S else "MISSED"
    print(f"target :SpecdecInstall to ghost text <= {TARGET_S} s: {met} ({total} s; load average {load:.2f})")
