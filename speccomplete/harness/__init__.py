"""Harnesses on top of the runtime: benchmarks, evaluation, sweeps, cases, draft training runs.

Each module holds one CLI subcommand's code; `speccomplete/cli.py` only wires them up."""
