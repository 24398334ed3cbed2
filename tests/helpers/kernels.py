"""For the C kernels' and their operators' tests (decoder/c_kernels.py, decoder/torch_ops.py): a compiler that
fails, as a machine's broken one would, and what a kernel module does then."""

from __future__ import annotations

import logging

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


def assert_a_failed_build_falls_back(module, monkeypatch, tmp_path, caplog) -> None:
    """`module` (a kernel's, with `available()` over a cached `_library()`) built with a broken compiler: not
    available, with a warning that names the failure and the compiler's complaint."""
    broken_compiler(monkeypatch, tmp_path)
    module._library.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=module.__name__):
            assert not module.available()
        assert "failed" in caplog.text and COMPLAINT in caplog.text
    finally:
        module._library.cache_clear()
