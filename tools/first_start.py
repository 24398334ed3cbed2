"""What a first start costs, in one run: each packaged model's GGUF converted with its shipped meta, with a meta built
from its own metadata (as a user's own GGUF is) and through transformers, and `specdec serve` from its start to ready,
and to its compiled step in use, on a cold model cache and on a warm one. Prints a table and writes JSON.

    python -m tools.first_start --json out/first-start.json

It empties the packaged models' folders in the model cache (they are converted again as it goes), so run it where
that costs nothing but the minutes, and alone on the machine: it is a timing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from pathlib import Path

from speccomplete.decoder import models, packaged
from speccomplete.harness.lib.facts import device_facts
from speccomplete.harness.lib.session import compiled_step_in_use, server_command, start_session, stop_session


def conversions() -> list[dict]:
    rows = []
    for alias in packaged.PACKAGED:
        try:
            gguf = packaged.PACKAGED[alias].gguf_path()
        except packaged.ModelNotFoundError as e:
            print(f"first-start: {alias} left out: {e}", file=sys.stderr)
            continue
        out = packaged.packaged_folder(alias)
        # a first start's own way (resolve: with the shipped meta), then those of a GGUF that ships none: a meta from
        # its own metadata, and transformers' (what an architecture it cannot build a meta for gets)
        for way, convert in (
            ("shipped meta", lambda: models.resolve(alias)),
            ("own metadata", lambda: models.convert_with_own_meta(gguf, out)),
            ("transformers", lambda: models.convert_gguf(gguf, out)),
        ):
            shutil.rmtree(out, ignore_errors=True)
            began = time.perf_counter()
            convert()
            rows.append({"model": alias, "way": way, "convert_s": round(time.perf_counter() - began, 1)})
    return rows


async def server_starts() -> list[dict]:
    rows = []
    for cache in ("cold", "warm"):
        if cache == "cold":
            shutil.rmtree(packaged.packaged_folder(packaged.DEFAULT_TARGET), ignore_errors=True)
        began = time.perf_counter()
        session = await start_session(server_command(), {}, 900)
        in_use_s = await compiled_in_use_s(session, began, timeout=600)
        await asyncio.sleep(1)  # what it writes on stderr once ready
        rows.append(
            {
                "model cache": cache,
                "ready_s": round(session.ready_s or 0, 1),
                "compiled_in_use_s": in_use_s,
                "stderr_lines": len(session.stderr),
            }
        )
        await stop_session(session)
    return rows


async def compiled_in_use_s(session, began: float, timeout: float) -> float | None:
    """Seconds from `began` to the compiled step in use (harness/lib/session.py), looked for every 50 ms; None
    where it did not come within `timeout`."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        if compiled_step_in_use(session.statuses) is not None:
            return round(time.perf_counter() - began, 1)
        await asyncio.sleep(0.05)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    converted = conversions()
    started = asyncio.run(server_starts())
    print(f"{'model':<14} {'conversion':<14} {'seconds':>8}")
    for row in converted:
        print(f"{row['model']:<14} {row['way']:<14} {row['convert_s']:>8}")
    print(f"\n{'specdec serve, model cache':<28} {'start to ready (s)':>18} {'compiled step in use (s)':>25}")
    for row in started:
        print(f"{row['model cache']:<28} {row['ready_s']:>18} {row['compiled_in_use_s'] or '-':>25}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        data = {"device": device_facts(), "conversions": converted, "server": started}
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
