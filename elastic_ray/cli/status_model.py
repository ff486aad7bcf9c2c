"""The status model of ``elastic-ray session status``: one JSON-ready dict. Pure.

Built from what one scheduler query answered, the session's records, the
agents' published node states and one heartbeat observation, so the whole
view is tested without a scheduler, a head or a terminal. Rendering it is
``status_view``'s job; collecting the inputs is ``session``'s.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import defaults
from ..coordinator.allocations.failures import failures_of
from ..coordinator.head.headwatch import HeadObservation
from ..coordinator.head.standby_retry import next_try_at
from ..protocol.disk.events import Event, EventKind, EventSource
from ..protocol.disk.records import AllocationRecord, HeadEndpoint, NodeState, SessionInfo, WorkerRecord
from ..scheduler.base import JobInfo, JobState
from .dashboard_model import locate_dashboard, status_line

# An agent rewrites its node file in the session directory at every state
# change and at least every defaults.STATUS_REFRESH (20 s) while it runs;
# older than this (three refreshes missed, and not exited) it is shown as stale.
AGENT_STALE_AFTER = defaults.AGENT_STALE_AFTER
ACTIVE_STATES = frozenset(s.value for s in JobState if s.is_active)


def job_sort_key(job_id: str) -> tuple[int, str]:
    return (int(job_id), job_id) if job_id.isdigit() else (sys.maxsize, job_id)


def _time_left(info: JobInfo | None, now: float) -> float | None:
    if info is None or not info.state.is_active:
        return None
    if info.time_left is not None:
        return max(0.0, info.time_left)
    if info.end_time is not None and math.isfinite(info.end_time) and info.state.is_running:
        return max(0.0, info.end_time - now)
    return None


def node_shown_state(agent: str | None, job: JobInfo | None, exited: bool = False) -> tuple[str | None, str]:
    """Pure: the state a node is shown in, and why it differs from what its agent last published.

    An agent's file outlives the agent: a node of a job that FAILED, was
    requeued or is gone from the scheduler may still say JOINED. Only a
    RUNNING job's nodes show their agent's own state; the others show
    ``ENDED`` (the job ended), ``GONE`` (requeued and waiting, or unknown
    to the scheduler), ``ENDING`` (COMPLETING) or ``SUSPENDED``, with the
    job's state as the reason. An agent that recorded its own exit said its
    last word (LEFT, RELEASED, FAILED) and is shown so; a node without an
    agent record stays unknown.
    """
    if agent is None or exited:
        return agent, ""
    if job is None:
        return "GONE", "job not reported by the scheduler"
    state = job.state
    if state is JobState.RUNNING:
        return agent, ""
    if state is JobState.PENDING:
        return "GONE", "job PENDING (requeued)"
    if state is JobState.ENDED_UNKNOWN:
        return "GONE", "job no longer known to the scheduler"
    if state is JobState.COMPLETING:
        return "ENDING", "job COMPLETING"
    if state is JobState.SUSPENDED:
        return "SUSPENDED", "job SUSPENDED"
    return "ENDED", f"job {state.value}"


def _node_rows(info: JobInfo | None, states: Mapping[str, NodeState], now: float,
               stale_after: float = AGENT_STALE_AFTER) -> list[dict[str, Any]]:
    """One entry per node: the scheduler's node list, plus any node whose agent published a state.

    A node without a (readable) state has no agent columns: unknown.
    ``node_state`` is what the node is shown as (:func:`node_shown_state`),
    ``agent_state`` what its agent last published.
    """
    names = list(info.nodes) if info else []
    names += sorted(n for n in states if n not in names)
    rows = []
    for name in names:
        state = states.get(name)
        age = None if state is None else now - state.updated_at
        exited = state is not None and state.exited
        agent = None if state is None else state.state.value
        shown, why = node_shown_state(agent, info, exited)
        rows.append({
            "node": name,
            "ray_node_id": None if state is None else state.node_id,
            "node_state": shown,
            "node_state_reason": why,
            "agent_state": agent,
            "agent_exited": exited,
            # Stale only matters while the job runs; after it, the job's state says enough.
            "agent_stale": (bool(agent) and not exited and age is not None and age > stale_after
                            and info is not None and info.state.is_active),
            "agent_updated_age": None if age is None else round(age, 1),
            # Processes of the job the OOM killer ended, as the node's agent last counted them
            # (agent.node.oom); None: not counted (no memory cgroup per job, or an older agent).
            "oom_kills": None if state is None else state.oom_kills,
            # The head-only control plane this node hosts: READY (the run's head),
            # STANDBY (RayLauncher.standby_head), STARTING, FAILED; None: none.
            "hosted_head": None if state is None or state.hosted_head is None else state.hosted_head.state.value,
            # A STANDBY's worker kept joined to it (agent.head.standby_worker): its `ray start`, once joined.
            **({} if state is None or state.hosted_head is None or state.hosted_head.worker_pid is None
               else {"hosted_head_worker_pid": state.hosted_head.worker_pid}),
            # A FAILED one: failed starts in a row, why, and when the keeper tries a standby there again.
            **({} if state is None or (failed := next_try_at(state.hosted_head)) is None or state.hosted_head is None
               else {"hosted_head_failures": state.hosted_head.failures or 1,
                     "hosted_head_reason": state.hosted_head.reason, "hosted_head_retry_at": failed}),
        })
    return rows


def _resubmission(worker: WorkerRecord | None) -> dict[str, Any] | None:
    """What the record says about a worker's failure and its replacements (None: nothing)."""
    if worker is None or (worker.ended is None and not worker.resubmit_on_failure and worker.replaces is None):
        return None
    return {"ended": None if worker.ended is None else worker.ended.to_dict(),
            "resubmit_left": worker.resubmit_on_failure, "replaces": worker.replaces,
            "replaced_by": worker.replaced_by}


