"""Harnesses on top of the runtime: benchmarks, evaluation, sweeps, cases, draft training runs.

Each subcommand of `specdec` lives with its code here, as an `add_parser(subparsers)` that defines
its arguments and a `run(args) -> int`; `speccomplete/cli.py` only wires them up. No subcommand's
module imports another's (an import contract in pyproject.toml): what several share is in lib/."""
