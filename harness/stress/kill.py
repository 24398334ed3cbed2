"""kill -9 during telemetry writes: a process appends events as fast as it can and is killed at a random moment,
again and again, all into one file; then every event it acknowledged must read back, and at most the one it was
writing may be lost.

The writer acknowledges each event after `EventLog.write` returns by storing the count in a counter file (an
8-byte `pwrite`: it never blocks, unlike a pipe nobody reads). Every event is tagged `case_id` "RUN-I", so the
check knows which run wrote which event. One event in eight carries a large `text` (tens to hundreds of KiB): a
kill can land inside such a write and tear its line, which exercises what telemetry/log.py promises (the next
writer ends the torn line; the reader skips it). The writer rotates at 1 MiB instead of 32 MiB, so kills also land
around rotations.
"""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import rotated_paths

from .check import CheckResult

MAX_BYTES = 1024 * 1024  # the writer's rotation size: small, so that rotations happen within a run
MAX_KILL_DELAY_S = 0.25  # a kill lands this long at most after the writer's first acknowledged event
START_TIMEOUT_S = 60.0  # for the writer's first event (a busy machine imports slowly)

# The writer runs as `python -c WRITER EVENTS COUNTER RUN SEED`: it imports only the telemetry package, so it starts
# in a fraction of a second, and the counter holds the number of events EventLog.write returned from.
WRITER = """
import os, random, struct, sys
from speccomplete.telemetry.events import CompletionEvent
from speccomplete.telemetry.log import EventLog

events, counter, run, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rng = random.Random(seed)
log = EventLog(events, max_bytes=int(sys.argv[5]))
fd = os.open(counter, os.O_WRONLY | os.O_CREAT, 0o600)
written = 0
while True:
    size = rng.randrange(32 * 1024, 512 * 1024) if rng.random() < 1 / 8 else rng.randrange(10, 400)
    text = "".join(rng.choices("abcdefgh \\n", k=64)) * (size // 64 + 1)
    event = CompletionEvent(
        language="python", target="stress", draft="none", generated_tokens=written % 50,
        case_id=f"{run}-{written}", source="eval", text=text[:size],
    )
    if not log.write(event):
        sys.exit("EventLog.write failed")
    written += 1
    os.pwrite(fd, struct.pack("<Q", written), 0)
"""


def run(seed: int, full: bool, workdir: Path) -> CheckResult:
    result = CheckResult("kill", seed, full)
    kills = 20 if full else 5
    rng = random.Random(seed)
    folder = workdir / "kill"
    folder.mkdir(parents=True, exist_ok=True)
    events_path = folder / "events.jsonl"
    for old in [events_path, *rotated_paths(events_path)]:
        old.unlink(missing_ok=True)  # a rerun in the same workdir starts from an empty log

    acknowledged = [_write_and_kill(events_path, folder / f"counter-{kill}", kill, rng) for kill in range(kills)]
    verify(result, events_path, acknowledged)
    return result


