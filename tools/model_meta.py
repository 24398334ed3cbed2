"""Build the packaged models' shipped meta, decoder/meta/<alias>.tar.xz: the metadata files and tensor map with which
a first start converts the model's GGUF in seconds (decoder/gguf_safetensors.py) instead of through transformers.

    python -m tools.model_meta                  # every packaged model (a minute or two each)
    python -m tools.model_meta gemma3-270m
    python -m tools.model_meta --check          # exit 1 where a shipped meta does not fit its installed GGUF

Each meta is built from transformers' own conversion of the GGUF, made afresh in a scratch folder (never the model
cache, which the fast path may have written), and kept only if converting with it reproduces that conversion tensor
for tensor (write_meta checks). Run it again when a model package changes its GGUF.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import tempfile
from pathlib import Path

from speccomplete.decoder.gguf_loading import gguf_reader
from speccomplete.decoder.gguf_safetensors import TENSOR_MAP, header_sha256, pack_meta, write_meta
from speccomplete.decoder.models import convert_gguf
from speccomplete.decoder.packaged import PACKAGED, SHIPPED_META


def build(alias: str) -> Path:
    """Write SHIPPED_META/<alias>.tar.xz from transformers' conversion of the alias's GGUF."""
    gguf = PACKAGED[alias].gguf_path()
    with tempfile.TemporaryDirectory(prefix=f"specdec-meta-{alias}-") as scratch:
        converted = convert_gguf(gguf, Path(scratch) / "model")
        meta = write_meta(converted, gguf, Path(scratch) / "meta")
        return pack_meta(meta, SHIPPED_META / f"{alias}.tar.xz")


def fits(alias: str) -> bool:
    """Whether the shipped meta of `alias` was built from the GGUF its installed package holds."""
    archive = SHIPPED_META / f"{alias}.tar.xz"
    if not archive.is_file():
        return False
    with tarfile.open(archive, "r:xz") as tar:
        member = tar.extractfile(TENSOR_MAP)
        assert member is not None
        built_from = json.load(member)["gguf_header_sha256"]
    return built_from == header_sha256(gguf_reader(PACKAGED[alias].gguf_path(), elements=False))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("aliases", nargs="*", metavar="ALIAS", help=f"of {', '.join(PACKAGED)}; default: all")
    parser.add_argument("--check", action="store_true", help="say which shipped metas fit their GGUF; write nothing")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.aliases) - set(PACKAGED))
    if unknown:
        parser.error(f"not packaged models: {', '.join(unknown)}")
    failed = False
    for alias in args.aliases or list(PACKAGED):
        if args.check:
            ok = fits(alias)
            failed |= not ok
            print(f"{alias}: {'fits its GGUF' if ok else 'missing or built from another GGUF'}")
        else:
            archive = build(alias)
            print(f"{alias}: {archive} ({archive.stat().st_size / 1e6:.1f} MB)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
