"""The `specdec` command: every subcommand answers --help, and each lives with its code in the harness."""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import subprocess
import sys

import pytest

from speccomplete import cli
from speccomplete.cli import SUBCOMMANDS, build_parser, main

NAMES = [
    "complete",
    "cases",
    "bench",
    "sweep",
    "report",
    "study",
    "nextline",
    "stepcost",
    "corpus",
    "finetune",
    "train-eagle3",
    "eagle3-gguf",
    "serve",
    "eval",
    "replay",
    "quality",
    "stress",
    "gpu-pack",
]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_the_subcommands_in_order():
    assert list(_subparsers(build_parser())) == NAMES


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in NAMES])
def test_every_help_exits_zero(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: specdec")


def test_cli_only_wires_harness_modules():
    """Each subcommand's parser and code come from a harness module; cli.py defines no subcommand itself."""
    assert len(SUBCOMMANDS) == len(NAMES)
    for add_parser, run in SUBCOMMANDS:
        for function in (add_parser, run):
            assert function.__module__.startswith("speccomplete.harness."), function
    runs = {name: p.get_default("run") for name, p in _subparsers(build_parser()).items()}
    assert runs == {name: run for name, (_, run) in zip(NAMES, SUBCOMMANDS)}
    defined_here = {name for name, f in inspect.getmembers(cli, inspect.isfunction) if f.__module__ == cli.__name__}
    assert defined_here == {"build_parser", "main"}


def test_cases_needs_its_splits(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["cases", "--out", "cases.jsonl"])
    assert exit_.value.code == 2 and "--splits" in capsys.readouterr().err


def test_draft_help_points_at_the_spec_module():
    help_text = _subparsers(build_parser())["bench"].format_help()
    assert "speccomplete.decoder.drafts.spec" in help_text
    assert importlib.util.find_spec("speccomplete.decoder.drafts.spec") is not None


def test_the_command_loads_no_analysis_libraries():
    """`specdec serve` starts through this module: the server runs without the analysis extra."""
    code = (
        "import sys, speccomplete.cli; print(sorted(m for m in ('duckdb', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_report_without_the_analysis_extra_says_what_to_install(tmp_path):
    code = (
        "import sys; sys.modules.update(dict.fromkeys(('duckdb', 'pandas', 'matplotlib'))); "
        "from speccomplete.cli import main; "
        f"sys.exit(main(['report', 'events.jsonl', '--out', {str(tmp_path)!r}]))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 2 and "pip install 'speccomplete[analysis]'" in run.stderr, run.stderr


def test_serve_takes_verbose_after_the_subcommand_too():
    """Editors append their server arguments after `serve` (VS Code's specdec.server.args: ["-v"])."""
    parse = build_parser().parse_args
    assert parse(["serve", "-v"]).verbose and parse(["-v", "serve"]).verbose
    assert not parse(["serve"]).verbose