def verify(result: CheckResult, events_path: Path, acknowledged: list[int]) -> None:
    """Check the log at `events_path` (with its rotated siblings) against what each run acknowledged, where run k
    wrote the events tagged "k-0", "k-1", ...; adds the metrics and targets to `result`."""
    kills = len(acknowledged)
    files = [*rotated_paths(events_path), events_path]
    lines = [line for path in files if path.exists() for line in path.read_bytes().split(b"\n") if line]
    read: dict[int, list[int]] = {kill: [] for kill in range(kills)}  # by run, the event numbers read, in order
    torn = [0] * kills  # by run: a torn line follows the complete lines of the run that tore it
    last_run = 0
    for line in lines:
        event = _parse(line)
        if event is None:
            torn[last_run] += 1
            continue
        run_id, number = map(int, (event.case_id or "").split("-"))
        read[run_id].append(number)
        last_run = run_id

    counts = Counter((kill, n) for kill, numbers in read.items() for n in numbers)
    duplicates = sum(c - 1 for c in counts.values())
    # An acknowledged event that is not in the file is lost for good; the one being written when the kill came
    # (unacknowledged) may be torn.
    missing_acknowledged = [len(set(range(acknowledged[k])) - set(read[k])) for k in range(kills)]
    lost = [missing_acknowledged[k] + torn[k] for k in range(kills)]
    out_of_order = sum(numbers != sorted(numbers) for numbers in read.values())
    reader_rows, reader_skipped = _read_with_the_project_reader(events_path)
    complete = sum(len(numbers) for numbers in read.values())

    result.metrics = {
        "kills": kills,
        "events_acknowledged": sum(acknowledged),
        "events_read": complete,
        "events_lost": sum(lost),
        "acknowledged_events_lost": sum(missing_acknowledged),
        "max_lost_per_kill": max(lost, default=0),
        "torn_lines": sum(torn),
        "duplicate_events": duplicates,
        "runs_out_of_order": out_of_order,
        "files": sum(path.exists() for path in files),
        "reader_rows": reader_rows,
        "reader_skipped_lines": reader_skipped,
    }
    result.target("acknowledged events lost", sum(missing_acknowledged), "== 0", sum(missing_acknowledged) == 0)
    result.target("events lost per kill (max)", max(lost, default=0), "<= 1", max(lost, default=0) <= 1)
    result.target("duplicate events", duplicates, "== 0", duplicates == 0)
    result.target("runs read out of order", out_of_order, "== 0", out_of_order == 0)
    result.target(
        "events the project's reader reads",
        reader_rows,
        f"== {complete} (every complete line)",
        reader_rows == complete,
    )
    result.target(
        "torn lines the reader skips with a warning", reader_skipped, f"== {sum(torn)}", reader_skipped == sum(torn)
    )
    for kill in range(kills):
        if lost[kill] > 1 or missing_acknowledged[kill]:
            result.notes.append(
                f"run {kill}: {acknowledged[kill]} acknowledged, {len(read[kill])} read, {torn[kill]} torn"
            )


def _write_and_kill(events_path: Path, counter: Path, kill: int, rng: random.Random) -> int:
    """Start a writer, SIGKILL it at a random moment after its first event; the number of events it acknowledged."""
    counter.unlink(missing_ok=True)
    env = os.environ | {"SPECDEC_TELEMETRY": "1"}  # the user's off switch would make every write a no-op
    command = [sys.executable, "-c", WRITER, str(events_path), str(counter), str(kill), str(rng.randrange(2**31))]
    writer = subprocess.Popen([*command, str(MAX_BYTES)], env=env, stderr=subprocess.PIPE)
    errors = writer.stderr
    assert errors is not None  # stderr=PIPE
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while _acknowledged(counter) == 0:
            if writer.poll() is not None:
                raise RuntimeError(f"the writer exited with {writer.returncode}: {errors.read().decode()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the writer wrote nothing in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.005)
        time.sleep(rng.uniform(0, MAX_KILL_DELAY_S))
    finally:
        writer.kill()
        writer.wait()
        errors.close()
    return _acknowledged(counter)


def _acknowledged(counter: Path) -> int:
    try:
        data = counter.read_bytes()
    except FileNotFoundError:
        return 0
    return struct.unpack("<Q", data)[0] if len(data) == 8 else 0


def _parse(line: bytes) -> CompletionEvent | None:
    """The event on a line, or None for a torn line (what readers skip)."""
    try:
        return CompletionEvent.from_dict(json.loads(line))
    except ValueError:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None


def _read_with_the_project_reader(events_path: Path) -> tuple[int, int]:
    """(events read, lines skipped) by telemetry/analysis/read.py, the reader `specdec report` uses."""
    from speccomplete.telemetry.analysis.read import UnreadableLineWarning, connect

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UnreadableLineWarning)
        rows = connect([events_path], columns=["case_id"]).execute("SELECT count(*) FROM events").fetchone()
    skipped = 0
    for warning in caught:
        if issubclass(warning.category, UnreadableLineWarning):
            skipped += int(str(warning.message).split("skipped ")[1].split(" ")[0])
    return (rows[0] if rows else 0), skipped
