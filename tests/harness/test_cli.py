"""The `specdec` command: every subcommand answers --help, and each lives with its code in the harness."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from speccomplete import cli
from speccomplete.cli import SUBCOMMANDS, build_parser, main, subcommand_parser

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
    "precompile",
    "eval",
    "replay",
    "quality",
    "stress",
]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _run_python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_the_subcommands_in_order():
    assert [s.name for s in SUBCOMMANDS] == NAMES
    assert list(_subparsers(build_parser())) == NAMES


def test_the_help_lists_every_subcommand_in_order_with_the_tables_help():
    run = subprocess.run([sys.executable, "-m", "speccomplete", "--help"], capture_output=True, text=True, check=True)
    listing = run.stdout.split("positional arguments:")[1].split("options:")[0]
    listed = [line.split()[0] for line in listing.splitlines() if line.startswith("    ") and line[4] != " "]
    assert listed == NAMES
    flat = " ".join(listing.split())
    for subcommand in SUBCOMMANDS:
        assert f"{subcommand.name} {' '.join(subcommand.help.split())}" in flat


@pytest.mark.parametrize("argv", [["--help"], [], ["no-such-command"]])
def test_the_listing_imports_no_harness_and_no_torch(argv):
    code = (
        "import sys; from speccomplete import cli\n"
        "try:\n"
        f"    cli.main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('speccomplete.harness.')))"
    )
    assert _run_python(code).strip().splitlines()[-1] == "[]"


def test_a_subcommands_help_imports_only_its_module():
    code = (
        "import sys; from speccomplete import cli\n"
        "try:\n"
        "    cli.main(['-v', 'serve', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('speccomplete.harness.')))"
    )
    assert _run_python(code).strip().splitlines()[-1] == "['speccomplete.harness.serve']"


@pytest.mark.parametrize("subcommand", SUBCOMMANDS, ids=[s.name for s in SUBCOMMANDS])
def test_every_row_builds_its_modules_parser_under_its_name(subcommand):
    module = importlib.import_module(f"speccomplete.harness.{subcommand.module}")
    parser = subcommand_parser(subcommand)
    assert parser.prog == f"specdec {subcommand.name}"
    assert parser.get_default("run") is getattr(module, subcommand.run)
    parent = argparse.ArgumentParser(prog="specdec").add_subparsers()
    getattr(module, subcommand.add_parser)(parent)
    assert list(parent.choices) == [subcommand.name]
    assert parent._choices_actions == []  # the help is the table's alone: the module gives its subparser none


@pytest.mark.parametrize("argv", [["--help"]] + [[name, "--help"] for name in NAMES])
def test_every_help_exits_zero(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: specdec")


def test_cli_only_wires_harness_modules():
    """Each subcommand's parser and code come from a harness module; cli.py defines no subcommand itself."""
    for subcommand in SUBCOMMANDS:
        parser = subcommand_parser(subcommand)
        assert parser.get_default("run").__module__.startswith("speccomplete.harness."), subcommand
    defined_here = {name for name, f in inspect.getmembers(cli, inspect.isfunction) if f.__module__ == cli.__name__}
    assert defined_here == {"build_parser", "main", "subcommand_parser"}


def test_the_import_contract_keeps_every_subcommand_module_apart():
    """pyproject.toml's independence contract (checked by .ci/lint) names each subcommand's module: what two
    subcommands share lives in harness/lib/, never in one of them."""
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    contract = next(c for c in pyproject["tool"]["importlinter"]["contracts"] if c["type"] == "independence")
    assert sorted(contract["modules"]) == sorted({f"speccomplete.harness.{s.module}" for s in SUBCOMMANDS})


def test_parsing_a_command_loads_its_parser_in_place():
    parser = build_parser()
    args = parser.parse_args(["-v", "replay", "--files", "a.py"])
    assert args.verbose and args.command == "replay" and args.files == ["a.py"]
    assert args.run is importlib.import_module("speccomplete.harness.replay").run
    assert list(_subparsers(parser)) == NAMES


def test_cases_needs_its_splits(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["cases", "--out", "cases.jsonl"])
    assert exit_.value.code == 2 and "--splits" in capsys.readouterr().err


def test_draft_help_points_at_the_spec_module():
    help_text = subcommand_parser(next(s for s in SUBCOMMANDS if s.name == "bench")).format_help()
    assert "speccomplete.decoder.drafts.spec" in help_text
    assert importlib.util.find_spec("speccomplete.decoder.drafts.spec") is not None


def test_the_command_loads_no_analysis_libraries():
    """`specdec serve` starts through this module: the server runs without the analysis extra."""
    code = (
        "import sys, speccomplete.cli; print(sorted(m for m in ('duckdb', 'pandas', 'matplotlib') if m in sys.modules))"
    )
    assert _run_python(code).strip() == "[]"


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


def test_the_readmes_harness_row_names_every_subcommand():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `harness/` |"))
    assert [s.name for s in SUBCOMMANDS if f"`{s.name}`" not in row] == []
