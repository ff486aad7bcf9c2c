"""How often a wait asks the scheduler, and how old an answer it accepts.

A wait (for the head, for a worker allocation to join) looks at the
session directory often: the agents' node files and ``head.json`` are the
fast path and cost Slurm nothing. Slurm is only asked whether the job ended
meanwhile, and a job still PENDING in the queue rarely changes: asking it
every half second per caller was most of a run's scheduler load. So the
scheduler look is paced: soon at first, then less and less often while the
job waits in the queue (up to ``PENDING_MAX``), every ``ACTIVE_EVERY`` once
it runs; and it takes the session's shared answer (``.answers``) if it is
at most ``WATCH_MAX_AGE`` old, so many waiting callers cost one query.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..scheduler.base import JobInfo, JobState
from .answers import sharing_enabled

#: how old a shared scheduler answer a watcher accepts (s)
WATCH_MAX_AGE = 10.0
#: ``elastic-ray session status``: fresh enough for a person, cheap from many shells
STATUS_MAX_AGE = 5.0
PENDING_FIRST = 2.0
PENDING_FACTOR = 2.0
PENDING_MAX = 30.0
ACTIVE_EVERY = 10.0
#: the old pace, kept when sharing is switched off
OLD_POLL = 0.5


def next_check_delay(state: JobState | None, previous: float | None) -> float:
    """Pure: seconds until the next scheduler look of a wait.

    ``state`` is what the last look said (None: the scheduler did not
    answer), ``previous`` the delay used before it (None after the first).
    A PENDING job is looked at after 2, 4, 8, 16, 30, 30... s; a job that
    runs (its nodes still joining) or an unknown state every 10 s, which is
    also the age of the shared answer a wait accepts.
    """
    if state is JobState.PENDING:
        if previous is None:
            return PENDING_FIRST
        return min(PENDING_MAX, max(PENDING_FIRST, previous * PENDING_FACTOR))
    return ACTIVE_EVERY


def watch_max_age(wanted: float = WATCH_MAX_AGE) -> float:
    """The answer age a watcher accepts: ``wanted``, or 0 (ask) with sharing off."""
    return wanted if sharing_enabled() else 0.0


class SchedulerLooks:
    """One wait's paced scheduler looks (one instance per wait).

    ``look(job, max_age)`` is the session's lookup (None while the scheduler
    does not answer); :meth:`info` returns the last answer between looks,
    so the wait's progress text still names a state. A look at another job
    (the head pointer moved) starts the pace again.
    """

    def __init__(self, look: Callable[[str, float], JobInfo | None], *,
                 clock: Callable[[], float] = time.monotonic):
        self.look = look
        self.clock = clock
        self.job_id: str | None = None
        self.last: JobInfo | None = None
        self._delay: float | None = None
        self._next = 0.0

    def info(self, job_id: str) -> JobInfo | None:
        if not sharing_enabled():
            self.job_id, self.last = job_id, self.look(job_id, 0.0)   # the old way: every look asks
            return self.last
        now = self.clock()
        if job_id != self.job_id:
            self.job_id, self.last, self._delay, self._next = job_id, None, None, now
        if now >= self._next:
            self.last = self.look(job_id, WATCH_MAX_AGE)
            self._delay = next_check_delay(self.last.state if self.last else None, self._delay)
            self._next = now + self._delay
        return self.last


__all__ = ["ACTIVE_EVERY", "PENDING_MAX", "SchedulerLooks", "STATUS_MAX_AGE", "WATCH_MAX_AGE",
           "next_check_delay", "watch_max_age"]
