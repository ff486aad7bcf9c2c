"""The session's last scheduler answer, shared by every process of the run.

A run has many watchers: payload drivers, callers waiting for a head or a
worker allocation, ``elastic-ray session status`` from several shells. Each
used to ask Slurm on its own every half second or so; on a busy cluster
that is load slurmctld notices. Every answer any process of the session
gets is written here (atomically, with the wall-clock time it was asked),
and a watcher that can live with an answer up to ``max_age`` seconds old
reads it instead of asking. When it is older, one process asks: the others
see the lock held (a non-blocking ``flock``) and wait briefly for the fresh
answer instead of asking too.

Decisions that act (an election assessing the head, teardown, a
resubmission) keep asking Slurm themselves (``max_age`` 0): correctness
over load. A damaged or foreign file is ignored, never trusted: the caller
asks Slurm.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ... import knobs
from ...atomic import RECORD_ERRORS, atomic_write_json, read_record
from ...errors import CorruptFileError
from ...protocol.disk import paths
from ...scheduler.base import JobInfo, JobState

log = logging.getLogger("elastic_ray.coordinator")

# The file and its lock: paths.answer_file, paths.answer_lock_file. Its
# version is its own (the answer is a cache, not a record: a version this
# elastic-ray does not read is ignored and Slurm asked, never refused).
ANSWER_VERSION = 1
# How long a process waits for another one's query before asking itself
# (squeue on an overloaded controller can take this long).
WAIT_FOR_OTHER = 15.0
LOCK_POLL = 0.05
# Clocks of the run's hosts may differ a little; an answer from further in
# the future than this is not trusted.
CLOCK_SKEW = 5.0
#: ``ELASTIC_RAY_SHARED_ANSWERS=0`` turns sharing off: every caller asks the
#: scheduler itself, as before (the bench's "before" figures; a way out).
ENV_SWITCH = knobs.SHARED_ANSWERS.name


def sharing_enabled() -> bool:
    return knobs.SHARED_ANSWERS.value()


def _opt_float(d: Mapping[str, Any], key: str) -> float | None:
    value = d.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"jobs[].{key}: {value!r} is not a number")
    return float(value)


def _str(d: Mapping[str, Any], key: str) -> str:
    value = d.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"jobs[].{key}: {value!r} is not a string")
    return value


def job_info_to_dict(info: JobInfo) -> dict[str, Any]:
    return {"job_id": info.job_id, "name": info.name, "state": info.state.value, "raw_state": info.raw_state,
            "reason": info.reason, "partition": info.partition, "nodes": list(info.nodes),
            "submit_time": info.submit_time, "start_time": info.start_time, "end_time": info.end_time,
            "time_left": info.time_left, "user": info.user, "comment": info.comment}


def job_info_from_dict(d: Any) -> JobInfo:
    if not isinstance(d, dict):
        raise ValueError(f"jobs[]: {d!r} is not an object")
    nodes = d.get("nodes", [])
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        raise ValueError(f"jobs[].nodes: {nodes!r} is not a list of host names")
    try:
        state = JobState(d.get("state"))
    except ValueError:
        raise ValueError(f"jobs[].state: {d.get('state')!r} is not a job state") from None
    return JobInfo(job_id=_str(d, "job_id"), name=_str(d, "name"), state=state, raw_state=_str(d, "raw_state"),
                   reason=_str(d, "reason"), partition=_str(d, "partition"), nodes=tuple(nodes),
                   submit_time=_opt_float(d, "submit_time"), start_time=_opt_float(d, "start_time"),
                   end_time=_opt_float(d, "end_time"), time_left=_opt_float(d, "time_left"),
                   user=_str(d, "user"), comment=_str(d, "comment"))


@dataclass(frozen=True)
class SchedulerAnswer:
    """One scheduler answer: what was asked (name, user, ids), when, and what came back."""

    job_name: str
    user: str
    asked_at: float                         # wall clock just before the query went out
    ids: frozenset[str]                     # the ids asked about besides the name
    jobs: Mapping[str, JobInfo] = field(default_factory=lambda: MappingProxyType({}))
    protocol_version: int = ANSWER_VERSION

    def age(self, now: float) -> float:
        return now - self.asked_at

    def serves(self, job_name: str, user: str, ids: Iterable[str], max_age: float, now: float) -> bool:
        """Pure: may a caller asking about ``ids`` take this answer instead of a query?"""
        age = self.age(now)
        return (self.job_name == job_name and self.user == user and -CLOCK_SKEW <= age <= max_age
                and set(ids) <= self.ids)

    def to_dict(self) -> dict[str, Any]:
        return {"protocol_version": self.protocol_version, "job_name": self.job_name, "user": self.user,
                "asked_at": self.asked_at, "ids": sorted(self.ids, key=lambda j: (len(j), j)),
                "jobs": {job: job_info_to_dict(info) for job, info in self.jobs.items()}}

    @classmethod
    def from_dict(cls, d: Any) -> "SchedulerAnswer":
        if not isinstance(d, dict):
            raise ValueError("scheduler answer: not an object")
        version = d.get("protocol_version")
        if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= ANSWER_VERSION:
            raise ValueError(f"protocol_version: {version!r} is not one this elastic-ray reads")
        for key in ("job_name", "user"):
            if not isinstance(d.get(key), str):
                raise ValueError(f"{key}: {d.get(key)!r} is not a string")
        asked = d.get("asked_at")
        if isinstance(asked, bool) or not isinstance(asked, (int, float)):
            raise ValueError(f"asked_at: {asked!r} is not a time")
        ids = d.get("ids")
        if not isinstance(ids, list) or not all(isinstance(j, str) for j in ids):
            raise ValueError(f"ids: {ids!r} is not a list of job ids")
        jobs = d.get("jobs")
        if not isinstance(jobs, dict):
            raise ValueError(f"jobs: {jobs!r} is not an object")
        parsed = {}
        for job, info in jobs.items():
            parsed[job] = job_info_from_dict(info)
            if parsed[job].job_id != job:
                raise ValueError(f"jobs.{job}: holds job {parsed[job].job_id!r}")
        return cls(job_name=d["job_name"], user=d["user"], asked_at=float(asked), ids=frozenset(ids),
                   jobs=MappingProxyType(parsed), protocol_version=version)


Ask = Callable[[], dict[str, JobInfo]]


class SharedAnswers:
    """The answer file of one session directory, and the lock that lets one process ask."""

    def __init__(self, directory: Path, *, clock: Callable[[], float] = time.time,
                 wait_for_other: float = WAIT_FOR_OTHER):
        self.path = paths.answer_file(Path(directory))
        self.lock_path = paths.answer_lock_file(Path(directory))
        self.clock = clock
        self.wait_for_other = wait_for_other

    def read(self) -> SchedulerAnswer | None:
        """The stored answer, or None when absent, damaged or of a newer version."""
        try:
            return read_record(self.path, SchedulerAnswer.from_dict)
        except FileNotFoundError:
            return None
        except (CorruptFileError, OSError, *RECORD_ERRORS) as exc:
            log.debug("event=scheduler_answer_ignored path=%s error=%s", self.path, exc)
            return None

    def write(self, answer: SchedulerAnswer, *, stored: SchedulerAnswer | None = None) -> None:
        """Store ``answer`` unless a newer one is there already; a failed write only costs sharing.
        ``stored``: the stored answer as the caller just read it (spares a second read)."""
        current = stored if stored is not None else self.read()
        if current is not None and current.asked_at > answer.asked_at:
            return
        try:
            atomic_write_json(self.path, answer.to_dict())
        except OSError as exc:
            log.warning("event=scheduler_answer_not_written path=%s error=%s", self.path, exc)

    def forget(self) -> None:
        """This process just changed the session's jobs (a submit, a cancel): the stored answer is outdated."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("event=scheduler_answer_not_removed path=%s error=%s", self.path, exc)

    def get(self, job_name: str, user: str, ids: Iterable[str], max_age: float,
            ask: Callable[[], SchedulerAnswer]) -> tuple[SchedulerAnswer, bool]:
        """An answer about ``ids`` at most ``max_age`` s old: ``(answer, asked)``.

        ``asked`` is True when this call asked the scheduler (``ask``, which
        stores its answer itself). With another process asking at the same
        time, it waits up to ``wait_for_other`` s for that answer.
        """
        ids = frozenset(ids)

        def usable() -> SchedulerAnswer | None:
            stored = self.read()
            return stored if stored is not None and stored.serves(job_name, user, ids, max_age, self.clock()) else None

        if (found := usable()) is not None:
            return found, False
        give_up = time.monotonic() + self.wait_for_other
        while True:
            fd = self._try_lock()
            if fd is None and time.monotonic() < give_up:
                time.sleep(LOCK_POLL)
                if (found := usable()) is not None:
                    return found, False
                continue
            try:
                # The lock's previous holder may have just answered.
                if fd is not None and (found := usable()) is not None:
                    return found, False
                return ask(), True
            finally:
                if fd is not None and fd >= 0:
                    os.close(fd)   # closing releases the flock

    def _try_lock(self) -> int | None:
        """The lock's descriptor if this process got it now; None if another holds it.
        -1 when the lock file cannot be opened at all: ask without it."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
                         | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            log.debug("event=scheduler_answer_lock_unusable path=%s error=%s", self.lock_path, exc)
            return -1
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            return fd   # a filesystem without flock: ask, holding nothing
        return fd


__all__ = ["ANSWER_VERSION", "SchedulerAnswer", "SharedAnswers", "sharing_enabled"]