def _drain(worker: WorkerRecord | None) -> dict[str, Any] | None:
    if worker is None:
        return None
    return {"state": worker.state, "requested_at": worker.drain_requested_at, "deadline": worker.drain_deadline}


def _heartbeat(pointer: str | None, jobs: Mapping[str, JobInfo], endpoint: HeadEndpoint | None,
               observation: HeadObservation | None) -> str:
    if pointer is None:
        return "no head"
    info = jobs.get(pointer)
    if info is not None and info.state.is_final:
        return "job ended"
    if endpoint is None:
        return "not ready"
    if observation is None or observation.job != pointer:
        return "unknown"
    return "live" if observation.alive else "silent"


def build_status(*, path: str | Path, info: SessionInfo, record: AllocationRecord, jobs: Mapping[str, JobInfo],
                 nodes: Mapping[str, Mapping[str, NodeState]], pointer: str | None,
                 endpoint: HeadEndpoint | None, observation: HeadObservation | None,
                 now: float, stale_after: float = AGENT_STALE_AFTER) -> dict[str, Any]:
    """Everything ``session status`` shows, as one JSON-ready dict. Pure.

    ``jobs`` is the answer of one scheduler query; ``nodes`` maps a job id
    to its agents' published states; ``pointer`` is what ``ray_head`` names;
    ``observation`` is the head's heartbeat as observed (None if not asked).
    A job the scheduler was not asked about is shown as ``UNKNOWN``.
    """
    roles: dict[str, str] = {}
    for job in record.predecessors:
        roles[job] = "head (replaced)"
    if record.successor:
        roles[record.successor] = "head (successor)"
    for job in record.workers:
        # A worker allocation that hosted the run's head before (the default layout) still computes.
        roles[job] = "worker (was head)" if job in record.predecessors else "worker"
    if record.head_job:
        roles[record.head_job] = "worker+head" if record.head_job in record.workers else "head"
    if pointer and pointer not in roles:
        roles[pointer] = "head (pointer)"
    for job in jobs:
        roles.setdefault(job, "unrecorded")

    order = {"head": 0, "worker+head": 0, "head (pointer)": 1, "head (successor)": 2,
             "head (replaced)": 3, "worker": 4, "worker (was head)": 4, "unrecorded": 5}
    rows = []
    for job_id in sorted(roles, key=lambda j: (order[roles[j]], job_sort_key(j))):
        job = jobs.get(job_id)
        worker = record.workers.get(job_id)
        config = worker.config if worker else {}
        node_rows = _node_rows(job, nodes.get(job_id, {}), now, stale_after)
        if roles[job_id] == "head (replaced)":
            # Its job may still run for a while, but it is no one's head now.
            for node in node_rows:
                if node["agent_state"] is not None and not node["agent_exited"] \
                        and node["node_state"] == node["agent_state"]:
                    node["node_state"], node["node_state_reason"] = "REPLACED", "no longer the run's head"
        rows.append({
            "role": roles[job_id],
            "job_id": job_id,
            "partition": (job.partition if job and job.partition else None) or config.get("partition"),
            "state": job.state.value if job else "UNKNOWN",
            "reason": job.reason if job else "",
            "time_left": None if (left := _time_left(job, now)) is None else round(left, 1),
            "nodes": node_rows,
            "drain": _drain(worker),
            "failure": _resubmission(worker),
        })

    heartbeat = _heartbeat(pointer, jobs, endpoint, observation)
    age = observation.last_beat_age if observation is not None and observation.job == pointer else None
    election = record.election
    return {
        "session": {"path": str(path), "job_name": info.job_name, "session_id": info.session_id,
                    "scheduler": info.scheduler.get("kind")},
        "head": {
            "job_id": pointer,
            "recorded_job_id": record.head_job,
            "address": endpoint.address if endpoint else None,
            # The dashboard's ip:port, or None and why (off, not ready yet): see dashboard_model.
            **_dashboard(pointer, endpoint, info.launcher),
            "heartbeat": heartbeat,
            "last_beat_age": None if age is None else round(age, 2),
            "draining": bool(observation and observation.job == pointer and observation.draining),
        },
        "election": None if election is None else {
            "claimant": election.claimant, "since": election.since, "expires": election.expires,
            "live": election.is_live(now)},
        "successor": record.successor,
        "jobs": rows,
        # Worker allocations that ended without the session asking (recorded by any process).
        "failures": [f.to_dict() for f in failures_of(record)],
        "active_jobs": sum(1 for r in rows if r["state"] in ACTIVE_STATES),
        "observed_at": now,
    }


