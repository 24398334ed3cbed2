"""clients/setup/compile_ahead.py, run as the editors' setups run it: it compiles the listed files that pip puts in
place, into the bytecode an import then uses, and stops once speccomplete is installed; and the list it ships names
what a server start imports."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "clients" / "setup" / "compile_ahead.py"


@pytest.fixture
def compile_ahead():
    """The script as a module (it is no package's: the setups run it by its path)."""
    spec = importlib.util.spec_from_file_location("compile_ahead", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def installed(site: Path, relative: str, text: str, age_s: float = 60) -> Path:
    """A file as pip leaves it, written `age_s` ago."""
    path = site / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (time.time() - age_s, time.time() - age_s))
    return path


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
    try:
        out, _ = process.communicate(timeout=60)
    finally:
        process.kill()
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


def test_a_file_just_written_waits_for_a_later_pass_and_the_last_pass_takes_it(compile_ahead, tmp_path):
    fresh = installed(tmp_path, "pkg/fresh.py", "X = 1\n", age_s=0)
    ahead = compile_ahead.CompileAhead(tmp_path, ["pkg/fresh.py"])
    ahead.compile_present(final=False)
    assert ahead.pending == ["pkg/fresh.py"] and not bytecode_valid(fresh)
    ahead.compile_present(final=True)
    assert ahead.pending == [] and ahead.compiled == 1 and bytecode_valid(fresh)


def test_bytecode_of_a_file_that_changed_while_it_compiled_is_removed(compile_ahead, tmp_path, monkeypatch):
    source = installed(tmp_path, "pkg/mod.py", "X = 1\n")
    real = py_compile.compile

    def pip_rewrites_it_meanwhile(path, **kwargs):
        cached = real(path, **kwargs)
        source.write_text("X = 2  # the new version\n")
        return cached

    monkeypatch.setattr(compile_ahead.py_compile, "compile", pip_rewrites_it_meanwhile)
    ahead = compile_ahead.CompileAhead(tmp_path, ["pkg/mod.py"])
    ahead.compile_present(final=True)
    assert ahead.compiled == 0
    assert not Path(importlib.util.cache_from_source(str(source))).exists()


def test_matching_bytecode_is_kept_and_a_failed_file_is_tried_again_only_once_it_changes(
    compile_ahead, tmp_path, monkeypatch
):
    done = installed(tmp_path, "pkg/done.py", "X = 1\n")
    py_compile.compile(str(done), invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    cached = Path(importlib.util.cache_from_source(str(done)))
    written = cached.stat().st_mtime_ns
    broken = installed(tmp_path, "pkg/broken.py", "def f(:\n")
    tries = []
    real = py_compile.compile
    monkeypatch.setattr(compile_ahead.py_compile, "compile", lambda path, **kw: tries.append(path) or real(path, **kw))
    ahead = compile_ahead.CompileAhead(tmp_path, ["pkg/done.py", "pkg/broken.py"])
    ahead.compile_present(final=False)
    ahead.compile_present(final=False)
    assert ahead.compiled == 1 and cached.stat().st_mtime_ns == written  # counted, not compiled again
    assert tries == [str(broken)] and ahead.pending == ["pkg/broken.py"]
    installed(tmp_path, "pkg/broken.py", "def f():\n    return 1\n")  # pip wrote the rest of it
    ahead.compile_present(final=False)
    assert ahead.pending == [] and bytecode_valid(broken)
