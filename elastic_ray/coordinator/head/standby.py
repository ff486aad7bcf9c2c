"""The warm standby head (``RayLauncher.standby_head``): where it goes, and sending it there.

A lost head is replaced by an election (:mod:`.election`, carried out by
:mod:`.failover`); when it picks a worker allocation, that allocation's first
node must start a head-only Ray control plane, and `ray start --head` on a
busy node takes seconds on the failover's critical path. A standby is that
control plane started ahead of time on the allocation the *next* election
would pick, unpublished; the election's ``host_head`` then only publishes it
(``agent.head.hosted``: STANDBY -> READY without a start).

So the target is simply ``election.choose_head`` asked as if the current head
were lost now: the election needs no change, and the standby sits wherever
it will look first. Standbys anywhere else are dropped. The decision
(:func:`standby_plan`) is pure, from the record, the scheduler's answer and
the agents' published node states; :class:`StandbyKeeper` is its effect,
run by the session's supervisor (:mod:`.supervise`). A restarted supervisor
finds the standbys from the agents' published states: there is no state of
its own to lose.

Left alone on purpose: an election in progress (its claim is live: it may be
promoting the standby right now), a session without a head (the election
comes first), and a session with a published successor (the election takes
the successor, so a standby would idle for nothing; it is dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ...config.launcher import RayLauncher
from ...protocol.wire.channel import ControlClient
from ...protocol.disk import event_log
from ...protocol.disk.events import EventKind, EventSource
from ...protocol.disk.session_dir import SessionDir
from ...protocol.disk.records import AgentState, AllocationRecord, HostedHeadState, NodeState, WorkerIntent
from ...scheduler.base import JobInfo, JobState
from . import election
from .standby_retry import next_try_at
from .failover import ask_agent, first_node
from ..allocations.pacing import watch_max_age

log = logging.getLogger("elastic_ray.coordinator")

#: How soon the keeper looks again while a standby is on its way (the first
#: node still joining, the standby starting, a request just sent).
RECHECK_SOON = 5.0

#: Hosted states that are (or may become) a standby the coordinator placed.
_STANDBY_LIKE = (HostedHeadState.STANDBY, HostedHeadState.STARTING)


@dataclass(frozen=True)
class StandbyPlan:
    """What to do now: ask ``place_on``'s first node for a standby, ask each
    of ``drop_on``'s to drop theirs. ``soon``: something is on its way, look
    again before the supervisor's next check. ``target``: the allocation the
    next election would pick (None: none, or no standby wanted)."""

    target: str | None
    place_on: str | None = None
    drop_on: tuple[str, ...] = ()
    soon: bool = False
    retry_at: float | None = None     # a failed standby is tried again then (:mod:`.standby_retry`)
    why: str = field(default="", compare=False)


def _job_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (-1, job_id)


def agents_may_run(record: AllocationRecord, jobs: Mapping[str, JobInfo]) -> list[str]:
    """The worker allocations whose agents may still hold a standby: every
    one not removed, and a removed one whose job is still active (it is
    recorded ``removed`` as soon as its drain is asked, while its agents run
    on until they leave)."""
    return [job for job, worker in record.workers.items()
            if worker.state != WorkerIntent.REMOVED or ((info := jobs.get(job)) is not None and info.state.is_active)]


def _running(jobs: Mapping[str, JobInfo], job: str) -> bool:
    info = jobs.get(job)
    return info is not None and info.state is JobState.RUNNING


def _hosted(state: NodeState | None) -> HostedHeadState | None:
    return None if state is None or state.hosted_head is None else state.hosted_head.state


def standby_plan(record: AllocationRecord, jobs: Mapping[str, JobInfo],
                 nodes: Mapping[str, Mapping[str, NodeState]], launcher: RayLauncher, now: float) -> StandbyPlan:
    """Pure: where the standby should be, given the record, the scheduler's
    answer ``jobs`` and ``nodes`` (job id -> node -> published state, for the
    session's worker allocations)."""
    if not launcher.keeps_standby:
        return StandbyPlan(None, why="standby_head is off")
    if election.live_claim(record, now) is not None:
        return StandbyPlan(None, why="an election is in progress; standbys are left as they are")
    if record.head_job is None:
        return StandbyPlan(None, why="the session has no head yet; the election comes first")

    # Standbys now: the first nodes (of allocations other than the head's)
    # whose hosted control plane is up or starting. The head's own one is
    # the run's head, never a standby. Only a RUNNING job's agents can be
    # asked to drop one: a job that left RUNNING (requeued after its node
    # went down, ending) took its standby with it, while its node file may
    # still say STANDBY (a node cut off the network writes no more).
    standing = sorted((job for job, states in nodes.items()
                       if job != record.head_job and _running(jobs, job)
                       and _hosted(first_node(states)) in _STANDBY_LIKE),
                      key=_job_key)

    successor = record.successor
    if successor is not None and successor != record.head_job and successor not in record.predecessors:
        return StandbyPlan(None, drop_on=tuple(standing),
                           why=f"successor {successor} is published; the next election takes it")

    choice = election.choose_head(record, jobs, can_host_on_worker=True, now=now)
    if not isinstance(choice, election.HostOnWorker):
        # A worker allocation still queued may start any moment: look again soon, so its
        # standby goes up once its first node joined rather than at the next periodic check.
        queued = any(job != record.head_job and w.state != WorkerIntent.REMOVED
                     and (info := jobs.get(job)) is not None and info.state is JobState.PENDING
                     for job, w in record.workers.items())
        return StandbyPlan(None, drop_on=tuple(standing), soon=queued,
                           why=f"no worker allocation to stand by on: {choice.why}")
    target = choice.job_id
    drop_on = tuple(job for job in standing if job != target)
    first = first_node(nodes.get(target, {}))
    if first is None:
        return StandbyPlan(target, drop_on=drop_on, soon=True,
                           why=f"next head {target}: its first node's agent has not published yet")
    hosted = _hosted(first)
    if hosted is HostedHeadState.STANDBY:
        return StandbyPlan(target, drop_on=drop_on, why=f"next head {target}: its standby is ready")
    if hosted is HostedHeadState.STARTING:
        return StandbyPlan(target, drop_on=drop_on, soon=True, why=f"next head {target}: its standby is starting")
    if hosted is HostedHeadState.READY:
        return StandbyPlan(target, drop_on=drop_on, why=f"next head {target} already hosts a ready head")
    if first.state is not AgentState.JOINED:
        # A standby's start would compete with the worker's own for the node's CPUs.
        return StandbyPlan(target, drop_on=drop_on, soon=True,
                           why=f"next head {target}: its first node is {first.state.value}, not JOINED yet")
    if hosted is HostedHeadState.FAILED:
        # Placed again once its wait is over, a longer one after each failure in a row.
        assert first.hosted_head is not None
        retry_at = next_try_at(first.hosted_head)
        failures = first.hosted_head.failures or 1
        if retry_at is not None and now < retry_at:
            return StandbyPlan(target, drop_on=drop_on, retry_at=retry_at,
                               why=f"next head {target}: its standby failed {failures}x in a row "
                                   f"({first.hosted_head.reason or 'no reason given'}); next try in {retry_at - now:.0f}s")
        return StandbyPlan(target, place_on=target, drop_on=drop_on,
                           why=f"next head {target}: its standby failed {failures}x in a row; starting another")
    return StandbyPlan(target, place_on=target, drop_on=drop_on, soon=True,
                       why=f"next head {target}: starting its standby")


# ---------------------------------------------------------------- the effect

class StandbySession(Protocol):
    """What the keeper needs of a session (a ``Session`` provides it)."""

    @property
    def job_name(self) -> str: ...
    @property
    def launcher(self) -> RayLauncher: ...
    @property
    def dir(self) -> SessionDir: ...
    def record(self) -> AllocationRecord: ...
    def query(self, extra: list[str] | None = None, max_age: float = 0.0) -> dict[str, JobInfo]: ...
    def node_states(self, job_id: str) -> dict[str, NodeState]: ...
    def control(self, endpoint: str) -> ControlClient: ...


class StandbyKeeper:
    """Applies :func:`standby_plan` at the supervisor's checks, and sooner
    while a standby is on its way (:data:`RECHECK_SOON`)."""

    def __init__(self, session: StandbySession, interval: float):
        self.session = session
        self.interval = interval
        self.next_at = 0.0
        self.last: StandbyPlan | None = None

    def due(self, now: float) -> bool:
        return now >= self.next_at

    def apply(self, now: float) -> StandbyPlan:
        """Look (the session's shared scheduler answer is enough: nothing here
        changes who the head is) and send the requests the plan asks for."""
        s = self.session
        self.next_at = now + self.interval   # a look that fails is not repeated at once
        rec = s.record()
        jobs = s.query(max_age=watch_max_age())
        nodes = {job: s.node_states(job) for job in agents_may_run(rec, jobs)}
        plan = standby_plan(rec, jobs, nodes, s.launcher, now)
        if plan != self.last:
            log.info("event=standby_plan session=%s target=%s place=%s drop=%s why=%r", s.job_name, plan.target,
                     plan.place_on, ",".join(plan.drop_on) or "-", plan.why)
        self.last = plan
        for job in plan.drop_on:
            self._send(nodes[job], job, "drop_standby")
        if plan.place_on is not None:
            self._send(nodes[plan.place_on], plan.place_on, "standby_head")
        self.next_at = now + (RECHECK_SOON if plan.soon else self.interval)
        if plan.retry_at is not None:
            self.next_at = min(self.next_at, max(plan.retry_at, now + 1.0))
        return plan

    def _send(self, states: Mapping[str, NodeState], job: str, kind: str) -> None:
        reply = ask_agent(self.session, first_node(states), job, kind, {"job": job})
        if reply is not None:
            log.info("event=standby_request session=%s job=%s kind=%s hosted=%s", self.session.job_name, job, kind,
                     (reply.get("hosted_head") or {}).get("state"))
            if kind == "standby_head":
                event_log.emit(self.session.dir.path, EventKind.STANDBY_PLACED, EventSource.COORDINATOR, job=job,
                               state=(reply.get("hosted_head") or {}).get("state"))


def keeper(session: StandbySession, interval: float) -> StandbyKeeper | None:
    """The session's keeper, or None when its launcher keeps no standby."""
    return StandbyKeeper(session, interval) if session.launcher.keeps_standby else None


__all__ = ["agents_may_run", "keeper", "RECHECK_SOON", "StandbyKeeper", "StandbyPlan", "StandbySession", "first_node", "standby_plan"]
