"""What the supervisor, payload drivers and elections need of a session, and no more.

``HeadSupervisor`` and ``PayloadRun`` are driven by a ``Session`` but are
written against these protocols, so that neither imports ``session`` (which
imports them: no cycle) and neither reaches into its private methods. They
list only what those two call; a test fake needs to provide nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from .. import defaults
from ..config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from ..config.launcher import RayLauncher
from ..protocol.wire.channel import ControlClient
from ..protocol.disk.records import AllocationRecord, NodeState, SessionInfo
from ..protocol.disk.session_dir import SessionDir
from ..scheduler.base import JobInfo, Scheduler
from .head.claims import ClaimOutcome
from .head.election import HeadAssessment
from .head.headwatch import HeadObservation


class JobRef(Protocol):
    """A handle naming one Slurm job of the session."""

    @property
    def job_id(self) -> str: ...


class HeadRef(JobRef, Protocol):
    """A head: its job and its Ray (GCS) address."""

    @property
    def address(self) -> str: ...


class HeadSource(Protocol):
    """Both users watch the head through its heartbeat."""

    @property
    def job_name(self) -> str: ...

    def observe_head(self, wait: float = 0.0) -> HeadObservation: ...


class SupervisedSession(HeadSource, Protocol):
    """What ``HeadSupervisor`` calls."""

    @property
    def info(self) -> SessionInfo: ...

    def record(self) -> AllocationRecord: ...

    def query(self, extra: list[str] | None = None, max_age: float = 0.0) -> dict[str, JobInfo]: ...

    def assess_head(self, rec: AllocationRecord, jobs: Mapping[str, JobInfo], obs: HeadObservation,
                    now: float) -> HeadAssessment: ...

    def replace_head(self, timeout: float = defaults.WAIT_TIMEOUT,
                     progress: Callable[[str], None] | None = None) -> HeadRef: ...

    def add_worker_allocation(self, config: SlurmWorkerAllocationConfig, *,
                              resubmit_on_failure: int = 0) -> JobRef: ...

    def election_claim(self, claimant: str) -> AbstractContextManager[ClaimOutcome]: ...


class DriverSession(HeadSource, Protocol):
    """What ``PayloadRun`` calls."""

    @property
    def path(self) -> Path: ...

    @property
    def info(self) -> SessionInfo: ...

    @property
    def launcher(self) -> RayLauncher: ...

    @property
    def scheduler(self) -> Scheduler: ...

    def ray_client_env(self) -> dict[str, str]: ...

    def head_pointer(self) -> str | None: ...

    def job_info(self, job_id: str, unreachable_ok: bool = False, max_age: float = 0.0) -> JobInfo | None: ...

    def record(self) -> AllocationRecord: ...

    def node_states(self, job_id: str) -> dict[str, NodeState]: ...


__all__ = ["AgentAsker", "DriverSession", "HeadRef", "HeadSource", "JobRef", "SupervisedSession"]


class AgentAsker(Protocol):
    """What sending one control request to an agent needs (``failover.ask_agent``)."""

    @property
    def job_name(self) -> str: ...
    def control(self, endpoint: str) -> ControlClient: ...


class ElectingSession(SupervisedSession, Protocol):
    """What :class:`coordinator.head.failover.Failover` needs to carry out an election."""

    claim_period: float  # how long the election claim lasts unless renewed
    @property
    def dir(self) -> SessionDir: ...
    @property
    def launcher(self) -> RayLauncher: ...
    @property
    def scheduler(self) -> Scheduler: ...
    def head_config(self) -> SlurmRunAllocationConfig: ...
    def job_info(self, job_id: str, unreachable_ok: bool = False, max_age: float = 0.0) -> JobInfo | None: ...
    def node_states(self, job_id: str) -> dict[str, NodeState]: ...
    def note_head_started(self, job_id: str) -> None: ...
    def submit_head_allocation(
        self, record_as: Callable[[AllocationRecord, str], AllocationRecord] | None = None) -> str: ...
    def control(self, endpoint: str) -> ControlClient: ...
