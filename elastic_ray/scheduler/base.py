"""The Scheduler interface: the only thing above it that differs between Slurm
and the embedded local mode is which implementation was chosen.

A scheduler submits a :class:`JobSpec` (what to run on every node of an
allocation, and the allocation's shape), reports :class:`JobInfo` for *all*
jobs of a session in one call, cancels and signals. It never decides anything
about Ray or heads; that is the agent's and the coordinator's job.
"""

from __future__ import annotations

from typing import Any

import enum
import math
import os
import pwd
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from ..config import SlurmRunAllocationConfig


class JobState(str, enum.Enum):
    """A job's state, normalised. Slurm's names are kept; see
    ``elastic_ray.scheduler.states`` for the translation table."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    # Ended, but the scheduler no longer knows how (record purged, no accounting).
    ENDED_UNKNOWN = "ENDED_UNKNOWN"

    def __str__(self) -> str:   # printed and formatted as Slurm's name
        return self.value

    @property
    def is_active(self) -> bool:
        """Still holds (or waits for) resources."""
        return self in _ACTIVE

    @property
    def is_final(self) -> bool:
        return not self.is_active

    @property
    def is_running(self) -> bool:
        """Has nodes and is not on its way out."""
        return self is JobState.RUNNING


_ACTIVE = frozenset({JobState.PENDING, JobState.RUNNING, JobState.COMPLETING, JobState.SUSPENDED})


@dataclass(frozen=True)
class JobInfo:
    """What the scheduler knows about one job at one moment.

    Times are Unix epoch seconds; ``time_left`` is seconds until the job's
    end time (None when unlimited or not started).
    """

    job_id: str
    name: str
    state: JobState
    raw_state: str = ""
    reason: str = ""
    partition: str = ""
    nodes: tuple[str, ...] = ()
    submit_time: float | None = None
    start_time: float | None = None
    end_time: float | None = None
    time_left: float | None = None
    #: the submitting user, and the submission marker (Slurm's job comment);
    #: empty where the scheduler did not say
    user: str = ""
    comment: str = ""


def state_text(info: JobInfo | None) -> str:
    """A job's state for a wait's progress line and its timeout error: while
    the job is queued, with Slurm's reason (squeue's REASON column, e.g.
    ``PENDING (Resources)``, ``PENDING (QOSMaxJobsPerUserLimit)``), since that
    is what tells a person waiting whether to wait on or change the request;
    ``?`` when the scheduler has not said."""
    if info is None:
        return "?"
    reason = info.reason.strip()
    if info.state is JobState.PENDING and reason and reason != "None":
        return f"{info.state.value} ({reason})"
    return info.state.value


def current_user() -> str:
    """The name of the user this process acts as (its effective uid).

    Taken from the password database, not from ``$USER`` or ``$LOGNAME``,
    which any caller can set; a uid without an entry is named by its number,
    which squeue and scancel accept as well.
    """
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass(frozen=True)
class JobSpec:
    """Everything needed to submit one allocation.

    ``node_argv`` is run once on every node of the allocation (by ``srun`` on
    Slurm, as a local process per emulated node in local mode). It sees the
    usual Slurm environment in both modes: SLURM_JOB_ID, SLURM_JOB_NAME,
    SLURM_JOB_NODELIST, SLURM_NNODES, SLURM_NODEID, SLURMD_NODENAME,
    SLURM_CPUS_ON_NODE, and CUDA_VISIBLE_DEVICES when GPUs were asked for. In
    local mode ELASTIC_RAY_NODE_IP carries the node's 127.0.0.x address.

    ``pre_start_commands`` are shell lines run before the node command (on
    Slurm in the batch script, so what they export reaches every node's step).
    They are the one place where user text is shell on purpose.

    ``comment`` is the submission's unique marker (Slurm's ``--comment``):
    a job that was queued although its submission was never recorded (sbatch
    timed out, its answer was unreadable) is found by it.
    """

    job_name: str
    role: str  # "head" or "worker"
    allocation: SlurmRunAllocationConfig
    node_argv: tuple[str, ...]
    workdir: Path
    output: str  # path of the job's log; "%j" is replaced by the job id
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    pre_start_commands: tuple[str, ...] = ()
    comment: str = ""

    def __post_init__(self) -> None:
        if self.role not in ("head", "worker"):
            raise ValueError(f"role={self.role!r}: must be 'head' or 'worker'")
        if not self.node_argv:
            raise ValueError("node_argv: must name a command")
        object.__setattr__(self, "node_argv", tuple(self.node_argv))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))
        object.__setattr__(self, "pre_start_commands", tuple(self.pre_start_commands))
        object.__setattr__(self, "workdir", Path(self.workdir))


class Scheduler(ABC):
    """Submit, observe, cancel and signal allocations.

    Implementations must keep :meth:`query` to ONE call of the underlying
    system however many jobs a session has: a run with 500 worker
    allocations costs the controller what a run with one costs.
    """

    #: "slurm" or "local" (a ``config.scheduler_choice.SchedulerKind`` in the two backends)
    kind: str = ""
    #: The user whose jobs :meth:`query` lists and the cancels act on when a
    #: caller names none. Another user's job of the same name is never ours.
    user: str = ""

    @abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Submit and return the job id. Returns on submission, not on start."""

    @abstractmethod
    def query(self, job_name: str, job_ids: Iterable[str] = (), *, user: str | None = None) -> dict[str, JobInfo]:
        """Every job named ``job_name`` of ``user`` (default :attr:`user`) in
        one call, keyed by job id.

        A job of another user is never listed, whatever its name. Ids in
        ``job_ids`` that the scheduler no longer lists are resolved
        through whatever history the scheduler keeps and are reported as
        ``ENDED_UNKNOWN`` if nothing answers; they are never left out and
        never raise.
        """

    @abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel one job (pending or running). Cancelling an ended job is not an error."""

    def cancel_jobs(self, job_ids: Iterable[str], *, user: str | None = None) -> None:
        """Cancel these jobs if they belong to ``user`` (default :attr:`user`);
        ended or unknown ids are not an error. Slurm does it in one scancel."""
        for job_id in job_ids:
            self.cancel(job_id)

    @abstractmethod
    def cancel_by_name(self, job_name: str, *, user: str | None = None) -> None:
        """Cancel every job of that name that belongs to ``user`` (default :attr:`user`).

        Not for sessions: two sessions may carry the same name by mistake, so
        a session cancels the job ids it recorded (:meth:`cancel_jobs`).
        """

    @abstractmethod
    def signal(self, job_id: str, signal_name: str, *, batch: bool = False) -> None:
        """Send a signal to the job's steps (or, with ``batch``, to its batch shell only)."""

    @abstractmethod
    def test_only(self, spec: JobSpec) -> float:
        """Predicted start (epoch seconds) for ``spec``, without submitting it.

        Raises ``SchedulerError`` when the request can never be satisfied.
        """

    def accounting(self, job_ids: Iterable[str]) -> "dict[str, Any] | None":
        """What the scheduler's accounting recorded of these jobs (``slurm_parse.JobAccounting`` by id),
        or None when it keeps none (Slurm without accounting storage, the local scheduler)."""
        return None

    def step_states(self, job_id: str, step_name: str) -> "dict[str, JobState] | None":
        """The states the scheduler's accounting recorded for the steps of ``job_id`` named
        ``step_name``, by step id (``12.3``); None when it keeps none (the local scheduler,
        Slurm without accounting storage). How a payload driver's step ended: a non-zero
        exit alone does not say that the OOM killer ended it (srun exits 1 then)."""
        return None

    def time_left(self, info: JobInfo, now: float) -> float | None:
        """Seconds left before the end time, never negative; None if unknown."""
        if info.end_time is None or math.isinf(info.end_time):
            return None
        return max(0.0, info.end_time - now)
