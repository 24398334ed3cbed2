"""A block in stages (`blockBudgetMs`, server/completion.py): answered with its lines decoded within the
budget, never a line cut short, and continued below them once the user accepts them (server/outcomes.py)."""

from __future__ import annotations

import threading
import time

from speccomplete.decoder.engine import DecodeOptions, Generation
from speccomplete.decoder.stats import GenerationStats
from speccomplete.server.completion import Completion, Engine, Request, complete
from speccomplete.server.options import ServerOptions
from speccomplete.server.outcomes import Outcomes

ROUND_S = 0.05
BLOCK = ["    total = 0\n", "    for x in xs:\n", "        total += x\n", "    return total\n"]
DOCUMENT = "def total(xs):\n"  # the cursor on the empty line below: a block


class PacedDecoder:
    """Writes `rounds` one per ROUND_S, asking `stop_when` after each, as the decoder does; every token sure."""

    def __init__(self, rounds: list[str]):
        self.rounds, self.prompts = rounds, []

    def generate(self, prompt: str, options: DecodeOptions) -> Generation:
        self.prompts.append(prompt)
        text, finish = "", "eos"
        for chunk in self.rounds:
            time.sleep(ROUND_S)
            text += chunk
            if options.stop_when is not None and options.stop_when(text):
                finish = "predicate"
                break
        return Generation(
            text, list(range(len(text))), finish, GenerationStats(finish_reason=finish), [0.0] * len(text)
        )


def run(rounds: list[str], budget_ms: int, document: str = DOCUMENT + "█", continues: bool = False):
    before = document[: document.index("█")]
    line, character = before.count("\n"), len(before) - before.rfind("\n") - 1
    decoder = PacedDecoder(rounds)
    request = Request(
        "r",
        document.replace("█", ""),
        "total.py",
        None,
        line,
        character,
        "automatic",
        time.perf_counter(),
        continues_block=continues,
    )
    options = ServerOptions(block_budget_ms=budget_ms, min_confidence=0)
    result = complete(Engine(decoder, "paced", "none", "cpu", None), options, request, threading.Event())
    return result, decoder.prompts


def test_without_a_budget_the_block_comes_whole():
    result, _ = run(BLOCK, budget_ms=0)
    assert result.text == "".join(BLOCK).rstrip()
    assert not result.more and result.event.stage is None


def test_at_the_budget_the_lines_so_far_come_never_a_line_cut_short():
    # the first round ends past the budget, half way into a line: that line is left out
    rounds = ["    total = 0\n    for x in", " xs:\n", "        total += x\n"]
    result, _ = run(rounds, budget_ms=int(ROUND_S * 1000 / 2))
    assert result.text == "    total = 0"
    assert result.more and result.event.stage == "first" and result.event.finish_reason == "budget"


def test_a_block_done_within_its_budget_comes_whole():
    result, _ = run(BLOCK, budget_ms=10_000)
    assert result.text.rstrip().endswith("return total") and not result.more and result.event.stage is None


def test_the_next_lines_are_asked_for_below_the_accepted_ones():
    accepted = DOCUMENT + "    total = 0█"
    result, prompts = run(BLOCK[1:], 0, accepted, True)
    assert prompts[0].endswith("    total = 0\n")  # the model writes from the next line, as after Enter
    assert result.text.startswith("\n    for x in xs:") and result.event.stage == "continued" and result.multiline


def shown_block(outcomes: Outcomes, more: bool) -> Completion:
    """A block's first lines shown at the empty line of DOCUMENT, as the server tracks them."""
    result, _ = run(BLOCK[:1] + ["    for x in", " xs:\n"], budget_ms=int(ROUND_S * 1000 * 1.5) if more else 0)
    request = Request("r", DOCUMENT, "total.py", None, 1, 0, "automatic", 0.0)
    outcomes.show("doc", request, result, tracked=False, reject_after_s=60)
    return result


def test_accepting_a_blocks_first_lines_asks_for_its_next_lines_there_once():
    outcomes = Outcomes(lambda: None)
    result = shown_block(outcomes, more=True)
    assert result.more and outcomes.accept(result.event.request_id)
    document = DOCUMENT + result.text
    at_end = Request(
        "n", document, "total.py", None, document.count("\n"), len(document.rsplit("\n", 1)[1]), "automatic", 0
    )
    elsewhere = Request("n", document, "total.py", None, 0, 0, "automatic", 0.0)
    assert not outcomes.continues_block("doc", elsewhere)  # asked elsewhere: the block is forgotten
    outcomes.accept(shown_block(outcomes, more=True).event.request_id)
    assert outcomes.continues_block("doc", at_end) and not outcomes.continues_block("doc", at_end)


def test_accepting_a_whole_block_asks_for_nothing_more():
    outcomes = Outcomes(lambda: None)
    result = shown_block(outcomes, more=False)
    assert not result.more and outcomes.accept(result.event.request_id)
    document = DOCUMENT + result.text
    at_end = Request(
        "n", document, "total.py", None, document.count("\n"), len(document.rsplit("\n", 1)[1]), "automatic", 0
    )
    assert not outcomes.continues_block("doc", at_end)
