"""The run as the autoscaler's decisions see it, built from what the shell read. Pure.

Inputs: allocation.json (the worker allocations and what the session means
for each), one scheduler answer, the agents' node files (which Ray node each
node of a job is), Ray's own view of its nodes (resources, idle time) from
the head, the jobs the autoscaler itself submitted (its state file) and the
policy. Output: the :class:`~elastic_ray.autoscale.records.Allocation`
records :func:`~elastic_ray.autoscale.decide.decide` takes, one per live
worker allocation. Tested by table (``tests/test_autoscale_view.py``).

Phases: an allocation the session is draining, or whose nodes drain or
left on their own (the pre-walltime signal), or that the autoscaler
cancelled or drained, is DRAINING: it counts for nothing; one the
scheduler holds is QUEUED; a running one whose nodes have not all joined
the current head is STARTING (capacity on its way), unless an agent gave
up on the current head (Ray failed on its node too often; it stays out
until another head): then it is GAVE_UP and counts for nothing, since that
node will not join; the rest are RUNNING.
An allocation whose job ended, or that the session removed (a cancel or a
drain asked through ``remove_worker_allocation``), is left out.
A node counts as idle only when Ray says so (its idle duration above zero);
an allocation is idle since its most recently busy node became idle, and
only when Ray knows every one of its nodes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...autoscale.demand import RayNode
from ...autoscale.records import Allocation, Phase
from ...autoscale.shapes import node_shape
from ...config import SlurmWorkerAllocationConfig
from ...config.autoscale import AutoscalePolicy
from ...protocol.disk.records import AgentState, AllocationRecord, NodeState, WorkerIntent
from ...scheduler.base import JobInfo, JobState
from .store import Tracked


#: Agent states of a node on its way out: its allocation counts for nothing any more.
_LEAVING = frozenset({AgentState.DRAINING, AgentState.LEFT, AgentState.RELEASED, AgentState.FAILED})


def pool_of(policy: AutoscalePolicy, config: Mapping[str, Any]) -> int | None:
    """The index of the policy's pool submitted with ``config``; None when no pool has it (any more)."""
    for i, pool in enumerate(policy.pools):
        if pool.config.to_dict() == dict(config):
            return i
    return None


def allocations(policy: AutoscalePolicy, record: AllocationRecord, jobs: Mapping[str, JobInfo],
                nodes: Mapping[str, Mapping[str, NodeState]], ray_nodes: Sequence[RayNode],
                tracked: Mapping[str, Tracked], pointer: str | None, now: float) -> list[Allocation]:
    """Every live worker allocation of the run, in job order (see the module docstring)."""
    by_id = {n.node_id: n for n in ray_nodes if n.alive}
    out = []
    for job_id, worker in sorted(record.workers.items(), key=lambda kv: int(kv[0])):
        info = jobs.get(job_id)
        if info is None or info.state.is_final or worker.state is WorkerIntent.REMOVED:
            continue
        mine = tracked.get(job_id)
        states = list(nodes.get(job_id, {}).values())
        leaving = any(st.exited or st.state in _LEAVING or st.drain_deadline is not None for st in states)
        config: SlurmWorkerAllocationConfig = SlurmWorkerAllocationConfig.from_dict(worker.config)  # type: ignore[assignment]
        count = config.num_nodes or 1
        joined = [s for s in states
                  if s.state is AgentState.JOINED and s.node_id and not s.exited
                  and (pointer is None or s.head_job in (None, pointer))]
        known = [by_id[s.node_id] for s in joined if s.node_id in by_id]
        gave_up = [s for s in states if s.state is AgentState.GAVE_UP and not s.exited
                   and (pointer is None or s.gave_up_on in (None, pointer))]
        if (worker.state is WorkerIntent.DRAINING or info.state is JobState.COMPLETING or leaving
                or (mine is not None and mine.ending)):
            phase = Phase.DRAINING
        elif info.state is JobState.PENDING:
            phase = Phase.QUEUED
        elif gave_up:
            phase = Phase.GAVE_UP
        elif len(joined) < count:
            phase = Phase.STARTING
        else:
            phase = Phase.RUNNING
        seen = phase is Phase.RUNNING and len(known) >= count
        capacity = tuple(dict(n.total) for n in known) if seen else (node_shape(config),) * count
        idle_since = None
        if phase is Phase.RUNNING and len(known) >= count and all(n.idle_seconds > 0 for n in known):
            idle_since = now - min(n.idle_seconds for n in known)
        end = info.end_time if info.end_time is not None and math.isfinite(info.end_time) else (
            now + info.time_left if info.time_left is not None else None)
        out.append(Allocation(
            job_id=job_id, pool=None if mine is None else pool_of(policy, mine.config), phase=phase,
            capacity=capacity, submitted_at=mine.submitted_at if mine is not None else worker.submitted_at,
            end_time=end if info.state is JobState.RUNNING else None, idle_since=idle_since,
            hosts_head=worker.hosts_run_head or job_id == pointer,
            raced=mine is not None and mine.raced, replaces=None if mine is None else mine.replaces,
            free=tuple(dict(n.available) for n in known) if seen else (),
            why="; ".join(f"node {s.node}: {s.reason}" if s.reason else f"node {s.node}" for s in gave_up)))
    return out


__all__ = ["allocations", "pool_of"]
