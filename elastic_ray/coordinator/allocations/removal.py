"""Removing a worker allocation: drain it (cancel a pending one), then wait for its end.

The wait used to ask the scheduler every half second until it said the job
was final. Its end is first seen in the agents' published states: an agent
that drained writes its last state with ``exited`` and exit code 0, and
only then does its job complete. So the wait reads the node files every
poll (the fast path, and what makes removing an idle worker take about a
second) and asks the scheduler at a decreasing pace (``removal_check_delay``)
for what the agents cannot tell: a job cancelled before any agent ran, or
one that ended otherwise. It lives apart from ``session`` because it is one
job with its own decision (:func:`removal_outcome`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Protocol

from ...config import SlurmWorkerAllocationConfig
from ...polling import wait_for
from ...protocol.disk import event_log
from ...protocol.disk.events import EventKind, EventSource
from ...protocol.disk.records import AllocationRecord, NodeState, WorkerIntent
from ...protocol.disk.session_dir import SessionDir
from ...scheduler.base import JobInfo, JobState, Scheduler
from .jobs import SessionJobs
from .pacing import SchedulerLooks, removal_check_delay

log = logging.getLogger("elastic_ray.coordinator")

# The fast path (the agents' node files) is read this often; the scheduler
# is looked at on its own pace (removal_check_delay), not at every poll.
POLL_INTERVAL = 0.1
#: how much longer than its drain a removed allocation may take to end
END_GRACE = 60.0


def agents_ended(states: Mapping[str, NodeState], nodes: int) -> bool:
    """Pure: every one of the job's ``nodes`` agents published a clean end (exited, code 0).

    Fewer published nodes than the job has says nothing: an agent that never
    started publishes nothing, and its node may still run.
    """
    ended = [st for st in states.values() if st.exited and st.exit_code == 0]
    return nodes > 0 and len(ended) >= nodes and len(ended) == len(states)


def removal_outcome(info: JobInfo | None, states: Mapping[str, NodeState], nodes: int) -> JobState | None:
    """Pure: the final state a removal returns, or None to keep waiting.

    The scheduler's final state when it has one; else COMPLETED once every
    agent published a clean end, which is how such a job ends (the batch
    step exits 0 right after). Any other end is left to the scheduler.
    """
    if info is not None and info.state.is_final:
        return info.state
    if agents_ended(states, nodes):
        return JobState.COMPLETED
    return None


class RemovingSession(Protocol):
    """What a removal needs of the session."""

    @property
    def dir(self) -> SessionDir: ...
    @property
    def scheduler(self) -> Scheduler: ...
    @property
    def jobs(self) -> SessionJobs: ...
    def record(self) -> AllocationRecord: ...
    def job_info(self, job_id: str, unreachable_ok: bool = False, max_age: float = 0.0) -> JobInfo | None: ...
    def node_states(self, job_id: str) -> dict[str, NodeState]: ...
    def drain_job(self, job_id: str, drain_timeout: float, reason: str) -> int: ...


def remove_worker_allocation(session: RemovingSession, job_id: str, drain_timeout: float, wait: bool,
                             progress: Callable[[str], None] | None) -> JobState:
    """See ``Session.remove_worker_allocation``."""
    rec = session.record()
    if job_id not in rec.workers:
        raise ValueError(f"handle: job {job_id} is not a worker allocation of this session")
    nodes = SlurmWorkerAllocationConfig.from_dict(rec.workers[job_id].config).num_nodes or 1
    info = session.job_info(job_id)
    state = info.state if info else JobState.ENDED_UNKNOWN
    if state is JobState.PENDING:
        # (the intent first, or a poll in between takes the CANCELLED for a failure)
        session.dir.update_allocation(lambda r: r.with_worker(replace(r.workers[job_id], state=WorkerIntent.REMOVED)))
        session.scheduler.cancel(job_id)
        event_log.emit(session.dir.path, EventKind.REMOVED, EventSource.COORDINATOR, job=job_id,
                       reason="cancelled while pending", state=JobState.CANCELLED.value)
    elif state.is_active:
        event_log.emit(session.dir.path, EventKind.DRAIN_REQUESTED, EventSource.COORDINATOR, job=job_id,
                       reason="remove_worker_allocation", drain_timeout=drain_timeout)
        told = session.drain_job(job_id, drain_timeout, "remove_worker_allocation")
        if told == 0:
            # No agent answered (none started yet, or all hung): Slurm ends it.
            session.scheduler.cancel(job_id)
    session.dir.update_allocation(lambda r: r.with_worker(replace(r.workers[job_id], state=WorkerIntent.REMOVED)))
    # The session's shared answer predates this change: no watcher may take it.
    session.jobs.shared.forget()
    if not wait:
        return state
    looks = SchedulerLooks(lambda job, max_age: session.job_info(job, unreachable_ok=True, max_age=max_age),
                           pace=removal_check_delay, max_age=None)

    # The agents stop their nodes at the drain deadline; allow them a little more.
    def final_state() -> JobState | None:
        latest = looks.info(job_id)
        outcome = removal_outcome(latest, session.node_states(job_id), nodes)
        if outcome is None and progress:
            progress(f"job {job_id}: {latest.state.value if latest else '?'} (draining)")
        return outcome

    final = wait_for(final_state, timeout=drain_timeout + END_GRACE, interval=POLL_INTERVAL, raising=False)
    if final is None:
        session.scheduler.cancel(job_id)
        event_log.emit(session.dir.path, EventKind.REMOVED, EventSource.COORDINATOR, job=job_id,
                       reason="did not end after its drain: cancelled", state=JobState.CANCELLED.value)
        raise TimeoutError(f"worker allocation {job_id} did not end after its drain; cancelled it")
    if state is not JobState.PENDING:
        event_log.emit(session.dir.path, EventKind.REMOVED, EventSource.COORDINATOR, job=job_id,
                       reason="drained and ended", state=final.value)
    return final


__all__ = ["RemovingSession", "agents_ended", "remove_worker_allocation", "removal_outcome"]
