"""Worker allocations whose jobs ended without the session asking.

On the real cluster a worker allocation that FAILED (or lost a node, or was
preempted) used to go unnoticed: no event, nothing in the record, and the run
went on with part of its capacity. Every query the session makes now passes
through :class:`FailureWatch`, which

* records the ending once in the worker's entry of allocation.json
  (``ended``; the compare-and-swap decides which process records it, and
  only that one logs the event), so every process, a restarted supervisor
  and ``elastic-ray session status`` can tell;
* calls the Session's ``on_allocation_ended`` callback, once per job in each
  Session object that asked for it;
* submits the same config again for an allocation added with
  ``resubmit_on_failure=N`` (N more times at most), under the session's one
  claim so that exactly one process does it, and records the new job as the
  replacement of the old (``replaces``/``replaced_by``).

What counts as "without asking": the session's intent for the worker is
still ``submitted`` (not draining, not removed, not torn down) and the
scheduler reports one of :data:`UNEXPECTED_ENDINGS`. COMPLETED never counts:
an agent ends its job that way when it drained (at the walltime or on
request) or released an allocation that had no head, all on purpose.

The decisions are pure functions of the record and one scheduler answer;
the class around them holds the effects.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any

from ...errors import ConfigError, ElasticRayError
from ...protocol.disk import event_log
from ...protocol.disk.events import EventKind, EventSource
from ...protocol.disk.records import AllocationEnding, AllocationRecord, WorkerIntent, WorkerRecord
from ...protocol.disk.session_dir import SessionDir
from ...scheduler.base import JobInfo, JobState
from ..head.claims import ClaimOutcome

log = logging.getLogger("elastic_ray.coordinator")

#: Final states that mean the job ended on its own, or by someone else's hand
#: (CANCELLED while the session had not asked). ENDED_UNKNOWN: the scheduler
#: forgot the job before the session saw how it ended.
UNEXPECTED_ENDINGS = frozenset({
    JobState.FAILED, JobState.NODE_FAIL, JobState.TIMEOUT, JobState.PREEMPTED, JobState.OUT_OF_MEMORY,
    JobState.CANCELLED, JobState.BOOT_FAIL, JobState.DEADLINE, JobState.ENDED_UNKNOWN})

#: Endings after which ``resubmit_on_failure`` submits the config again. Not
#: CANCELLED (a person or a policy ended it on purpose), not DEADLINE (the same
#: config would miss its deadline again), not ENDED_UNKNOWN (it may have
#: completed normally; we cannot tell).
RESUBMIT_ON = frozenset({
    JobState.FAILED, JobState.NODE_FAIL, JobState.TIMEOUT, JobState.PREEMPTED, JobState.OUT_OF_MEMORY,
    JobState.BOOT_FAIL})


@dataclass(frozen=True)
class AllocationFailure:
    """A worker allocation that ended without the session asking, as any process can read it."""

    job_id: str
    state: str
    reason: str
    nodes: tuple[str, ...]
    noticed_at: float
    partition: str | None = None
    hosts_run_head: bool = False
    #: the job submitted again in its place, once there is one
    replaced_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "state": self.state, "reason": self.reason, "nodes": list(self.nodes),
                "noticed_at": self.noticed_at, "partition": self.partition,
                "hosts_run_head": self.hosts_run_head, "replaced_by": self.replaced_by}


OnAllocationEnded = Callable[[AllocationFailure], object]


# ---------------------------------------------------------------- pure decisions

def check_resubmit_count(value: object) -> int:
    """``resubmit_on_failure`` as given to ``add_worker_allocation``: a whole number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError("resubmit_on_failure", value, "must be a whole number >= 0 (how many times to resubmit)")
    return value


def ended_unexpectedly(worker: WorkerRecord, info: JobInfo | None) -> bool:
    """Pure: the scheduler says this worker's job ended and the session had not asked for it.

    An ending already recorded is not news; a job the scheduler did not
    report says nothing (it may not have been asked about).
    """
    return (worker.state == WorkerIntent.SUBMITTED and worker.ended is None and info is not None
            and info.state in UNEXPECTED_ENDINGS)


