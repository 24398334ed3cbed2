"""The CPU thread count follows the cores other processes leave idle (decoder/cpu_threads.py)."""

import itertools

import pytest
import torch
from helpers.decoding import generate

from speccomplete.decoder import cpu_threads
from speccomplete.decoder.cpu_threads import IdleCores
from speccomplete.decoder.engine import SpeculativeDecoder


@pytest.fixture(autouse=True)
def keep_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def machine(monkeypatch, samples):
    """Feed IdleCores these (wall s, machine busy CPU s, own CPU s) samples, one per look."""
    feed = iter(samples)
    monkeypatch.setattr(cpu_threads, "_sample", lambda: next(feed))


def test_a_core_busy_elsewhere_is_left_to_it_and_taken_back_when_it_idles(monkeypatch):
    # two cores; we use 1 CPU s a second; another process adds 1 s, then 0.1 s, a second
    machine(monkeypatch, [(0.0, 0.0, 0.0), (1.0, 2.0, 1.0), (2.0, 3.1, 2.0)])
    cores = IdleCores(ceiling=2, cores=2)
    assert cores.adjust() == 1 and torch.get_num_threads() == 1
    assert cores.adjust() == 2 and torch.get_num_threads() == 2


def test_own_work_is_not_counted_as_the_machine_being_busy(monkeypatch):
    machine(monkeypatch, [(0.0, 0.0, 0.0), (1.0, 1.95, 1.9)])  # both cores busy, nearly all of it ours
    assert IdleCores(ceiling=2, cores=2).adjust() == 2


def test_the_ceiling_and_one_thread_bound_it(monkeypatch):
    machine(monkeypatch, [(0.0, 0.0, 0.0), (1.0, 3.0, 0.0), (2.0, 19.0, 1.0)])
    cores = IdleCores(ceiling=4, cores=16)
    assert cores.adjust() == 4  # 3 cores busy elsewhere leave 13, but we were given 4
    assert cores.adjust() == 1  # 15 of 16 busy elsewhere: still one thread


def test_a_window_too_short_to_read_changes_nothing(monkeypatch):
    torch.set_num_threads(2)
    machine(monkeypatch, [(0.0, 0.0, 0.0), (0.1, 0.2, 0.0), (0.6, 1.2, 0.0)])
    cores = IdleCores(ceiling=2, cores=2)
    assert cores.adjust() == 2  # 0.1 s of ticks is noise: not looked at
    assert cores.adjust() == 1  # 0.6 s since the first look, 2 cores' worth busy elsewhere


def test_without_proc_stat_the_threads_are_left_alone(monkeypatch):
    torch.set_num_threads(2)
    machine(monkeypatch, [None, None])
    assert IdleCores(ceiling=2, cores=2).adjust() == 2


def test_proc_stat_is_read_where_there_is_one():
    busy = cpu_threads._read_machine_busy()
    if busy is None:
        pytest.skip("no /proc/stat here")
    sum(i * i for i in range(200_000))  # some CPU time passes
    assert cpu_threads._read_machine_busy() >= busy > 0


def test_work_at_a_lowered_priority_counts_as_idle_unless_we_run_at_one_too():
    # user nice system idle iowait irq softirq steal
    line = "cpu  100 400 20 900 7 1 2 3 0 0"
    assert cpu_threads.busy_ticks(line, count_nice=False) == 100 + 20 + 1 + 2 + 3
    assert cpu_threads.busy_ticks(line, count_nice=True) == 100 + 400 + 20 + 1 + 2 + 3
    assert cpu_threads.busy_ticks("intr 1 2 3", count_nice=False) is None


def test_a_cpu_decoder_looks_before_its_prefill_and_each_round(llama, tokenizer, monkeypatch):
    torch.set_num_threads(2)
    looks = itertools.count()
    # a second between looks, and another process keeping a core busy all the while
    monkeypatch.setattr(cpu_threads, "_sample", lambda: (t := float(next(looks)), t, 0.0))
    decoder = SpeculativeDecoder(llama, tokenizer)
    gen = generate(decoder, "def f(x):", max_new_tokens=5)
    assert torch.get_num_threads() == 1 and gen.stats.threads == 1
    assert next(looks) == 1 + 1 + gen.stats.rounds  # looks so far: at construction, before the prefill, each round


def test_a_request_records_the_fewest_threads_it_ran_with(llama, tokenizer, monkeypatch):
    torch.set_num_threads(2)
    looks = itertools.count()
    # a core busy elsewhere until the third look (the first round), idle from then on
    monkeypatch.setattr(cpu_threads, "_sample", lambda: (t := float(next(looks)), min(t, 2.0), 0.0))
    gen = generate(SpeculativeDecoder(llama, tokenizer), "def f(x):", max_new_tokens=5)
    assert torch.get_num_threads() == 2  # taken back once the other process idled
    assert gen.stats.threads == 1
