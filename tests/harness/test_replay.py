"""`specdec replay` on a tiny random model through the server's pipeline: the typing pauses, the four
summary rows, cold requests that reuse less of the cache than warm ones, and the JSON it writes."""

from __future__ import annotations

import json

import pytest
from helpers.lsp import save_random_model

from speccomplete.cli import build_parser, main
from speccomplete.harness.lib.pipeline import Pause
from speccomplete.harness.replay import (
    after_enter,
    chosen_lines,
    end_of_line_above,
    halfway,
    run_replay,
    server_options,
    summarize,
)
from speccomplete.server.completion import load_engine

PYTHON = """import os


def walk(root):
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path):
            yield from walk(path)
        else:
            yield path


def sizes(root):
    total = 0
    for path in walk(root):
        total += os.path.getsize(path)
    return total
"""

GO = """package main

import "fmt"

func sum(values []int) int {
	total := 0
	for _, v := range values {
		total += v
	}
	return total
}

func main() {
	fmt.Println(sum([]int{1, 2, 3}))
}
"""


@pytest.fixture(scope="module")
def typed_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("replay")
    model = save_random_model(root / "model")
    paths = [root / "walk.py", root / "sum.go"]
    for path, text in zip(paths, (PYTHON, GO)):
        path.write_text(text)
    return model, [str(p) for p in paths]


def replay_args(model, files, *more):
    return build_parser().parse_args(
        ["replay", "--files", *files, "--target", str(model), "--draft", "ngram", "--lines", "4", "--cold-every", "2"]
        + ["--max-tokens-single-line", "6", "--max-tokens-multi-line", "12", *more]
    )


def test_pauses_are_where_the_user_stops_typing():
    lines = ["def f(x):", "    return x + 1", ""]
    assert after_enter(lines, 1) == Pause("def f(x):\n    ", 1, 4)
    assert halfway(lines, 1) == Pause("def f(x):\n    return", 1, 10)
    assert end_of_line_above(lines, 1) == Pause("def f(x):", 0, 9)
    assert Pause.at_end("é😀") == Pause("é😀", 0, 3)  # the emoji is two UTF-16 code units


def test_chosen_lines_spread_over_the_file_in_order():
    lines = ["x"] + [f"line {i}" for i in range(1, 40)]
    chosen = chosen_lines(lines, 4)
    assert chosen == sorted(chosen) and len(set(chosen)) == 4
    assert 0 not in chosen and chosen[0] < 10 and chosen[-1] > 29
    assert chosen_lines(["a = 1", "", "b", "c = 2"], 12) == [3]  # too short or first: not typed halfway


def test_replay_reports_warm_and_cold_latency_of_both_kinds(typed_files):
    model, files = typed_files
    args = replay_args(model, files)
    options = server_options(args)
    assert not options.telemetry and not options.track_outcomes
    engine = load_engine(options)
    records = run_replay(engine, options, {p: open(p).read() for p in files}, count=4, cold_every=2)
    summary = summarize(records)
    assert [(row["kind"], row["cache"]) for row in summary] == [
        ("single", "warm"),
        ("single", "cold"),
        ("multi", "warm"),
        ("multi", "cold"),
    ]
    for row in summary:
        assert row["n"] > 0, row
        assert 0 < row["p50_ms"] <= row["p95_ms"], row
    assert {r["language"] for r in records} == {"python", "go"}
    assert all(r["generated_tokens"] <= (12 if r["kind"] == "multi" else 6) for r in records)

    def reused(cache):
        mine = [r["prompt_reused_tokens"] for r in records if r["cache"] == cache]
        return sum(mine) / len(mine)

    assert reused("cold") < reused("warm")  # the point of a cold request: its prefix is not in the cache
    assert max(r["prompt_reused_tokens"] for r in records if r["cache"] == "cold") <= 2  # <s> and no more


def test_the_command_prints_the_table_and_writes_json(typed_files, tmp_path, capsys):
    model, files = typed_files
    out = tmp_path / "replay.json"
    argv = ["replay", "--files", *files, "--target", str(model), "--draft", "none", "--lines", "2"]
    assert main([*argv, "--max-tokens-multi-line", "8", "--label", "tiny", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "replay tiny: backend local" in printed and "target single-line p50 <= 250 ms" in printed
    data = json.loads(out.read_text())
    assert data["label"] == "tiny" and data["backend"] == "local" and data["draft"] == "none"
    assert len(data["summary"]) == 4 and data["requests"]
    assert set(data["targets"]) == {"single_warm", "single_cold", "multi_warm", "multi_cold"}
    assert data["settings"]["max_tokens_multi_line"] == 8


def test_the_parser_takes_the_backend_arguments():
    args = build_parser().parse_args(
        ["replay", "--files", "a.py", "b.go", "--backend", "llamacpp", "--llamacpp-speculative", "none"]
        + ["--lines", "6", "--json", "out.json", "--label", "llama.cpp"]
    )
    assert args.files == ["a.py", "b.go"] and args.lines == 6 and args.backend == "llamacpp"
    assert args.json == "out.json" and args.label == "llama.cpp" and args.cold_every == 3
    options = server_options(args)
    assert options.backend == "llamacpp" and options.max_tokens_single_line == 32


def test_options_go_on_top_of_the_replays_own_settings():
    args = build_parser().parse_args(
        ["replay", "--files", "a.py", "--max-tokens-multi-line", "8", "--options", '{"promptBudgetChars": 4000}']
    )
    options = server_options(args)
    assert options.prompt_budget_chars == 4000 and options.max_tokens_multi_line == 8 and not options.telemetry
    with pytest.raises(ValueError, match="must be a JSON object"):
        server_options(build_parser().parse_args(["replay", "--files", "a.py", "--options", "[4000]"]))
    with pytest.raises(ValueError, match="promptBudgetChars"):
        server_options(
            build_parser().parse_args(["replay", "--files", "a.py", "--options", '{"promptBudgetChars": -1}'])
        )
