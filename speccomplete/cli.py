"""The `specdec` command (also `python -m speccomplete`).

Only the wiring: each subcommand's arguments and code live together in a harness module, as a
pair of `add_parser(subparsers) -> ArgumentParser` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

import torch

from speccomplete.decoder.models import ModelError

from . import __version__
from .harness import (
    bench,
    cases,
    complete,
    drafting,
    eagle3_gguf,
    eagle3_training,
    gpu_pack,
    nextline,
    quality,
    replay,
    report,
    serve,
    stepcost,
    stress,
    study,
    sweep,
)
from .harness import eval as server_eval

# (add the subcommand's parser, run it), in the order `specdec --help` lists them
SUBCOMMANDS = (
    (complete.add_parser, complete.run),
    (cases.add_parser, cases.run),
    (bench.add_parser, bench.run),
    (sweep.add_parser, sweep.run),
    (report.add_parser, report.run),
    (study.add_parser, study.run),
    (nextline.add_parser, nextline.run),
    (stepcost.add_parser, stepcost.run),
    (drafting.add_corpus_parser, drafting.cmd_corpus),
    (drafting.add_finetune_parser, drafting.cmd_finetune),
    (eagle3_training.add_parser, eagle3_training.run),
    (eagle3_gguf.add_parser, eagle3_gguf.run),
    (serve.add_parser, serve.run),
    (server_eval.add_parser, server_eval.run),
    (replay.add_parser, replay.run),
    (quality.add_parser, quality.run),
    (stress.add_parser, stress.run),
    (gpu_pack.add_parser, gpu_pack.run),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="code completion with speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for add_parser, run in SUBCOMMANDS:
        add_parser(subparsers).set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in manifests and model cards
    if not os.environ.get("OMP_NUM_THREADS"):  # one thread per core unless told otherwise
        torch.set_num_threads(os.cpu_count() or 1)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return args.run(args)
    except (ModelError, ValueError, OSError) as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
