"""The autoscaler's actions, carried out through the session's own calls.

A submission is ``Session.add_worker_allocation`` (recorded, marked,
inherited like any other); a cancel or a drain is
``Session.remove_worker_allocation(..., wait=False)`` (a queued job is
cancelled, a running one drained through its agents and ends COMPLETED).
Nothing here decides: each function does what the action says and records
it as an event with the decision's reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from ... import defaults
from ...autoscale.records import Cancel, Drain, Submit
from ...config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig, inherit_worker_config
from ...config.autoscale import AutoscalePolicy
from ...config.launcher import RayLauncher
from ...protocol.disk import event_log, paths
from ...protocol.disk.events import EventKind, EventSource
from ...protocol.disk.records import AllocationRecord, NodeState, SessionInfo
from ...protocol.disk.session_dir import SessionDir
from ...scheduler.base import JobInfo, JobState, Scheduler
from ..allocations import submit
from .store import Tracked


class ScaledSession(Protocol):
    """What the autoscaler calls of a Session, and no more."""

    dir: SessionDir
    info: SessionInfo
    launcher: RayLauncher
    scheduler: Scheduler

    @property
    def path(self) -> Path: ...

    @property
    def job_name(self) -> str: ...

    def record(self) -> AllocationRecord: ...

    def query(self, extra: list[str] | None = None, max_age: float = 0.0) -> dict[str, JobInfo]: ...

    def node_states(self, job_id: str) -> dict[str, NodeState]: ...

    def head_config(self) -> SlurmRunAllocationConfig: ...

    def ray_client_env(self) -> dict[str, str]: ...

    def add_worker_allocation(self, config: SlurmWorkerAllocationConfig, *, resubmit_on_failure: int = 0) -> object: ...

    def remove_worker_allocation(self, handle: str, drain_timeout: float = defaults.DRAIN_TIMEOUT,
                                 wait: bool = True, progress: Callable[[str], None] | None = None) -> JobState: ...


def predictor(session: ScaledSession) -> Callable[[SlurmWorkerAllocationConfig], float]:
    """The scheduler's start estimate for a pool's config, resolved as a submission would be."""
    def predict(config: SlurmWorkerAllocationConfig) -> float:
        first = submit.first_worker_config(session.record(), session.info.worker_allocation)
        resolved = inherit_worker_config(config, first, session.head_config())
        # The spec file is named, never written: test_only reads nothing of it.
        spec = submit.worker_spec(session.dir, session.job_name, resolved, session.launcher,
                                  paths.worker_spec_file(session.path, "estimate"), session.info.agent_env)
        return session.scheduler.test_only(spec)
    return predict


def _event(session: ScaledSession, job: str | None, reason: str, **details) -> None:
    event_log.emit(session.path, EventKind.SCALER_DECISION, EventSource.COORDINATOR, job=job, reason=reason,
                   **details)


def do_submit(session: ScaledSession, policy: AutoscalePolicy, action: Submit, now: float) -> tuple[str, Tracked]:
    config = policy.pools[action.pool].config
    handle = session.add_worker_allocation(config)
    job_id = str(getattr(handle, "job_id"))
    _event(session, job_id, action.reason, action="submit", pool=action.pool, partition=config.partition,
           raced=action.raced, replaces=action.replaces)
    return job_id, Tracked(config.to_dict(), now, action.raced, action.replaces)


def refused(session: ScaledSession, policy: AutoscalePolicy, action: Submit, error: Exception,
            retry: float) -> None:
    """A submission the scheduler refused: one event (the turns it is held back add none)."""
    config = policy.pools[action.pool].config
    _event(session, None, f"submit to {config.partition or f'pool {action.pool}'} refused: {str(error)[:300]}; "
                          f"that pool is held back {retry:.0f} s", action="submit_failed", pool=action.pool,
           partition=config.partition)


def do_remove(session: ScaledSession, action: Cancel | Drain, tracked: Tracked | None,
              drain_timeout: float = defaults.DRAIN_TIMEOUT) -> Tracked | None:
    """Cancel (queued) or drain (running) one allocation; returns its tracked entry marked ending."""
    session.remove_worker_allocation(action.job_id, drain_timeout=drain_timeout, wait=False)
    _event(session, action.job_id, action.reason, action="cancel" if isinstance(action, Cancel) else "drain")
    return None if tracked is None else replace(tracked, ending=True)


def note(session: ScaledSession, text: str, unserved: int) -> None:
    """A decision to wait (or a demand no pool can hold): recorded when it changes."""
    _event(session, None, text, action="wait", unserved=unserved)


__all__ = ["ScaledSession", "do_remove", "do_submit", "note", "predictor", "refused"]
