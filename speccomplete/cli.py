"""The `specdec` command (also `python -m speccomplete`).

Only the wiring: each subcommand's arguments and code live together in a harness module, as a
pair of `add_parser(subparsers) -> ArgumentParser` and `run(args) -> int`. The listing comes from
the table below, so that `specdec --help` imports no harness (nor torch), and `specdec <command>`
imports only that command's module.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any, NamedTuple

from . import __version__


class Subcommand(NamedTuple):
    name: str
    module: str  # under speccomplete.harness
    help: str  # the one place this string is written: the modules' add_parser give their subparser none
    add_parser: str = "add_parser"
    run: str = "run"


# In the order `specdec --help` lists them.
SUBCOMMANDS = (
    Subcommand("complete", "complete", "complete a file at a position and print the completion with its stats"),
    Subcommand("cases", "cases", "sample completion cases from corpus split lists"),
    Subcommand("bench", "bench", "AR vs speculative vs HF assisted on the same cases"),
    Subcommand("sweep", "sweep", "AR and fixed γ over temperatures on cases, written as events"),
    Subcommand("report", "report", "tables and plots from completion events"),
    Subcommand("study", "study", "the disparity study (RQ1-RQ3) over cases, resumable: study.json and study.md"),
    Subcommand("nextline", "nextline", "greedy next-line exact match of a target on cases"),
    Subcommand("stepcost", "stepcost", "median cost of target/draft forward passes by dtype and width"),
    Subcommand(
        "corpus",
        "drafting",
        "build packed, language-labelled training shards for a draft",
        add_parser="add_corpus_parser",
        run="cmd_corpus",
    ),
    Subcommand(
        "finetune",
        "drafting",
        "train a draft toward the target on a corpus",
        add_parser="add_finetune_parser",
        run="cmd_finetune",
    ),
    Subcommand("train-eagle3", "eagle3_training", "train an EAGLE-3 draft on the target's hidden states"),
    Subcommand(
        "eagle3-gguf",
        "eagle3_gguf",
        "convert an EAGLE-3 draft folder to the GGUF llama.cpp drafts with (llama-server -md)",
    ),
    Subcommand("serve", "serve", "run the language server (stdio unless --tcp)"),
    Subcommand(
        "precompile", "precompile", "build the compiled CPU step ahead, into the model cache, as the server would"
    ),
    Subcommand("eval", "eval", "drive the real language server over stdio on completion cases"),
    Subcommand(
        "replay", "replay", "latency while files are typed line by line, with pauses: p50/p95 single- and multi-line"
    ),
    Subcommand(
        "quality", "quality", "what users see on held-out cases, through the server's pipeline: shown, next line, loops"
    ),
    Subcommand("stress", "stress", "reliability checks against the real server (table + JSON)"),
)


def subcommand_parser(subcommand: Subcommand, prog: str = "specdec") -> argparse.ArgumentParser:
    """Import the subcommand's harness module and build its parser, with `run` set to the module's function."""
    module = importlib.import_module(f"{__package__}.harness.{subcommand.module}")
    # A scratch parent: the module adds its parser there, and the lazy listing below takes it in.
    parent = argparse.ArgumentParser(prog=prog).add_subparsers()
    parser: argparse.ArgumentParser = getattr(module, subcommand.add_parser)(parent)
    parser.set_defaults(run=getattr(module, subcommand.run))
    return parser


class _LazySubcommands(argparse._SubParsersAction):
    """The subcommands, listed from the table; a module is imported only when its command is the one parsed."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, *rest: Any) -> None:
        name = values[0]
        parsers = self.choices
        if parsers.get(name) is _UNLOADED:
            subcommand = next(s for s in SUBCOMMANDS if s.name == name)
            parsers[name] = subcommand_parser(subcommand, parser.prog)  # in place: the listing's order stays
        super().__call__(parser, namespace, values, *rest)


# Stands in for every subcommand's parser until its command is parsed; only its name and help are shown.
_UNLOADED = argparse.ArgumentParser(add_help=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="code completion with speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, action=_LazySubcommands)
    for subcommand in SUBCOMMANDS:
        subparsers.add_parser(subcommand.name, help=subcommand.help)
        subparsers.choices[subcommand.name] = _UNLOADED
    return parser


def main(argv: list[str] | None = None) -> int:
    # One torch thread per core unless told otherwise. Where torch is not loaded yet, through the variable OpenMP reads
    # as torch loads: before any command's module imports it (a parser may), without importing it here. A caller in
    # this process that has loaded torch gets the count set directly, and its environment left as it was.
    if not os.environ.get("OMP_NUM_THREADS"):
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(os.cpu_count() or 1)
        else:
            os.environ["OMP_NUM_THREADS"] = str(os.cpu_count() or 1)
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # recorded in manifests and model cards
    # Imported here, once a command is chosen, so that the listing and the lazy modules stay light; torch is left to
    # the command, so that `serve` reads stdin and starts a first start's conversion before torch loads.
    from speccomplete.decoder.packaged import ModelError

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
