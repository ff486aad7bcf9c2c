"""Handles a caller holds: one worker allocation, the current head.

Cheap frozen records of a job id plus the session that made them, valid in
any process; what they do goes through the session's public methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import defaults
from ..config import SlurmWorkerAllocationConfig
from ..protocol.disk import paths
from .allocations.failures import AllocationFailure, failure_of


@dataclass(frozen=True)
class WorkerAllocation:
    """A handle on one worker allocation; cheap, and valid in any process."""

    session: Any  # the Session (typed loosely: session imports this module)
    job_id: str

    def request_drain(self, drain_timeout: float = defaults.DRAIN_TIMEOUT, reason: str = "request_drain") -> int:
        """Ask every node of the allocation to drain; returns how many agents took it."""
        return self.session.drain_job(self.job_id, drain_timeout, reason)

    @property
    def config(self) -> SlurmWorkerAllocationConfig:
        rec = self.session.record().workers[self.job_id]
        return SlurmWorkerAllocationConfig.from_dict(rec.config)

    @property
    def failure(self) -> AllocationFailure | None:
        """How the job ended without the session asking, once a query of any
        process recorded it (see :mod:`coordinator.allocations.failures`); None while it has not."""
        rec = self.session.record().workers.get(self.job_id)
        return None if rec is None else failure_of(rec)

    @property
    def replaced_by(self) -> "WorkerAllocation | None":
        """The allocation resubmitted in this one's place (``resubmit_on_failure``), if any."""
        rec = self.session.record().workers.get(self.job_id)
        return None if rec is None or rec.replaced_by is None else WorkerAllocation(self.session, rec.replaced_by)

    def __repr__(self) -> str:
        return f"WorkerAllocation(job_id={self.job_id!r})"


@dataclass(frozen=True)
class Head:
    """The session's current, healthy head."""

    job_id: str
    address: str
    session: Any = field(default=None, compare=False, repr=False)

    def request_drain(self, drain_timeout: float = defaults.HEAD_DRAIN_TIMEOUT, reason: str = "request_drain") -> int:
        """Phase this head out: it keeps serving until the session elected the
        next head (its payload drivers get SIGTERM and raise SlurmStepDrained)."""
        if self.session is None:
            raise ValueError("this Head is not attached to a session")
        return self.session.drain_job(self.job_id, drain_timeout, reason)


def log_tail(session: Path, job_id: str | None, role: str, lines: int = 15) -> str:
    """The end of a job's output (``session``: its session directory), for errors that say why a
    head or worker never got ready."""
    if job_id is None:
        return "no job"
    path = paths.job_output(session, role, job_id)
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"no log at {path}"
    return f"last lines of {path}:\n" + "\n".join(tail)
