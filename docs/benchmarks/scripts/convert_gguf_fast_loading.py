"""A GGUF converted through transformers (decoder/models.py, convert_gguf) with and without
gguf_loading.fast_gguf_loading, alternated in one process (docs/cpu.md, "What a start costs"). From the repository
root, in its .venv:

    python docs/benchmarks/scripts/convert_gguf_fast_loading.py [GGUF] [--pairs N] [--json PATH]

GGUF defaults to the packaged Gemma-3-270M's. Each pair converts both ways into scratch folders, plain first in even
pairs and fast first in odd ones, so that drift in the machine's speed and the first conversion's imports hit both
alike. Prints each conversion's seconds and whether the two wrote the same files.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

from speccomplete.decoder import gguf_loading, models
from speccomplete.decoder.packaged import DEFAULT_TARGET, PACKAGED
from speccomplete.harness.lib.facts import device_facts


def same_files(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("gguf", nargs="?", type=Path)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    gguf = args.gguf or PACKAGED[DEFAULT_TARGET].gguf_path()
    ways = {"plain": contextlib.nullcontext, "fast": gguf_loading.fast_gguf_loading}
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for pair in range(args.pairs):
            for way, loading in list(ways.items())[:: -1 if pair % 2 else 1]:
                models.fast_gguf_loading = loading  # type: ignore[assignment]
                out = Path(scratch) / f"{way}-{pair}"
                began = time.perf_counter()
                models.convert_gguf(gguf, out)
                rows.append({"way": way, "convert_s": round(time.perf_counter() - began, 1)})
                print(f"{way:<6} {rows[-1]['convert_s']:>6} s", flush=True)
        same = all(same_files(Path(scratch) / f"plain-{p}", Path(scratch) / f"fast-{p}") for p in range(args.pairs))
    print(f"the same files: {same}")
    if args.json:
        facts = {"gguf": gguf.name, "device": device_facts(), "same_files": same}
        args.json.write_text(json.dumps({**facts, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