def mark_endings(rec: AllocationRecord, jobs: Mapping[str, JobInfo],
                 now: float) -> tuple[AllocationRecord, tuple[str, ...]]:
    """Pure: ``rec`` with every unexpected ending in ``jobs`` recorded, and the jobs newly marked.

    Returns ``rec`` itself when there is nothing new, so an update built on it
    writes nothing.
    """
    marked = []
    updated = rec
    for job_id in sorted(rec.workers, key=int):
        worker = rec.workers[job_id]
        info = jobs.get(job_id)
        if not ended_unexpectedly(worker, info):
            continue
        assert info is not None
        ending = AllocationEnding(state=info.state.value, noticed_at=now, reason=info.reason, nodes=info.nodes)
        updated = updated.with_worker(replace(worker, ended=ending))
        marked.append(job_id)
    return updated, tuple(marked)


def should_resubmit(worker: WorkerRecord) -> bool:
    """Pure: the session owes this allocation a replacement.

    Asked for (``resubmit_on_failure`` left), ended in one of
    :data:`RESUBMIT_ON`, not yet replaced, and still wanted (not removed,
    no drain asked for). An allocation hosting the run's head is never
    resubmitted here: moving the head is the election's job.
    """
    return (worker.resubmit_on_failure > 0 and worker.ended is not None and worker.replaced_by is None
            and worker.state == WorkerIntent.SUBMITTED and not worker.hosts_run_head
            and worker.ended.state in {s.value for s in RESUBMIT_ON})


def due_for_resubmission(rec: AllocationRecord) -> list[WorkerRecord]:
    """Pure: the workers :func:`should_resubmit` picks, by job id."""
    return [rec.workers[j] for j in sorted(rec.workers, key=int) if should_resubmit(rec.workers[j])]


def record_worker(rec: AllocationRecord, worker: WorkerRecord) -> AllocationRecord:
    """Pure: ``rec`` with a newly submitted worker; a replacement also marks
    the allocation it replaces (``replaced_by``), in the same update."""
    rec = rec.with_worker(worker)
    old = rec.workers.get(worker.replaces) if worker.replaces else None
    if old is not None and old.replaced_by is None:
        rec = rec.with_worker(replace(old, replaced_by=worker.job_id))
    return rec


def give_up_resubmitting(rec: AllocationRecord, job_id: str) -> AllocationRecord:
    """Pure: no more resubmissions for ``job_id`` (its config was refused for good)."""
    worker = rec.workers.get(job_id)
    if worker is None or worker.resubmit_on_failure == 0:
        return rec
    return rec.with_worker(replace(worker, resubmit_on_failure=0))


def failure_of(worker: WorkerRecord) -> AllocationFailure | None:
    """Pure: the recorded failure of one worker, None if it has none."""
    if worker.ended is None:
        return None
    return AllocationFailure(job_id=worker.job_id, state=worker.ended.state, reason=worker.ended.reason,
                             nodes=worker.ended.nodes, noticed_at=worker.ended.noticed_at,
                             partition=worker.config.get("partition"), hosts_run_head=worker.hosts_run_head,
                             replaced_by=worker.replaced_by)


def failures_of(rec: AllocationRecord) -> list[AllocationFailure]:
    """Pure: every recorded failure, by job id."""
    return [f for j in sorted(rec.workers, key=int) if (f := failure_of(rec.workers[j])) is not None]


# ---------------------------------------------------------------- effects

