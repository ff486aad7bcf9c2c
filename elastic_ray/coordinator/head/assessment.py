"""Does the run's head need an election? The facts gathered for the rule.

The rule itself is pure (``election.assess_head``); this gathers what it
needs from the session directory, one scheduler answer and a heartbeat
observation, the same way in every process of the run.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...protocol.disk.records import AgentState, AllocationRecord
from ...protocol.disk.session_dir import SessionDir
from ...scheduler.base import JobInfo
from . import election
from .failover import HEAD_START_GRACE
from .headwatch import HeadObservation

#: A head that published its endpoint but whose first heartbeat has not been
#: heard yet counts as starting this long: the subscription needs a moment.
PUBLISHED_GRACE = 5.0


def assess(directory: SessionDir, rec: AllocationRecord, jobs: Mapping[str, JobInfo], obs: HeadObservation,
           now: float, *, submitted_at: float = 0.0) -> election.HeadAssessment:
    """The head's assessment; ``submitted_at`` is when this process submitted
    the head's job, if it did (0: it did not)."""
    head = rec.head_job or ""
    info = jobs.get(head)
    # When did this head's job start? Any process can tell from the
    # scheduler; this process may also remember submitting it.
    started = max(submitted_at, (info.start_time or 0.0) if info else 0.0)
    endpoint = directory.read_head_endpoint(head) if head else None
    if endpoint is None:
        starting = now - started < HEAD_START_GRACE
    else:
        starting = now - endpoint.started_at < PUBLISHED_GRACE
    # The pointer and the record name the same head except inside an
    # election; the heartbeat we hold is only about the pointer's head.
    alive = obs.alive and obs.job == rec.head_job
    # A drain shows in the next heartbeat (up to 1 s away); the agent's
    # node file says DRAINING at once (written before it answers the
    # drain request), for every process.
    draining = alive and bool(head) and (obs.draining or any(
        st.state is AgentState.DRAINING for st in directory.read_node_states(head).values()))
    return election.assess_head(rec, jobs, head_alive=alive, now=now, head_draining=draining,
                                head_starting=starting)


__all__ = ["PUBLISHED_GRACE", "assess"]
