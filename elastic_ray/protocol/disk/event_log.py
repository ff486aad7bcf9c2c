"""Append to and read a session's event log (``events.jsonl``): the effects.

The line format is :mod:`.events`. Here:

- :func:`append` writes one line with one ``write()`` on an ``O_APPEND``
  descriptor while holding ``flock`` on it, so lines of many processes on
  many hosts never interleave (``flock`` is carried to NFS as a lock of the
  whole file). It never raises: an event log that cannot be written (a full
  disk, a removed directory) must not stop a drain or an election, so it
  returns False and logs once per process.
- The log is bounded: when the file passes :data:`MAX_BYTES` the appender
  that notices moves it to ``events.1.jsonl`` (replacing the older one) and
  starts a new one; an appender that still holds the moved file sees that
  its descriptor no longer names the path and opens it anew.
- :func:`read` returns the events of both files in order, with the count
  of lines skipped; :func:`follow` yields new events as they are appended.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from . import paths
from .events import Event, EventKind, EventSource, Scalar, Skipped, decode, encode

log = logging.getLogger("elastic_ray.events")

MAX_BYTES = 8 * 1024 * 1024      # then moved aside: at most twice this on disk
LOCK_WAIT = 2.0                  # an append waits this long for the lock, then writes without it
_warned = False


def _lock(fd: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False     # a filesystem without locks: the single write is still whole
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)


def _open_current(path: Path, lock_wait: float) -> int:
    """A locked (if it can be) descriptor of the file the path names now."""
    for _ in range(5):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        locked = _lock(fd, lock_wait)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same or not locked:
            return fd
        os.close(fd)        # moved aside while we waited: the new file is the one to write
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)


def append(session: str | os.PathLike[str], event: Event, *, max_bytes: int = MAX_BYTES,
           lock_wait: float = LOCK_WAIT) -> bool:
    """Add ``event`` to the session's log; False (and one warning per process) if it could not be."""
    global _warned
    directory = Path(session)
    path = paths.events_file(directory)
    line = encode(event)
    try:
        fd = _open_current(path, lock_wait)
        try:
            if os.fstat(fd).st_size + len(line) > max_bytes:
                os.replace(path, paths.events_rotated_file(directory))
                os.close(fd)
                fd = _open_current(path, lock_wait)
            os.write(fd, line)
        finally:
            os.close(fd)         # closing drops the lock
        return True
    except OSError as exc:
        if not _warned:
            _warned = True
            log.warning("event=event_log_unwritable path=%s error=%r (later failures are not logged)", path, exc)
        return False


@dataclass(frozen=True)
class Reading:
    """What :func:`read` found: the events in file order, and how many lines it skipped, by why."""

    events: tuple[Event, ...]
    skipped: dict[Skipped, int]


def _decode_lines(data: bytes, events: list[Event], skipped: dict[Skipped, int]) -> None:
    for raw in data.splitlines():
        if not raw.strip():
            continue
        decoded = decode(raw)
        if isinstance(decoded, Skipped):
            skipped[decoded] = skipped.get(decoded, 0) + 1
        else:
            events.append(decoded)


def read(session: str | os.PathLike[str], *, since: float | None = None) -> Reading:
    """Every event of the session still on disk (the moved-aside file first), at or after ``since``."""
    directory = Path(session)
    events: list[Event] = []
    skipped: dict[Skipped, int] = {}
    for path in (paths.events_rotated_file(directory), paths.events_file(directory)):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        _decode_lines(data, events, skipped)
    if since is not None:
        events = [e for e in events if e.at >= since]
    return Reading(tuple(events), skipped)


def follow(session: str | os.PathLike[str], *, interval: float = 0.5,
           stop: Callable[[], bool] = lambda: False, from_start: bool = True,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[Event]:
    """Yield events as they are appended, until ``stop()`` says so (checked every ``interval``).

    ``from_start``: first everything on disk, then what comes. A move aside
    is noticed (the file shrinks or is another file) and reading restarts at
    the new file's beginning.
    """
    directory = Path(session)
    path = paths.events_file(directory)
    inode, offset, pending = None, 0, b""
    if from_start:
        try:
            rotated = paths.events_rotated_file(directory).read_bytes()
        except FileNotFoundError:
            rotated = b""
        events: list[Event] = []
        _decode_lines(rotated, events, {})
        yield from events           # the current file is read from its start by the loop
    else:
        try:
            stat = path.stat()
            inode, offset = stat.st_ino, stat.st_size
        except FileNotFoundError:
            pass
    while not stop():
        try:
            stat = path.stat()
        except FileNotFoundError:
            sleep(interval)
            continue
        if stat.st_ino != inode or stat.st_size < offset:
            inode, offset, pending = stat.st_ino, 0, b""
        if stat.st_size > offset:
            with open(path, "rb") as handle:
                handle.seek(offset)
                chunk = handle.read(stat.st_size - offset)
            offset += len(chunk)
            data = pending + chunk
            whole, _, pending = data.rpartition(b"\n")
            new: list[Event] = []
            _decode_lines(whole, new, {})
            yield from new
            continue
        sleep(interval)


def emit(session: str | os.PathLike[str] | None, kind: EventKind, by: EventSource, *, job: str | None = None,
         node: str | None = None, reason: str | None = None, at: float | None = None,
         lock_wait: float = LOCK_WAIT, **details: Scalar) -> bool:
    """Record one event now: what every writer calls. Never raises (a bad field is logged, not thrown):
    history must never cost the run a drain or an election."""
    if session is None:
        return False
    try:
        event = Event(at=time.time() if at is None else at, kind=kind, by=by,
                      job=None if job is None else str(job), node=node, reason=reason, details=details)
    except ValueError as exc:
        log.warning("event=event_not_recorded kind=%s error=%r", kind, exc)
        return False
    return append(session, event, lock_wait=lock_wait)
