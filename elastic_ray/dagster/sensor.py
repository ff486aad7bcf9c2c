"""The orphan sensor: end the Slurm jobs of runs that ended without ending them.

It lists the session directories under the session root, asks the Dagster
instance about the runs of each (the directory name is the root run id),
asks the scheduler about the session's jobs in one query, and applies
:func:`orphans.decide`. The session directory records which scheduler it
uses, so the sensor needs no Slurm configuration of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dagster

from ..coordinator.session import Session
from ..protocol.disk import paths
from .orphans import OrphanAction, SessionJobs, decide
from .run_session import session_root

log = logging.getLogger("elastic_ray.dagster")
ROOT_RUN_ID_TAG = "dagster/root_run_id"


def _run_statuses(instance: dagster.DagsterInstance, key: str) -> list[str]:
    runs = list(instance.get_runs(filters=dagster.RunsFilter(run_ids=[key])))
    runs += instance.get_runs(filters=dagster.RunsFilter(tags={ROOT_RUN_ID_TAG: key}))
    return [run.status.value for run in runs]


def _session_jobs(session: Session) -> SessionJobs:
    rec = session.record()
    jobs = session.query([rec.successor] if rec.successor else None)

    def active(job: str | None) -> bool:
        info = jobs.get(job) if job else None
        return info is not None and info.state.is_active

    workers = [jobs.get(w.job_id) for w in rec.workers.values() if w.state != "removed"]
    now = time.time()
    return SessionJobs(
        head_active=active(rec.head_job),
        running_workers=sum(1 for i in workers if i is not None and i.state.is_running),
        pending_workers=sum(1 for i in workers if i is not None and i.state.is_active and not i.state.is_running),
        successor_active=active(rec.successor),
        election_pending=rec.election is not None and rec.election.is_live(now),
    )


def reconcile_orphaned_sessions(instance: dagster.DagsterInstance, root: str | Path | None = None,
                                *, log_event: Callable[[str], Any] | None = None) -> dict[str, OrphanAction]:
    """Apply the orphan rule to every session under ``root``; returns the verdicts by run key."""
    base = session_root(None if root is None else str(root))
    verdicts: dict[str, OrphanAction] = {}
    if not base.is_dir():
        return verdicts
    for path in sorted(p for p in base.iterdir() if paths.session_file(p).is_file()):
        key = path.name
        marker = paths.ended_marker(path)
        if marker.exists():
            continue
        statuses = _run_statuses(instance, key)
        if not statuses or any(s not in ("SUCCESS", "FAILURE", "CANCELED") for s in statuses):
            verdicts[key], why = decide(statuses, SessionJobs(True, 0, 0, False, False))
            continue
        try:
            session = Session.open(path, supervise=False)
        except Exception as exc:  # noqa: BLE001 - one broken directory must not stop the others
            log.warning("event=orphan_open_failed path=%s error=%s", path, exc)
            continue
        try:
            action, why = decide(statuses, _session_jobs(session))
            if action is OrphanAction.TEARDOWN:
                session.teardown()
            if action in (OrphanAction.TEARDOWN, OrphanAction.NOTHING_LIVE):
                marker.write_text(f"{time.time():.0f} {action.value}\n")
        finally:
            session.close()
        verdicts[key] = action
        message = f"session {key} ({session.job_name}): {action.value}: {why}"
        log.info("event=orphan_verdict session=%s action=%s why=%r", key, action.value, why)
        if log_event is not None and action is not OrphanAction.NOTHING_LIVE:
            log_event(message)
    return verdicts


def build_orphan_sensor(session_root: str | None = None, *, name: str = "elastic_ray_orphan_sensor",
                        minimum_interval_seconds: int = 60,
                        default_status: dagster.DefaultSensorStatus = dagster.DefaultSensorStatus.STOPPED,
                        ) -> dagster.SensorDefinition:
    """A sensor that tears down the sessions of ended runs (see ``orphans.decide``).

    It requests no runs; each evaluation reports what it did in its skip reason.
    """
    root = session_root

    @dagster.sensor(name=name, minimum_interval_seconds=minimum_interval_seconds, default_status=default_status)
    def _orphan_sensor(context: dagster.SensorEvaluationContext) -> dagster.SkipReason:
        verdicts = reconcile_orphaned_sessions(context.instance, root, log_event=context.log.info)
        ended = sorted(k for k, a in verdicts.items() if a is OrphanAction.TEARDOWN)
        spared = sorted(k for k, a in verdicts.items() if a is OrphanAction.WAITING_FOR_HEAD)
        return dagster.SkipReason(f"tore down {len(ended)} session(s) {ended}; spared {len(spared)} waiting "
                                  f"for a new head {spared}; checked {len(verdicts)}")

    return _orphan_sensor
