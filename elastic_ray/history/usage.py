"""What a run held: node-hours and GPU-hours per allocation and for the whole run.

A node counts from its agent's start to its leaving (``started_at`` to
``left_at`` of :class:`~.runs.NodeInterval`), not from when its Ray joined:
from the agent's start Slurm has given the node to the job, so it is held,
and charged to the user's fair share, whether or not Ray is up yet. The
time between start and join is the run's start-up cost, and it belongs in
what the run used. A node whose start line is lost counts from its join;
one with neither counts nothing, and its allocation is marked ``partial``
(so is one whose GPU count is unknown: its GPU-hours are ``None``).

GPU-hours held are node-hours times the allocation's ``gpus_per_node``.

Idle GPU-hours are measured, never guessed: each agent on a node with GPUs
reads Ray's own view of them once a minute (``agent/node/ray_load``: GPUs
no task or actor holds) and writes the GPU-seconds idle in its
``node_left`` line; a node still in the run has them in its node file, which
the caller passes as ``live_idle``. An allocation none of whose nodes was
measured has ``gpu_hours_idle`` None; one with some nodes unmeasured sums
what was measured and is ``partial``.

Pure: figures from a :class:`~.runs.RunHistory`, no file or clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .runs import Allocation, NodeInterval, RunHistory

HOUR = 3600.0


def node_seconds(interval: NodeInterval) -> float | None:
    """How long the node was held; ``None`` when neither its start nor its join is known."""
    begin = interval.started_at if interval.started_at is not None else interval.joined_at
    if begin is None or interval.left_at is None:
        return None
    return max(0.0, interval.left_at - begin)     # a clock a little behind another's counts as nothing


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


@dataclass(frozen=True)
class AllocationUsage:
    """One allocation's figures. ``nodes`` is how many of its nodes the log saw start."""

    job: str
    role: str | None
    partition: str | None
    nodes: int
    nodes_requested: int | None
    gpus_per_node: int | None
    node_hours: float
    gpu_hours_held: float | None
    gpu_hours_idle: float | None
    ended_how: str | None
    live: bool
    partial: bool

    def to_dict(self) -> dict[str, Any]:
        return {"job": self.job, "role": self.role, "partition": self.partition, "nodes": self.nodes,
                "nodes_requested": self.nodes_requested, "gpus_per_node": self.gpus_per_node,
                "node_hours": _round(self.node_hours), "gpu_hours_held": _round(self.gpu_hours_held),
                "gpu_hours_idle": _round(self.gpu_hours_idle), "ended_how": self.ended_how, "live": self.live,
                "partial": self.partial}


@dataclass(frozen=True)
class RunUsage:
    """The run's figures: each allocation's, and their sums.

    ``gpu_hours_held`` adds up the allocations whose GPU count is known;
    ``partial`` says some figure below it is missing.
    """

    allocations: tuple[AllocationUsage, ...]
    node_hours: float
    gpu_hours_held: float
    gpu_hours_idle: float | None
    partial: bool

    def to_dict(self) -> dict[str, Any]:
        return {"allocations": [a.to_dict() for a in self.allocations],
                "total": {"node_hours": _round(self.node_hours), "gpu_hours_held": _round(self.gpu_hours_held),
                          "gpu_hours_idle": _round(self.gpu_hours_idle), "partial": self.partial}}


def allocation_usage(allocation: Allocation, nodes: tuple[NodeInterval, ...],
                     live_idle: Mapping[tuple[str, str], float] | None = None) -> AllocationUsage:
    seconds = [node_seconds(n) for n in nodes]
    node_hours = sum(s for s in seconds if s is not None) / HOUR
    gpus = allocation.gpus_per_node
    idle = [n.gpu_idle_seconds if n.gpu_idle_seconds is not None else (live_idle or {}).get((n.job, n.node))
            for n in nodes]
    measured = [i for i in idle if i is not None]
    unmeasured = bool(gpus) and len(measured) < len(idle)
    return AllocationUsage(
        job=allocation.job, role=None if allocation.role is None else allocation.role.value,
        partition=allocation.partition, nodes=len({n.node for n in nodes}),
        nodes_requested=allocation.nodes_requested, gpus_per_node=gpus, node_hours=node_hours,
        gpu_hours_held=None if gpus is None else node_hours * gpus,
        gpu_hours_idle=sum(measured) / HOUR if measured else None,
        ended_how=None if allocation.ended_how is None else allocation.ended_how.value, live=allocation.live,
        partial=None in seconds or (gpus is None and bool(nodes)) or (unmeasured and bool(measured)))


def usage(history: RunHistory, live_idle: Mapping[tuple[str, str], float] | None = None) -> RunUsage:
    """Every allocation's figures, in the history's order, and the run's sums.

    ``live_idle``: GPU-seconds idle of nodes still in the run, by (job, node), from their node files."""
    rows = tuple(allocation_usage(a, history.nodes_of(a.job), live_idle) for a in history.allocations)
    idle = [r.gpu_hours_idle for r in rows if r.gpu_hours_idle is not None]
    return RunUsage(allocations=rows, node_hours=sum(r.node_hours for r in rows),
                    gpu_hours_held=sum(r.gpu_hours_held or 0.0 for r in rows),
                    gpu_hours_idle=sum(idle) if idle else None,
                    partial=any(r.partial for r in rows))
