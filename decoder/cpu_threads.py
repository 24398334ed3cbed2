"""Threads for decoding on the CPU: one per core that the rest of the machine leaves idle.

A decode step is over a hundred small products, each an OpenMP parallel region, and so is each
element-wise op of a prefill. Workers that sleep between regions (OMP_WAIT_POLICY=PASSIVE) are
woken for each one, which takes longer than a small product (docs/cpu.md, "Threads"), so `specdec`
leaves libgomp's default: workers spin a few ms between regions, then sleep. But two workers
spinning where another process keeps a core busy starve each other, so a decoder on the CPU takes a
thread only for each core left idle, read from /proc/stat less this process's own CPU time and work
at a lowered priority (which yields its core to ours), and looks again every half second while it
decodes.
"""

from __future__ import annotations

import os
import time

import torch

# A sample of the machine: (wall seconds, CPU seconds busy on all cores, this process's CPU seconds).
Sample = tuple[float, float, float]


def _read_machine_busy() -> float | None:
    """CPU seconds that every core has spent busy since boot (Linux), or None where unknown."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            line = f.readline()
    except OSError:
        return None
    ticks = busy_ticks(line, count_nice=_niced())
    return None if ticks is None else ticks / os.sysconf("SC_CLK_TCK")


def busy_ticks(line: str, count_nice: bool) -> int | None:
    """The busy ticks of /proc/stat's first line. Time at a lowered priority (nice) counts as idle unless
    `count_nice` (this process runs at one too): the scheduler gives such work a sliver of a core that a
    normal-priority thread wants (a nice-19 build beside us gets about 1.5%), so our threads take its core
    all the same."""
    fields = line.split()
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    # steal: time the hypervisor gave our cores to someone else, as unavailable to us as a busy core
    return user + (nice if count_nice else 0) + system + irq + softirq + steal


def _niced() -> bool:
    """Whether this process runs at a lowered priority, its own CPU time then counted as nice by /proc/stat."""
    try:
        return os.getpriority(os.PRIO_PROCESS, 0) > 0
    except (AttributeError, OSError):
        return False


def _sample() -> Sample | None:
    busy = _read_machine_busy()
    return None if busy is None else (time.monotonic(), busy, time.process_time())


class IdleCores:
    """Sets torch's intra-op threads to the cores other processes leave idle, at most `ceiling`.

    `adjust()` is called before each prefill and each decode round; it looks at the machine once `interval_s` has
    passed since it last did (/proc/stat counts in 10 ms ticks, so shorter windows are noise).
    Where /proc/stat is missing (not Linux), it leaves the threads alone.
    """

    interval_s = 0.5
    busy_core = 0.5  # a core counts as taken once another process uses this much of it

    def __init__(self, ceiling: int | None = None, cores: int | None = None):
        self.ceiling = ceiling or torch.get_num_threads()
        self.cores = cores or os.cpu_count() or 1
        self._last = _sample()

    def adjust(self) -> int:
        """Set and return the thread count for what the machine did since the last look."""
        now = _sample()
        if now is None or self._last is None:
            return torch.get_num_threads()
        wall, busy, own = (a - b for a, b in zip(now, self._last))
        if wall < self.interval_s:
            return torch.get_num_threads()
        self._last = now
        elsewhere = max(0.0, busy - own) / wall  # cores' worth of work by other processes
        threads = max(1, min(self.ceiling, self.cores - int(elsewhere + 1 - self.busy_core)))
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)
        return threads

    def assume_idle(self) -> None:
        """Take every core now, and count the next look's window from here: for a caller that knows the other
        work just ended (the bench, whose previous contender ran in another process) and that it was not
        a load to make room for."""
        self._last = _sample()
        if torch.get_num_threads() != self.ceiling:
            torch.set_num_threads(self.ceiling)