def driver_oom_steps(events: Iterable[Event]) -> dict[str, list[str]]:
    """Pure: by head job, the payload driver steps the OOM killer ended (the coordinator's
    ``oom_killed`` events, written when a failed driver's step ended OUT_OF_MEMORY)."""
    found: dict[str, list[str]] = {}
    for event in events:
        if event.kind is EventKind.OOM_KILLED and event.by is EventSource.COORDINATOR and event.job:
            found.setdefault(event.job, []).append(str(event.details.get("step") or "?"))
    return found


def failed_election(events: Iterable[Event]) -> dict[str, Any] | None:
    """Pure: the last ``election_failed`` (no head could be had) when no head was elected or
    moved after it, as ``{"at", "reason"}``; None otherwise."""
    last: Event | None = None
    for event in events:
        if event.kind is EventKind.ELECTION_FAILED:
            last = event
        elif event.kind in (EventKind.ELECTION_WON, EventKind.HEAD_MOVED):
            last = None
    return None if last is None else {"at": last.at, "reason": last.reason}


def _dashboard(pointer: str | None, endpoint: HeadEndpoint | None, launcher: Mapping[str, Any]) -> dict[str, Any]:
    place = locate_dashboard(pointer, endpoint, launcher)
    return {"dashboard": place.address, "dashboard_note": status_line(place)}


# =============================================================== `status --check`

#: Exit codes of ``session status --check`` (1 and 2 stay the CLI's failure and usage errors).
CHECK_HEALTHY = 0
CHECK_HEAD_LOST = 3
CHECK_WORKER_FAILED = 4
CHECK_HEAD_STARTING = 5


def answer_outdated(jobs: Mapping[str, JobInfo], nodes: Mapping[str, Mapping[str, NodeState]],
                    asked_at: float) -> bool:
    """Pure: a shared scheduler answer that the session's own files already
    contradict. A job the answer shows queued whose agent wrote its node file
    after the answer was asked has started since: showing it PENDING, and its
    live agent as GONE, would mislead (seen right after ``session create
    --wait``, whose last answer said PENDING). ``status`` then asks afresh."""
    for job_id, info in jobs.items():
        if info.state is JobState.PENDING and any(
                state.updated_at > asked_at for state in nodes.get(job_id, {}).values()):
            return True
    return False


def health(status: Mapping[str, Any]) -> tuple[int, list[str]]:
    """Pure: the ``--check`` exit code of a status and the reasons for it.

    A head that is lost (its job ended, its heartbeat silent or unknown, no
    head at all) wins over a failed worker allocation (one that ended
    without being asked and was not resubmitted), which wins over a head
    that is still starting (its job pends, or runs without having published
    its address yet).
    """
    head = status["head"]
    beat = head["heartbeat"]
    row = next((r for r in status["jobs"] if r["job_id"] == head["job_id"]), None)
    reasons: list[str] = []
    code = CHECK_HEALTHY
    if beat == "not ready" and row is not None and row["state"] in ACTIVE_STATES:
        code = CHECK_HEAD_STARTING
        reasons.append(f"head job {head['job_id']} is {row['state']} and not ready yet")
    elif beat != "live":
        code = CHECK_HEAD_LOST
        reasons.append("no head" if head["job_id"] is None else
                       f"head job {head['job_id']}: heartbeat {beat}" + (f" (job {row['state']})" if row else ""))
    if (lost := head.get("election_failed")) is not None:
        code = CHECK_HEAD_LOST
        reasons.append(f"no head can be had: {lost['reason']}")
    failed = [f for f in status.get("failures") or () if not f.get("replaced_by")]
    if failed:
        code = code if code == CHECK_HEAD_LOST else CHECK_WORKER_FAILED
        reasons += [f"worker allocation {f['job_id']} ended {f['state']} without being asked" for f in failed]
    return code, reasons
