"""What the server runs never imports training (decoder/training/): every other decoder module is
imported in a fresh interpreter, so no other test's imports count."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import importlib, pkgutil, sys

def import_all(package):  # pkgutil.walk_packages would import training/__init__.py to look inside
    for module in pkgutil.iter_modules(package.__path__, package.__name__ + "."):
        if module.name != "speccomplete.decoder.training":
            imported = importlib.import_module(module.name)
            if module.ispkg:
                import_all(imported)

import_all(importlib.import_module("speccomplete.decoder"))
assert "speccomplete.decoder.drafts.build" in sys.modules and "speccomplete.decoder.loader" in sys.modules
print(sorted(m for m in sys.modules if m.startswith("speccomplete.decoder.training")))
"""


def test_the_decoder_runtime_never_imports_training():
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
