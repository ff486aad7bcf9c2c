"""The autoscaler's records: what :func:`~.decide.decide` is given and what it returns.

Typed and frozen, like every boundary of the project: the shell builds
:class:`Allocation`, :class:`Demand` and :class:`Estimate` from Ray, the
session record and Slurm; the decision comes back as :class:`Decision` with
its actions (:class:`Submit`, :class:`Cancel`, :class:`Drain`, :class:`Probe`)
and the :class:`Memory` to pass to the next call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from .shapes import Shape


class Phase(Enum):
    QUEUED = "queued"        # pending in Slurm
    STARTING = "starting"    # running in Slurm, its nodes not all in Ray yet
    RUNNING = "running"      # its nodes are in Ray
    DRAINING = "draining"    # being removed: counts for nothing
    GAVE_UP = "gave up"      # running in Slurm, an agent gave up on the current head: counts for nothing

    @property
    def counts(self) -> bool:
        """Whether the allocation is capacity the run has or will have."""
        return self not in (Phase.DRAINING, Phase.GAVE_UP)


@dataclass(frozen=True)
class Allocation:
    """One worker allocation of the run as the autoscaler sees it.

    ``pool`` is its index in the policy (None: not submitted by the
    autoscaler, then it is never cancelled or drained, but its ``capacity``
    counts for ``request_resources``). ``capacity``: what each of its nodes
    offers Ray (for a queued one, its pool's node shape). ``idle_since``:
    since when none of its nodes ran a task or actor (None: busy now).
    ``raced``: submitted in a race, cancelled as soon as it is not needed.
    ``replaces``: the allocation it was submitted to replace at its walltime.
    ``free``: for a running one, what each of its nodes has free in Ray right
    now; pending demand that fits there is Ray's to place in a moment (a task
    that just became schedulable on a node that just joined), not unserved.
    ``why``: for one that GAVE_UP, what its agent said (for the reason of its drain).
    """

    job_id: str
    pool: int | None
    phase: Phase
    capacity: tuple[Shape, ...]
    submitted_at: float = 0.0
    end_time: float | None = None
    idle_since: float | None = None
    hosts_head: bool = False
    raced: bool = False
    replaces: str | None = None
    free: tuple[Shape, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Gang:
    """A pending placement group: every bundle at once, placed by ``strategy``
    (Ray's PACK, SPREAD, STRICT_PACK or STRICT_SPREAD)."""

    bundles: tuple[Shape, ...]
    strategy: str = "PACK"
    name: str = ""


@dataclass(frozen=True)
class Demand:
    """What Ray waits for: one entry a pending task or actor, the pending
    placement groups, and the ``request_resources`` bundles."""

    pending: tuple[Shape, ...] = ()
    gangs: tuple[Gang, ...] = ()
    constraints: tuple[Shape, ...] = ()


@dataclass(frozen=True)
class Estimate:
    """When Slurm expects a new allocation of a pool to start: ``start_in``
    seconds from ``asked_at`` (0: now), None when it could not say."""

    start_in: float | None
    asked_at: float


@dataclass(frozen=True)
class Memory:
    """What one decision leaves for the next (kept by the process running the
    autoscaler; a new holder starts empty, which only restarts the delays)."""

    unserved_since: float | None = None
    unneeded_since: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Submit:
    pool: int
    reason: str
    raced: bool = False
    replaces: str | None = None


@dataclass(frozen=True)
class Cancel:
    job_id: str
    reason: str


@dataclass(frozen=True)
class Drain:
    job_id: str
    reason: str


@dataclass(frozen=True)
class Probe:
    """Ask Slurm when a new allocation of ``pool`` would start (the shell rate-limits)."""

    pool: int


Action = Submit | Cancel | Drain | Probe


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    memory: Memory
    notes: tuple[str, ...] = ()
    unserved: int = 0   # units of demand (tasks, actors, groups, bundles) left without room
    wake_at: float | None = None   # when a delay of this decision runs out (decide again then)
