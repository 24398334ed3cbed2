"""Closers after the cursor (server/closers.py) and why an answer is empty, through `complete()` with a scripted
decoder: what the model writes is fixed, so what the pipeline makes of it is exact."""

from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace

import pytest
from lsprotocol import types

from speccomplete.decoder.engine import DecodeOptions, Generation
from speccomplete.decoder.stats import GenerationStats
from speccomplete.server.closers import closers_after, retypes
from speccomplete.server.completion import Completion, Engine, Request, complete
from speccomplete.server.lsp import replaced_range
from speccomplete.server.options import ServerOptions
from speccomplete.telemetry.events import CompletionEvent


@pytest.mark.parametrize(
    "line, closers",
    [
        ("println!(█)", ")"),
        ('print("█")', '")'),
        ("xs = [f(█)]  ", ")]"),
        ("foo(█);", ""),  # a `;` after the `)`: not only closers
        ("foo(█) + 1", ""),
        ("x = █", ""),
        ("█", ""),
    ],
)
def test_closers_after(line, closers):
    text = f"a\n{line}\nb"
    assert closers_after(text.replace("█", ""), text.index("█")) == closers


@pytest.mark.parametrize(
    "completion, closers, expected",
    [
        ('"{}", name);', ")", True),
        ('Hello, " + name)', '")', True),
        (") ** 2", ")", True),
        ("name", ")", False),
        ('name")', ')"', False),  # out of order
        ("a,\n    b)", ")", False),  # on a later line: the editor cannot draw it around the `)`
    ],
)
def test_retypes(completion, closers, expected):
    assert retypes(completion, closers) is expected


class ScriptedDecoder:
    """Writes `text` whatever the prompt (or text[i] on the i-th call, given a list), with `logprob` per character
    (None: no log-probabilities)."""

    def __init__(self, text: str | list[str], logprob: float | None = None, finish: str = "stop"):
        self.texts = [text] if isinstance(text, str) else text
        self.logprob, self.finish, self.prompts = logprob, finish, []

    def generate(self, prompt: str, options: DecodeOptions) -> Generation:
        self.prompts.append(prompt)
        text = self.texts[min(len(self.prompts), len(self.texts)) - 1]
        logprobs = [] if self.logprob is None else [self.logprob] * max(1, len(text))
        return Generation(text, list(range(len(text))), self.finish, GenerationStats(), logprobs)


def run(
    document: str, wrote: str | list[str], path: str = "main.rs", logprob: float | None = None, finish="stop", **options
) -> Completion:
    """Complete at the █ in `document` with a decoder that writes `wrote` and stops for `finish`."""
    before = document[: document.index("█")]
    line, character = before.count("\n"), len(before) - before.rfind("\n") - 1
    decoder = ScriptedDecoder(wrote, logprob, finish)
    engine = Engine(decoder, "scripted", "none", "cpu", None)
    request = Request("r", document.replace("█", ""), path, None, line, character, "automatic", time.perf_counter())
    result = complete(engine, ServerOptions(**options), request, threading.Event())
    result.prompts = decoder.prompts  # type: ignore[attr-defined]
    return result


RUST_MAIN = 'fn main() {\n    let name = "world";\n    println!(█)\n}\n'


def test_a_completion_that_retypes_the_closer_replaces_it():
    result = run(RUST_MAIN, '"{}", name);')
    assert (result.text, result.replaces, result.event.outcome) == ('"{}", name);', 1, "shown")
    assert result.prompts[0].endswith("println!(")  # the model saw no `)` after the cursor


def test_a_completion_that_does_not_retype_the_closer_goes_before_it():
    result = run(RUST_MAIN, '"{}", name')
    assert (result.text, result.replaces) == ('"{}", name', 0)


def test_a_completion_that_closes_on_a_later_line_is_trimmed_against_the_real_closer():
    # inserted before the `)`, its own `)` would unbalance the line: the bracket filter keeps the first line
    result = run(RUST_MAIN, '"{}",\n        name)')
    assert (result.text, result.replaces) == ('"{}",', 0)


def test_retyping_only_the_closers_is_an_empty_answer():
    result = run("def f(x):\n    print(x█)\n", ")", path="f.py")
    assert (result.text, result.replaces, result.event.empty_reason) == ("", 0, "no-text")


@pytest.mark.parametrize(
    "path, document, wrote, finish, reason",
    [
        ("a.py", "x = compute()█\ny = 2\n", "", "stop", "finished-line"),  # stopped at the line end
        ("a.py", "x = compute()█\ny = 2\n", "", "eos", "no-text"),
        ("a.py", "x = compute(1)█\n", "))", "stop", "filter:brackets"),
        ("a.rs", "fn f() {\n    let a = 1;\n    █\n}\n", "\n}\n\nfn g() {}", "stop", "filter:suffix_repeat"),
        ("a.txt", "begin\n    a\n    █\nend\n", "\nb\nc", "stop", "scope"),  # the indentation rule
    ],
)
def test_every_empty_answer_has_a_reason(path, document, wrote, finish, reason):
    result = run(document, wrote, path=path, finish=finish)
    assert (result.text, result.event.outcome, result.event.empty_reason) == ("", "empty", reason)


def test_at_the_end_of_a_finished_line_the_next_line_is_offered():
    # the model ends the line (it writes only the line end, where single-line decoding stops); then, asked on a
    # new line below, it writes that line with its indentation
    result = run("def f(x):\n    y = x * 2█\n", ["", "    return y"], path="a.py")
    assert (result.text, result.event.outcome) == ("\n    return y", "shown")
    assert result.prompts[1].endswith("y = x * 2\n")
    # mid-expression, the model goes on with the line itself: no second request
    result = run("total = sum(xs) / █\n", "len(xs)", path="a.py")
    assert (result.text, len(result.prompts)) == ("len(xs)", 1)


def test_the_gate_is_a_reason():
    result = run(RUST_MAIN, '"{}", name);', logprob=math.log(0.1))
    assert (result.text, result.event.empty_reason) == ("", "gate")
    assert run(RUST_MAIN, '"{}", name);', logprob=math.log(0.9)).event.empty_reason is None


def test_refusals_before_decoding_have_reasons():
    assert run("x = 1█\n", "2", path="a.py", enabled_languages=("rust",)).event.empty_reason == "language-off"
    assert run("x = 1█\n", "2", path="a.py", max_document_chars=3).event.empty_reason == "too-large"


def test_the_items_range_covers_the_closers_in_utf16_units():
    document = SimpleNamespace(source='x = ("😀", f(")\n')  # the cursor after `f(`, before `")`
    server = SimpleNamespace(open_document=lambda uri: document)
    cursor = types.Position(0, 13)  # 😀 counts two UTF-16 units
    retyping = Completion('a")', "python", False, CompletionEvent(), replaces=2)
    assert replaced_range(server, "file:///x.py", cursor, retyping) == types.Range(cursor, types.Position(0, 15))
    inserting = Completion("a", "python", False, CompletionEvent())
    assert replaced_range(server, "file:///x.py", cursor, inserting) == types.Range(cursor, cursor)
