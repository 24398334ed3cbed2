"""The tests' pytest hooks (the run's summary) and shared fixtures: tiny random models and the byte tokenizer,
built in-process by tests/helpers (helpers.tiny_models, helpers.tokenizers)."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest
import torch
from helpers.tiny_models import noisy_copy, tiny_gemma3, tiny_gpt2, tiny_llama
from helpers.tokenizers import make_byte_tokenizer
from transformers.utils import logging as hf_logging

from speccomplete.decoder.gamma import DraftPayoff, LookupSpan

# One intra-op thread, not two: these models are a few thousand parameters wide, so a second thread
# only adds synchronisation, and when another process is busy on the 2-core machine, two spinning
# OpenMP threads made each forward pass ~20x slower (measured; ~15x for the 135M integration model).
torch.set_num_threads(1)
hf_logging.set_verbosity_error()


# --------------------------------------------------------------------------- the run's summary


def pytest_addoption(parser):
    parser.addoption(
        "--summary-json",
        metavar="FILE",
        help="at the end, write the counts, the failed tests and the machine's facts here (JSON), also when "
        "the run is interrupted: gpu/step.sh tests stops pytest with SIGINT at its cap",
    )


# Each test's outcome as its reports come in: passed, failed (its call), error (its setup or teardown, or a
# module that did not collect) or skipped (xfail too). A module global: pytest_runtest_logreport has no config.
_OUTCOMES: dict[str, str] = {}
_STARTED = time.monotonic()


def pytest_collectreport(report):
    if report.failed:
        _OUTCOMES[report.nodeid] = "error"


def pytest_runtest_logreport(report):
    if report.failed:
        outcome = "failed" if report.when == "call" else "error"
    elif report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed"
    else:  # a setup or teardown that passed says nothing of the test
        return
    if _OUTCOMES.get(report.nodeid) not in ("failed", "error"):  # a teardown after a failure keeps the failure
        _OUTCOMES[report.nodeid] = outcome


def pytest_sessionfinish(session, exitstatus):
    """pytest calls this after a KeyboardInterrupt too, so a run cut by its cap still leaves its summary."""
    path = session.config.getoption("summary_json", None)
    if not path:
        return
    from speccomplete.harness.lib.facts import write_summary

    counts = Counter(_OUTCOMES.values())
    rows = {
        "exit": int(exitstatus),
        "interrupted": exitstatus == pytest.ExitCode.INTERRUPTED,
        "seconds": round(time.monotonic() - _STARTED, 1),
        "tests": len(_OUTCOMES),
        "passed": counts["passed"],
        "failures": counts["failed"],
        "errors": counts["error"],
        "skipped": counts["skipped"],
        "failed": [test for test, outcome in _OUTCOMES.items() if outcome in ("failed", "error")],
    }
    write_summary(path, rows)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(autouse=True)
def _seed_and_threads():
    random.seed(0)
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    # The CLI run in-process (speccomplete/cli.py) sets one thread per core, and compiled steps guard on
    # the thread count: a later test would see its graphs recompile.
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _drafting_whatever_the_clock_says(request, monkeypatch):
    """Tiny random models' steps take about as long as their drafts, so the clock's gate on drafting
    (gamma.DraftPayoff, for the model draft and for draft trees) and its lookup spans (gamma.LookupSpan) would
    decide by noise which rounds draft, which draft trees and how far a copy goes; tests of the drafters and the
    server run every round the γ policy asks for, trees wherever there is a budget, and copy by the lookup's own
    rule. Tests of the clock itself are marked `clocked`."""
    if request.node.get_closest_marker("clocked") is None:
        monkeypatch.setattr(DraftPayoff, "gate", lambda self, gamma: gamma)
        monkeypatch.setattr(DraftPayoff, "choose", lambda self: True)
        monkeypatch.setattr(LookupSpan, "span", lambda self, depth, room: None)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A model cache of the test's own (SPECDEC_CACHE): what compiled steps build and load there stays there."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def tokenizer():
    return make_byte_tokenizer()


@pytest.fixture(scope="session")
def llama():
    return tiny_llama(seed=0, layers=3)


@pytest.fixture(scope="session")
def llama_other(llama):
    """An independent model with the same vocabulary (own parameters, not derived)."""
    return noisy_copy(llama, layers=2, noise=0.3)


@pytest.fixture(scope="session")
def gpt2():
    return tiny_gpt2(seed=0, layers=2)


@pytest.fixture(scope="session")
def gpt2_other(gpt2):
    return noisy_copy(gpt2, layers=1, noise=0.3)


@pytest.fixture(scope="session")
def gemma3():
    return tiny_gemma3(seed=0)
