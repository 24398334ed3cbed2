"""tools/first_start.py's conversions: each packaged model converted with its shipped meta, with a meta from its own
metadata and through transformers, each timed, on a tiny GGUF standing in for a packaged model."""

from __future__ import annotations

from types import SimpleNamespace

from speccomplete.decoder import models, packaged
from speccomplete.decoder.gguf_safetensors import pack_meta, write_meta
from speccomplete.harness.tiny_gguf import write_tiny_gguf
from tools import first_start


def test_each_packaged_model_is_converted_each_way_and_timed(tmp_path, monkeypatch):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    meta = write_meta(models.convert_gguf(gguf, tmp_path / "reference"), gguf, tmp_path / "meta")
    pack_meta(meta, tmp_path / "shipped" / "tiny.tar.xz")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    tiny = {"tiny": SimpleNamespace(gguf_path=lambda: gguf)}
    monkeypatch.setattr(packaged, "PACKAGED", tiny)
    monkeypatch.setattr(models, "PACKAGED", tiny)
    monkeypatch.setattr(packaged, "SHIPPED_META", tmp_path / "shipped")
    ways = []
    convert = models.convert_gguf
    monkeypatch.setattr(models, "convert_gguf", lambda *a: ways.append("transformers") or convert(*a))
    rows = first_start.conversions()
    assert [(r["model"], r["way"]) for r in rows] == [
        ("tiny", "shipped meta"),
        ("tiny", "own metadata"),
        ("tiny", "transformers"),
    ]
    assert ways == ["transformers"] and all(r["convert_s"] >= 0 for r in rows)
    assert packaged.SHIPPED_META == tmp_path / "shipped"  # put back after the transformers run
    assert (tmp_path / "cache" / "models" / "tiny" / "model.safetensors").is_file()
