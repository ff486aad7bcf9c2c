"""Is the run's head ready for a payload, and is it lost? Waits that never elect.

A payload launcher (the Dagster resources, the SSH mode's cluster side)
needs the current head once it is healthy, waiting while it is queued or
starting, and must leave electing to ``replace_head``: these two functions
answer that, on the session's shared scheduler answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ... import defaults
from ...errors import SlurmAllocationEnded
from . import election
from ..allocations import pacing
from ..handles import Head
from ..ports import SupervisedSession

log = logging.getLogger("elastic_ray.coordinator")


def ready_head(s: SupervisedSession, timeout: float = defaults.WAIT_TIMEOUT,
               progress: Callable[[str], None] | None = None) -> Head:
    """The current head once it is healthy; waits while it is queued or
    starting. A head that ended, stopped or drains raises
    ``SlurmAllocationEnded`` (this does not elect: call ``replace_head``).

    The heartbeat is watched all the time; the scheduler's answer is the
    session's shared one at the pace of ``pacing.SessionLooks`` (a queued
    head: after 2, 4, 8... up to 30 s), asked afresh before it raises."""
    deadline = time.monotonic() + timeout
    looks = pacing.SessionLooks(lambda max_age: s.query(max_age=max_age))
    waiting_for = ""
    while True:
        obs = s.observe_head(wait=0.5)
        rec = s.record()
        jobs = looks.jobs(rec.head_job)
        assessment = s.assess_head(rec, jobs, obs, time.time())
        step = pacing.failover_step(assessment.condition, heartbeat_alive=obs.alive and obs.job == rec.head_job,
                                    may_ask=looks.may_ask(rec.head_job))
        if step is pacing.FailoverStep.ELECT or step is pacing.FailoverStep.LOOK_NOW:
            # Raising tells the caller to elect: say so only on the scheduler's word of now.
            jobs = looks.fresh(rec.head_job)
            assessment = s.assess_head(rec, jobs, obs, time.time())
        if assessment.condition is election.HeadCondition.HEALTHY and obs.address and rec.head_job:
            return Head(rec.head_job, obs.address, s)
        if assessment.needs_election:
            job = rec.head_job
            info = jobs.get(job) if job else None
            state = info.state.value if info is not None and not info.state.is_active \
                else assessment.condition.value.upper()
            raise SlurmAllocationEnded(f"the run's head {job} cannot take a payload ({assessment.why}); "
                                       f"call replace_head() and launch again", allocation_state=state,
                                       job_id=job)
        if assessment.why != waiting_for:   # e.g. "head job 12 is still PENDING (Priority)"
            waiting_for = assessment.why
            log.info("event=ready_head_waiting session=%s why=%r", s.job_name, waiting_for)
            if progress is not None:
                progress(waiting_for)
        if time.monotonic() > deadline:
            raise TimeoutError(f"the run's head is not ready after {timeout:.0f}s: {assessment.why}")


def head_is_lost(s: SupervisedSession) -> bool:
    """Whether the head must be replaced now (ended, stopped, draining, replaced)."""
    assessment = s.assess_head(s.record(), s.query(), s.observe_head(wait=1.0), time.time())
    return assessment.needs_election
