"""`specdec precompile`: build the compiled CPU step ahead (an installer, CI, a machine image), so that the
server's first start loads it instead of building it in the background (decoder/compiled_step.py)."""

from __future__ import annotations

import argparse
import json
import time

from .lib.model_args import add_model_args


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("precompile")
    add_model_args(p)  # the defaults are the server's: the step it would build is the one built here
    p.add_argument("--json", help="also write what it cost here (JSON)")
    return p


def run(args: argparse.Namespace) -> int:
    import torch

    from speccomplete.decoder.loader import compile_steps

    from .lib.model_args import load

    began = time.perf_counter()
    loaded = load(args)
    loaded_s = time.perf_counter() - began
    compiled, report = compile_steps(loaded.decoder, loaded.quantization)
    result = {
        "target": args.target,
        "draft": args.draft,
        "quantization": loaded.quantization,
        "isa": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "from_cache": report.loaded,
        "models_s": round(loaded_s, 1),
        "compile_s": round(report.seconds, 1),
        "bytes": report.bytes,
        "rows": f"1 to {compiled.max_rows}",
        "draft_step": compiled.draft_step is not None,  # an EAGLE-3 draft's layer step, compiled beside it
        "path": str(report.path),
    }
    print(
        f"compiled step {'loaded from the cache' if report.loaded else 'built'} in {report.seconds:.1f} s "
        f"({report.bytes / 1e6:.1f} MB, {loaded.quantization}, {result['isa']}): {report.path}"
        + (", with the EAGLE-3 draft's step" if compiled.draft_step is not None else "")
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return 0
