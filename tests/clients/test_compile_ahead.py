"""clients/setup/compile_ahead.py, run as the editors' setups run it: it compiles the listed files that pip puts in
place, into the bytecode an import then uses, and stops once speccomplete is installed; and the list it ships names
what a server start imports."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "clients" / "setup" / "compile_ahead.py"


def bytecode_valid(source: Path) -> bool:
    """Whether `source`'s cached bytecode exists and names the source's present size and time, as an import checks."""
    cached = Path(importlib.util.cache_from_source(str(source)))
    if not cached.is_file():
        return False
    header = cached.read_bytes()[:16]
    stat = source.stat()
    return (
        header[:4] == importlib.util.MAGIC_NUMBER
        and int.from_bytes(header[4:8], "little") == 0  # timestamp-checked
        and int.from_bytes(header[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
        and int.from_bytes(header[12:16], "little") == stat.st_size & 0xFFFFFFFF
    )


def test_compiles_files_as_they_arrive_and_stops_once_speccomplete_is_installed(tmp_path):
    site = tmp_path / "site-packages"
    (site / "early").mkdir(parents=True)
    early = site / "early" / "__init__.py"
    early.write_text("A = 1\n")
    os.utime(early, (time.time() - 60, time.time() - 60))  # installed a while ago: compiled on the first pass
    listing = tmp_path / "startup-modules.txt"
    listing.write_text("early/__init__.py\nlate/mod.py\nbroken.py\nnever/there.py\n")
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--site", str(site), "--list", str(listing)],
        stdout=subprocess.PIPE,
        text=True,
    )

    def pip_installs_the_rest() -> None:  # what pip does later in its step, speccomplete's record last
        while not bytecode_valid(early) and process.poll() is None:
            time.sleep(0.05)
        (site / "late").mkdir()
        (site / "late" / "mod.py").write_text("def f():\n    return 2\n")
        (site / "broken.py").write_text("def f(:\n")
        record = site / "speccomplete-0.1.0.dist-info" / "RECORD"
        record.parent.mkdir()
        record.write_text("")

    installer = threading.Thread(target=pip_installs_the_rest)
    installer.start()
    out, _ = process.communicate(timeout=60)
    installer.join()
    assert process.returncode == 0
    assert bytecode_valid(early)
    assert bytecode_valid(site / "late" / "mod.py")  # written after the script started, compiled on its last pass
    assert not Path(importlib.util.cache_from_source(str(site / "broken.py"))).exists()
    assert out.strip().startswith("compiled 2 of the 4 files a server start imports")
    assert out.strip().endswith("1 of them are not installed")


def test_the_shipped_list_names_what_a_server_start_imports():
    listed = (REPO / "clients" / "setup" / "startup-modules.txt").read_text().split()
    assert len(listed) == len(set(listed))
    for module in ("torch/__init__.py", "transformers/__init__.py", "pygls/__init__.py", "speccomplete/server/lsp.py"):
        assert module in listed
    assert all(path.endswith(".py") and not path.startswith("/") for path in listed)
