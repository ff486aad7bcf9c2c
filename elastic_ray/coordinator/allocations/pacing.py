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

import enum
import time
from collections.abc import Callable, Mapping

from ...scheduler.base import JobInfo, JobState
from .answers import sharing_enabled
from ..head.election import HeadCondition

#: how old a shared scheduler answer a watcher accepts (s)
WATCH_MAX_AGE = 10.0
#: ``elastic-ray session status``: the watchers' age, so a status every second
#: (``watch``) keeps the session at one scheduler query per 10 s; the output
#: says how old the answer is, and ``--max-age 0`` asks afresh.
STATUS_MAX_AGE = WATCH_MAX_AGE
PENDING_FIRST = 2.0
PENDING_FACTOR = 2.0
PENDING_MAX = 30.0
ACTIVE_EVERY = 10.0
#: after a removal's own drain or cancel: soon, then less often (its agents' end is the fast path)
REMOVAL_FIRST = 0.5


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


def removal_check_delay(state: JobState | None, previous: float | None) -> float:
    """Pure: seconds until a removal's next scheduler look, whatever the state.

    The removal itself just drained or cancelled the job, so the scheduler's
    answer is about to change: 0.5, 1, 2, 4, 8, 10, 10... s. The agents'
    published end (read every poll) usually finishes the wait before that.
    """
    if previous is None:
        return REMOVAL_FIRST
    return min(ACTIVE_EVERY, max(REMOVAL_FIRST, previous * PENDING_FACTOR))


def look_max_age(max_age: float | None, delay: float | None) -> float:
    """Pure: the answer age one look accepts. A number is taken as it is;
    None means "as old as this wait's pace" (the delay before the look, 0 for
    the first one, at most ``WATCH_MAX_AGE``), for waits that start right
    after their own change to the job."""
    if max_age is not None:
        return max_age
    return min(WATCH_MAX_AGE, delay or 0.0)


#: every how many supervisor checks one asks the scheduler itself (strays are settled on own answers only)
SUPERVISOR_FRESH_EVERY = 5


def supervisor_max_age(check: int) -> float:
    """Pure: the answer age the supervisor's ``check``-th periodic look (from 0) accepts.

    Its looks take the shared answer, so that many supervising processes
    cost one query per ``WATCH_MAX_AGE``; but a stray job is cancelled only
    on an answer its process asked for itself (``SessionJobs.query``), and
    other watchers keep the shared answer fresh. So the first check and
    every ``SUPERVISOR_FRESH_EVERY``-th ask themselves (every 150 s at the
    default 30 s interval).
    """
    return 0.0 if check % SUPERVISOR_FRESH_EVERY == 0 else watch_max_age()


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
                 clock: Callable[[], float] = time.monotonic,
                 pace: Callable[[JobState | None, float | None], float] = next_check_delay,
                 max_age: float | None = WATCH_MAX_AGE):
        self.look = look
        self.clock = clock
        self.pace = pace
        self.max_age = max_age
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
            self.last = self.look(job_id, look_max_age(self.max_age, self._delay))
            self._delay = self.pace(self.last.state if self.last else None, self._delay)
            self._next = now + self._delay
        return self.last


class FailoverStep(str, enum.Enum):
    """What a caller of ``replace_head`` does after one look at the head."""

    RETURN = "return"       # the head is healthy: hand it out
    ELECT = "elect"         # take the election claim; judge again on a fresh answer before acting
    LOOK_NOW = "look_now"   # confirm on a fresh answer: before handing a head out, or when Ray
                            # answers but the (shared) answer says otherwise (it is behind)
    WAIT = "wait"           # the fast path (heartbeat, head.json, the record) is watched; Slurm at its pace


def failover_step(condition: HeadCondition, *, heartbeat_alive: bool, may_ask: bool) -> FailoverStep:
    """Pure: the next step of a wait for a healthy head.

    ``heartbeat_alive``: the record's head answers its heartbeat.
    ``may_ask``: no fresh answer about this head was asked for within
    ``ACTIVE_EVERY`` (so asking now cannot turn into a query every poll).
    A healthy head is handed out on a fresh answer, as before (a head
    cancelled a moment ago may still answer its heartbeat); that is one
    query per call, never one per poll. An election always goes ahead to
    the claim: acting needs a fresh answer, which the claim's holder asks
    for; a process that does not get the claim asks nothing and watches for
    the new head instead.
    """
    if condition is HeadCondition.HEALTHY:
        return FailoverStep.LOOK_NOW if may_ask else FailoverStep.RETURN
    if condition.needs_election:
        return FailoverStep.ELECT
    if heartbeat_alive and may_ask:
        return FailoverStep.LOOK_NOW
    return FailoverStep.WAIT


class SessionLooks:
    """The paced scheduler view of a wait for the head: the session's whole
    answer (an election needs every job), looked at as :class:`SchedulerLooks`
    paces one job, the head's state setting the pace.

    ``query(max_age)`` is the session's query. :meth:`jobs` is the paced
    (shared) view, :meth:`fresh` asks the scheduler now (before acting).
    """

    def __init__(self, query: Callable[[float], Mapping[str, JobInfo]], *,
                 clock: Callable[[], float] = time.monotonic):
        self.query = query
        self.clock = clock
        self.head: str | None = None
        self.last: Mapping[str, JobInfo] = {}
        self._delay: float | None = None
        self._next = 0.0
        self._asked_at: float | None = None   # the last fresh answer about ``head``

    def _restart(self, head: str | None) -> None:
        if head != self.head:
            self.head, self.last, self._delay, self._next, self._asked_at = head, {}, None, self.clock(), None

    def jobs(self, head: str | None) -> Mapping[str, JobInfo]:
        if not sharing_enabled():
            self.head, self.last = head, self.query(0.0)   # the old way: every look asks
            return self.last
        self._restart(head)
        now = self.clock()
        if now >= self._next:
            self._take(self.query(WATCH_MAX_AGE), now)
        return self.last

    def fresh(self, head: str | None) -> Mapping[str, JobInfo]:
        self._restart(head)
        now = self.clock()
        self._asked_at = now
        self._take(self.query(0.0), now)
        return self.last

    def may_ask(self, head: str | None) -> bool:
        """No fresh answer about ``head`` within ``ACTIVE_EVERY`` (see :func:`failover_step`)."""
        self._restart(head)
        return self._asked_at is None or self.clock() - self._asked_at >= ACTIVE_EVERY

    def _take(self, jobs: Mapping[str, JobInfo], now: float) -> None:
        self.last = jobs
        info = jobs.get(self.head) if self.head else None
        self._delay = next_check_delay(info.state if info else None, self._delay)
        self._next = now + self._delay


__all__ = ["ACTIVE_EVERY", "FailoverStep", "PENDING_MAX", "SchedulerLooks", "SessionLooks", "STATUS_MAX_AGE",
           "WATCH_MAX_AGE", "failover_step", "look_max_age", "next_check_delay", "removal_check_delay",
           "supervisor_max_age", "watch_max_age"]