class FailureWatch:
    """Record, report and (when asked) replace failed worker allocations; one per Session.

    ``resubmit(old)`` submits ``old``'s config again and records the new job
    with :func:`record_worker`; ``claim(claimant)`` is the session's one
    election claim. Owner of ``_told``: whichever thread holds ``_busy``.
    """

    def __init__(self, directory: SessionDir, job_name: str, *,
                 resubmit: Callable[[WorkerRecord], str],
                 claim: Callable[[str], AbstractContextManager[ClaimOutcome]],
                 on_ended: OnAllocationEnded | None = None, clock: Callable[[], float] = time.time):
        self.dir = directory
        self.job_name = job_name
        self.resubmit = resubmit
        self.claim = claim
        self.on_ended = on_ended
        self.clock = clock
        # Failures recorded before this Session was opened are not news to tell.
        self._told: set[str] = {f.job_id for f in failures_of(directory.read_allocation())} if on_ended else set()
        # Non-blocking: a callback that queries the session, or a second
        # thread querying at the same time, skips the watch instead of waiting.
        self._busy = threading.Lock()

    def observe(self, rec: AllocationRecord, jobs: Mapping[str, JobInfo]) -> None:
        """What one scheduler answer means for the session's worker allocations."""
        if not self._busy.acquire(blocking=False):
            return
        try:
            if any(ended_unexpectedly(w, jobs.get(j)) for j, w in rec.workers.items()):
                rec = self._record(jobs)
            if due_for_resubmission(rec):
                rec = self._resubmit_due() or rec
            self._tell(rec)
        finally:
            self._busy.release()

    def _record(self, jobs: Mapping[str, JobInfo]) -> AllocationRecord:
        newly: list[str] = []
        now = self.clock()

        def change(r: AllocationRecord) -> AllocationRecord:
            updated, marked = mark_endings(r, jobs, now)
            newly[:] = marked   # the last call is the one that committed
            return updated

        rec = self.dir.update_allocation(change)
        for job_id in newly:
            ended = rec.workers[job_id].ended
            assert ended is not None
            log.warning("event=worker_allocation_ended session=%s job=%s state=%s reason=%r nodes=%s "
                        "resubmit_left=%d", self.job_name, job_id, ended.state, ended.reason,
                        ",".join(ended.nodes) or "-", rec.workers[job_id].resubmit_on_failure)
            event_log.emit(self.dir.path, EventKind.FAILED, EventSource.COORDINATOR, job=job_id,
                           reason=ended.reason or str(ended.state), state=str(ended.state),
                           nodes=",".join(ended.nodes) or None,
                           resubmit=rec.workers[job_id].resubmit_on_failure > 0)
        return rec

    def _resubmit_due(self) -> AllocationRecord | None:
        claimant = f"resubmit:{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        with self.claim(claimant) as claim:
            if not claim.held:
                return None   # another process elects or resubmits; the next poll looks again
            for old in due_for_resubmission(self.dir.read_allocation()):
                try:
                    new = self.resubmit(old)
                except (ConfigError, ValueError) as exc:
                    # Refused before it reached the scheduler: it would be refused every time.
                    self.dir.update_allocation(lambda r, j=old.job_id: give_up_resubmitting(r, j))
                    log.error("event=worker_resubmit_refused session=%s job=%s error=%s", self.job_name,
                              old.job_id, exc)
                    continue
                except ElasticRayError as exc:
                    log.warning("event=worker_resubmit_failed session=%s job=%s error=%s (tried again at "
                                "the next poll)", self.job_name, old.job_id, exc)
                    continue
                assert old.ended is not None
                log.warning("event=worker_allocation_resubmitted session=%s job=%s replaces=%s state=%s "
                            "resubmit_left=%d", self.job_name, new, old.job_id, old.ended.state,
                            old.resubmit_on_failure - 1)
                event_log.emit(self.dir.path, EventKind.RESUBMITTED, EventSource.COORDINATOR, job=new,
                               replaces=old.job_id)
        return self.dir.read_allocation()

    def _tell(self, rec: AllocationRecord) -> None:
        if self.on_ended is None:
            return
        for failure in failures_of(rec):
            if failure.job_id in self._told:
                continue
            self._told.add(failure.job_id)
            try:
                self.on_ended(failure)
            except Exception:  # a user's callback must not stop the session's queries
                log.exception("event=allocation_ended_callback_failed session=%s job=%s", self.job_name,
                              failure.job_id)


__all__ = ["RESUBMIT_ON", "UNEXPECTED_ENDINGS", "AllocationFailure", "FailureWatch", "OnAllocationEnded",
           "check_resubmit_count", "due_for_resubmission", "ended_unexpectedly", "failure_of", "failures_of",
           "give_up_resubmitting", "mark_endings", "record_worker", "should_resubmit"]
