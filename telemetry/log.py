"""The event writer: append-only JSON lines, one write per record, rotated by size, old files pruned.

Crash safety: each record is one `os.write` of a complete line to an O_APPEND descriptor, so
there is no user-space buffer to lose and a crash can tear at most the last line. Reopening a file
whose last line is torn first ends that line, so the next record starts clean; readers skip the
torn line with a warning (telemetry/analysis/read.py). Rotation renames `events.jsonl` to the next free
`events.N.jsonl` (1 is the oldest) with a link that never overwrites, so no event is lost to a race.

Retention: at open and after each rotation, rotated files older than `keep_days` are deleted, then the
oldest ones until the rest and a full live file fit in `keep_bytes`. The live file is never deleted.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path

from .events import OUTCOMES, SCHEMA, CompletionEvent, Outcome

log = logging.getLogger(__name__)

ENV_SWITCH = "SPECDEC_TELEMETRY"  # "0", "false", "off" or "no" turns telemetry off everywhere
DEFAULT_MAX_BYTES = 32 * 1024 * 1024  # a file rotates at this size
DEFAULT_KEEP_DAYS = 90.0  # rotated files older than this are deleted (0: kept whatever their age)
DEFAULT_KEEP_BYTES = 256 * 1024 * 1024  # the live and rotated files together stay under this (or one file)


def default_path() -> Path:
    """$XDG_DATA_HOME/specdec/events.jsonl, or ~/.local/share/specdec/events.jsonl."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "specdec" / "events.jsonl"


def telemetry_allowed() -> bool:
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def rotated_paths(path: str | Path) -> list[Path]:
    """The rotated siblings of `path` (events.1.jsonl, events.2.jsonl, ...), oldest first."""
    path = Path(path)
    found = []
    for sibling in path.parent.glob(f"{path.stem}.*{path.suffix}"):
        middle = sibling.name[len(path.stem) + 1 : len(sibling.name) - len(path.suffix)]
        if middle.isdigit():
            found.append((int(middle), sibling))
    return [p for _, p in sorted(found)]


class EventLog:
    """Thread-safe appender of completion events and outcome records.

    `enabled=False` (or SPECDEC_TELEMETRY=0) makes every method a no-op: no directory, no file.
    `fsync=True` also forces each record to disk (survives power loss, not just a process crash);
    it costs a disk flush per completion, so it is off by default (see docs/telemetry.md).
    Write errors (disk full, permissions) are logged, never raised: telemetry must not break a completion.
    """

    def __init__(
        self,
        path: str | Path | None = None,
        enabled: bool = True,
        max_bytes: int = DEFAULT_MAX_BYTES,
        fsync: bool = False,
        keep_days: float = DEFAULT_KEEP_DAYS,
        keep_bytes: int = DEFAULT_KEEP_BYTES,
    ):
        if max_bytes <= 0 or keep_bytes <= 0 or keep_days < 0:
            raise ValueError(f"need max_bytes, keep_bytes > 0, keep_days >= 0: {max_bytes}, {keep_bytes}, {keep_days}")
        self.enabled = enabled and telemetry_allowed()
        self.path = Path(path) if path is not None else default_path()
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.keep_days, self.keep_bytes = keep_days, keep_bytes
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._warned = False

    def write(self, event: CompletionEvent) -> bool:
        return self._append(event.to_dict())

    def update_outcome(self, request_id: str, outcome: Outcome, accepted_chars: int | None = None) -> bool:
        """Record the editor's verdict; the analysis joins the latest outcome per request_id."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        return self._append(
            {
                "schema": SCHEMA,
                "record": "outcome",
                "time": time.time(),
                "request_id": request_id,
                "outcome": outcome,
                "accepted_chars": accepted_chars,
            }
        )

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _append(self, record: dict) -> bool:
        if not self.enabled:
            return False
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                fd = self._open()
                size = os.fstat(fd).st_size
                if size and size + len(line) > self.max_bytes:
                    fd = self._rotate(fd)
                os.write(fd, line)
                if self.fsync:
                    os.fsync(fd)
                return True
            except OSError as e:
                if not self._warned:
                    log.warning("telemetry: cannot write %s: %s (further errors are not logged)", self.path, e)
                    self._warned = True
                return False

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._finish_interrupted_rotation()
            self.prune()
            fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            os.fchmod(fd, 0o600)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                os.write(fd, b"\n")  # end a line torn by a crash, so the next record starts clean
            self._fd = fd
        return self._fd

    def _rotate(self, fd: int) -> int:
        """Move the full file to the next free events.N.jsonl, unless another process already moved it."""
        ours = os.fstat(fd).st_ino
        os.close(fd)
        self._fd = None
        try:
            still_ours = os.stat(self.path).st_ino == ours
        except FileNotFoundError:
            still_ours = False
        if still_ours:
            existing = rotated_paths(self.path)
            n = int(existing[-1].name.split(".")[-2]) + 1 if existing else 1
            while True:
                target = self.path.with_name(f"{self.path.stem}.{n}{self.path.suffix}")
                try:
                    os.link(self.path, target)  # never overwrites, unlike rename
                    break
                except FileExistsError:
                    n += 1
            _unlink_if_there(self.path)
        return self._open()  # which prunes

    def prune(self) -> list[Path]:
        """Delete the rotated files retention no longer keeps (the module's docstring); returns them."""
        rotated = rotated_paths(self.path)
        sizes = {}
        for path in rotated:
            try:
                stat = path.stat()
            except FileNotFoundError:  # another writer pruned it
                continue
            sizes[path] = (stat.st_size, stat.st_mtime)
        # the rotated files leave room for the live one to fill up to max_bytes before it rotates
        total = sum(size for size, _ in sizes.values()) + self.max_bytes
        cutoff = time.time() - self.keep_days * 86400 if self.keep_days else None
        deleted = []
        for path, (size, mtime) in sizes.items():  # oldest first
            if (cutoff is not None and mtime < cutoff) or total > self.keep_bytes:
                _unlink_if_there(path)
                total -= size
                deleted.append(path)
        if deleted:
            log.info("telemetry: retention deleted %s", ", ".join(p.name for p in deleted))
        return deleted

    def _finish_interrupted_rotation(self) -> None:
        """A crash between a rotation's link and unlink leaves the file under both names; appending to
        it would then write every later record into the rotated file too. Drop the live name."""
        rotated = rotated_paths(self.path)
        try:
            if rotated and os.path.samefile(self.path, rotated[-1]):
                log.warning("telemetry: finishing a rotation a crash interrupted (%s)", rotated[-1].name)
                _unlink_if_there(self.path)
        except FileNotFoundError:
            pass


def _unlink_if_there(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:  # another writer finished the rotation first
        pass
