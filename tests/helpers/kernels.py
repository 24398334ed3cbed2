"""For the C kernels' and their operators' tests (decoder/c_kernels.py, decoder/torch_ops.py): a compiler that
fails, as a machine's broken one would."""

from __future__ import annotations

COMPLAINT = "broken-cc: internal error"


def broken_compiler(monkeypatch, tmp_path) -> None:
    """$CC and $CXX name a compiler that fails with COMPLAINT, and the model cache is empty, so a kernel is built
    anew."""
    compiler = tmp_path / "broken-cc"
    compiler.write_text(f"#!/bin/sh\necho '{COMPLAINT}' >&2\nexit 1\n")
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setenv("CXX", str(compiler))
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
