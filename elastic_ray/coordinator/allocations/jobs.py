"""A session's Slurm jobs: the effects around :mod:`.ownership`'s decisions.

Three things go through here and nowhere else in the coordinator:

* the one scheduler query per poll, by the session's job name and for its
  submitting user only, cut down to the ids the session recorded;
* every submission: an intent (with its config and a unique marker) is
  written to allocation.json before the scheduler is asked, and the job id
  replaces it in one update afterwards; a failed submit is looked up by its
  marker and adopted if the job was queued anyway;
* the cancels: teardown by recorded ids (never by name), and strays (jobs
  marked by this session that nobody recorded) wherever a poll sees them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ... import defaults
from ...errors import ConfigError, SchedulerError, SessionDirError, TeardownIncomplete
from ...polling import wait_for
from ...protocol.disk.records import AllocationRecord, SessionInfo, SubmissionIntent, WorkerIntent
from ...protocol.disk import allocation_repair, event_log
from ...protocol.disk.events import EventKind, EventSource
from ...protocol.disk.session_dir import SessionDir
from ...scheduler.base import JobInfo, JobSpec, JobState, Scheduler, current_user
from .. import detached
from ..scaling import store as scaling_store
from . import ownership
from .answers import SchedulerAnswer, SharedAnswers, sharing_enabled

log = logging.getLogger("elastic_ray.coordinator")

#: How often a watcher that finds the scheduler unreachable says so again (s).
UNREACHABLE_LOG_EVERY = 30.0

RecordAs = Callable[[AllocationRecord, str], AllocationRecord]


def pending_news(previous: Mapping[str, JobInfo], listed: Mapping[str, JobInfo],
                 seen: dict[str, str]) -> list[tuple[str, str]]:
    """The pending jobs whose reason is news: ``(job, reason)`` for each job
    pending now with a reason unlike the one it had in the session's last
    stored answer (or, without one, the last this process saw). ``seen`` is
    this process's memory and is updated. Pure but for ``seen``."""
    news = []
    for job, info in sorted(listed.items()):
        if info.state is not JobState.PENDING:
            seen.pop(job, None)
            continue
        reason = info.reason or "pending"
        if reason == "None":         # Slurm has not looked at it yet: nothing to tell beyond its submission
            seen[job] = reason
            continue
        before = previous.get(job)
        known = before.reason or "pending" if before is not None and before.state is JobState.PENDING \
            else seen.get(job)
        if known != reason:
            news.append((job, reason))
        seen[job] = reason
    return news


class SessionJobs:
    """Query, submit and cancel the jobs of one session (one per Session object)."""

    def __init__(self, directory: SessionDir, scheduler: Scheduler, info: SessionInfo):
        self.dir = directory
        self.scheduler = scheduler
        self.info = info
        # Strays this process already cancelled: a cancelled job stays
        # active (COMPLETING) for a while, and one scancel is enough.
        self._cancelled: set[str] = set()
        # Called with every scheduler answer (e.g. .lost_nodes): they see
        # each state change without a query of their own. Must return at once.
        self.observers: list[Callable[[dict[str, JobInfo]], None]] = []
        self._unreachable_logged = -UNREACHABLE_LOG_EVERY
        # The session's last answer, shared with its other processes (.answers).
        self.shared = SharedAnswers(directory.path)
        self._pending_seen: dict[str, str] = {}    # job -> the pending reason this process saw last (pending_news)
        #: the answer behind the last listing of this process (its age is shown by status)
        self.last_answer: SchedulerAnswer | None = None

    @property
    def user(self) -> str:
        """Whose jobs the session's are: the user recorded at creation, else
        this process's (sessions created before the user was recorded)."""
        return self.info.user or getattr(self.scheduler, "user", "") or current_user()

    # ------------------------------------------------------------ observe
    def listing(self, ids: Iterable[str], max_age: float = 0.0) -> dict[str, JobInfo]:
        """ONE scheduler query: the session's name, its user, plus ``ids``.

        With ``max_age`` > 0 (watchers: waits, drivers, status) the session's
        shared answer is taken instead when it is at most that old and covers
        ``ids``; else one process of the session asks, for every recorded id,
        so its answer serves the others too (see :mod:`.answers`). Every
        answer this process gets from the scheduler is stored there.
        """
        return self._listing(ids, max_age)[0]

    def _listing(self, ids: Iterable[str], max_age: float) -> tuple[dict[str, JobInfo], bool]:
        """The listing and whether this call asked the scheduler itself."""
        wanted = frozenset(ids)
        if max_age <= 0 or not sharing_enabled():
            return self._ask(wanted), True
        answer, asked = self.shared.get(self.info.job_name, self.user, wanted, max_age,
                                        lambda: self._ask_answer(wanted | self._recorded_ids()))
        self.last_answer = answer
        return dict(answer.jobs), asked

    def _recorded_ids(self) -> frozenset[str]:
        try:
            rec = self.dir.read_allocation()
        except (SessionDirError, OSError):
            return frozenset()
        return frozenset(rec.workers) | ({rec.head_job} if rec.head_job else frozenset())

    def _ask(self, ids: frozenset[str]) -> dict[str, JobInfo]:
        return dict(self._ask_answer(ids).jobs)

    def _ask_answer(self, ids: frozenset[str]) -> SchedulerAnswer:
        """Ask the scheduler (the only place that does), store the answer, tell the observers."""
        asked_at = time.time()
        listed = self.scheduler.query(self.info.job_name, sorted(ids, key=int), user=self.user)
        answer = SchedulerAnswer(job_name=self.info.job_name, user=self.user, asked_at=asked_at, ids=ids,
                                 jobs=MappingProxyType(dict(listed)))
        self.last_answer = answer
        previous = self.shared.read()
        for job, reason in pending_news(previous.jobs if previous else {}, listed, self._pending_seen):
            event_log.emit(self.dir.path, EventKind.PENDING, EventSource.COORDINATOR, job=job, reason=reason,
                           at=asked_at)
        self.shared.write(answer, stored=previous)
        for observe in self.observers:
            try:
                observe(listed)
            except Exception:   # an observer must never break a query
                log.exception("event=observer_failed session=%s", self.info.job_name)
        return answer

    def known(self, job_id: str, max_age: float = 0.0) -> JobInfo | None:
        """One job's state, or None while the scheduler does not answer.

        For the watchers (payload drivers, waits): slurmctld restarting or
        overloaded for a minute must not end a run whose head is healthy.
        The failure is logged at most once per ``UNREACHABLE_LOG_EVERY``.
        """
        try:
            return self.listing([job_id], max_age).get(job_id)
        except SchedulerError as exc:
            now = time.monotonic()
            if now - self._unreachable_logged >= UNREACHABLE_LOG_EVERY:
                self._unreachable_logged = now
                log.warning("event=scheduler_unreachable session=%s job=%s error=%s; asking again later",
                            self.info.job_name, job_id, exc)
            return None

    def query(self, rec: AllocationRecord, extra: Iterable[str] = (), max_age: float = 0.0) -> dict[str, JobInfo]:
        """The session's jobs (one query), after settling any stray it shows.

        Strays are settled on answers this call asked for only, never on a
        shared one that may be seconds old (each supervisor asks afresh every
        few checks, ``pacing.supervisor_max_age``, so a stray is not missed for long)."""
        extra = set(extra)
        ids = set(rec.workers) | extra | ({rec.head_job} if rec.head_job else set())
        listed, asked = self._listing(ids, max_age)
        if asked:
            self.settle(rec, listed)
        return ownership.session_jobs(listed, rec.recorded_jobs | extra)

    def settle(self, rec: AllocationRecord, listed: dict[str, JobInfo]) -> ownership.Reconciliation:
        """Cancel strays and forget settled intents (no effect when there are none)."""
        # The periods are read here, not bound at import, so a test can shorten them.
        decision = ownership.reconcile(rec, listed, self.info.session_id, time.time(),
                                       in_flight=ownership.IN_FLIGHT, watch=ownership.WATCH)
        why = decision.why or {}
        cancel = [job for job in decision.cancel if job not in self._cancelled]
        if cancel:
            for job in cancel:
                log.warning("event=stray_job_cancelled session=%s job=%s comment=%s why=%r", self.info.job_name,
                            job, listed[job].comment, why.get(job, ""))
            try:
                self.scheduler.cancel_jobs(cancel, user=self.user)
                self._cancelled.update(cancel)
                self.shared.forget()
            except SchedulerError as exc:
                log.warning("event=stray_cancel_failed session=%s jobs=%s error=%s", self.info.job_name,
                            ",".join(cancel), exc)
        if decision.drop:
            for marker in decision.drop:
                log.info("event=intent_settled session=%s marker=%s why=%r", self.info.job_name, marker,
                         why.get(marker, ""))
            self.dir.update_allocation(lambda r: r.without_intents(decision.drop))
        return decision

    # ------------------------------------------------------------ submit
    def submit(self, spec: JobSpec, config: Any, record_as: RecordAs, spec_path: Path | None = None) -> str:
        """Submit ``spec`` with a recorded intent; ``record_as(record, job_id)``
        records the job in the same update that retires the intent, so no
        process ever sees the job both unrecorded and without its intent."""
        marker = ownership.make_marker(self.info.session_id, uuid.uuid4().hex[:12])
        intent = SubmissionIntent(marker=marker, role=spec.role, config=config.to_dict(), created_at=time.time(),
                                  spec_path=None if spec_path is None else str(spec_path))
        self.dir.update_allocation(lambda r: r.with_intent(intent))
        try:
            job_id = self.scheduler.submit(replace(spec, comment=marker))
            self.shared.forget()
        except SchedulerError as exc:
            job_id = self._recover(marker, exc)
        except (ConfigError, ValueError):
            # Refused before anything reached the scheduler: nothing to find.
            self.dir.update_allocation(lambda r: r.without_intents({marker}))
            raise
        self.dir.update_allocation(lambda r: record_as(r.without_intents({marker}), job_id))
        shape = spec.allocation
        event_log.emit(self.dir.path, EventKind.SUBMITTED, EventSource.COORDINATOR, job=job_id, role=str(spec.role),
                       spec_id=None if spec_path is None else spec_path.stem, partition=shape.partition,
                       nodes=shape.num_nodes, gpus_per_node=shape.gpus_per_node,
                       cpus_per_task=shape.cpus_per_task)
        return job_id

    def _recover(self, marker: str, error: SchedulerError) -> str:
        """sbatch failed: adopt the job if it was queued anyway, else record
        the failure (a job that shows up later is then cancelled) and raise."""
        try:
            listed = self.listing(())
        except SchedulerError as exc:
            log.warning("event=submission_lookup_failed session=%s marker=%s error=%s", self.info.job_name,
                        marker, exc)
            listed = {}
        adopt, extra = ownership.adopt_after_failure(marker, listed)
        if extra:
            self.scheduler.cancel_jobs(extra, user=self.user)
        if adopt is None:
            now = time.time()
            self.dir.update_allocation(lambda r: r.with_intent(replace(
                r.intents[marker], failed_at=now, error=str(error)[:500])) if marker in r.intents else r)
            raise error
        log.warning("event=submission_adopted session=%s job=%s marker=%s error=%r", self.info.job_name, adopt,
                    marker, str(error)[:200])
        return adopt

    # ------------------------------------------------------------ teardown
    def teardown(self, extra: Iterable[str] = (), *, wait: bool = False,
                 timeout: float = defaults.TEARDOWN_TIMEOUT,
                 progress: Callable[[str], None] | None = None) -> tuple[str, ...]:
        """Cancel every active job the session recorded or marked; returns their ids.

        With ``wait``, return only once none of them (nor ``extra``) is active
        any more, COMPLETING included (:meth:`wait_ended`); jobs still active
        after ``timeout`` seconds are one more problem of the teardown.

        By id and for the session's user only: a same-named job of another
        session, or of another user, is left alone. It never stops halfway:
        with a damaged record it takes the ids from the record's copies and
        the session directory's files, and with a scheduler that does not
        answer it cancels the recorded ids blindly; every failure is
        collected and raised once at the end (TeardownIncomplete), after
        everything was tried.
        """
        if not isinstance(wait, bool):
            raise ConfigError("wait", wait, "must be True or False")
        if wait:
            _check_timeout(timeout)   # before anything is cancelled
        errors: list[str] = []
        rec: AllocationRecord | None = None
        # A detached supervisor (SSH mode) still watching would take the
        # cancelled head for a lost one and submit a new one: stop it first.
        detached.stop_supervisor(self.dir.path)
        # So would an autoscaler of any process still supervising it (min_allocations): it stops too.
        try:
            scaling_store.stop_at_teardown(self.dir.path)
        except OSError as exc:
            errors.append(f"autoscale policy: {exc}")
        try:
            # Marked removed before the cancel: a process polling between the
            # cancel and this update would take the CANCELLED workers for
            # failures (.failures).
            rec = self.dir.update_allocation(lambda r: replace(r, workers=MappingProxyType({
                job: (w if w.state == WorkerIntent.REMOVED else replace(w, state=WorkerIntent.REMOVED)) for job, w in r.workers.items()}))
                if any(w.state != WorkerIntent.REMOVED for w in r.workers.values()) else r)
        except (SessionDirError, OSError) as exc:
            errors.append(f"record: {exc}")
        copies, seen = allocation_repair.known_jobs(self.dir)
        ours = set(copies) | set(extra) | (set(rec.recorded_jobs) if rec is not None else set())
        seen = set(seen) - ours
        try:
            listed = self.listing(ours | seen)
        except SchedulerError as exc:
            errors.append(f"query: {exc}")
            targets = tuple(sorted(ours, key=int))   # nothing listed: by recorded id, blindly
        else:
            targets = ownership.teardown_targets_of(ours, listed, self.info.session_id, seen=seen,
                                                    job_name=self.info.job_name)
        cancelled = self._cancel(targets, errors)
        if wait:
            try:
                self.wait_ended(set(cancelled) | set(extra), timeout=timeout, progress=progress)
            except SchedulerError as exc:   # the timeout, or a scheduler that stopped answering
                errors.append(str(exc))
        log.info("event=teardown session=%s cancelled=%s problems=%d", self.info.job_name,
                 ",".join(cancelled) or "-", len(errors))
        event_log.emit(self.dir.path, EventKind.SESSION_ENDED, EventSource.COORDINATOR, reason="teardown",
                       cancelled=",".join(cancelled) or None, problems=len(errors))
        if errors:
            for error in errors:
                log.warning("event=teardown_problem session=%s error=%s", self.info.job_name, error)
            raise TeardownIncomplete(cancelled, tuple(errors))
        return cancelled

    def wait_ended(self, jobs: Iterable[str], *, timeout: float = defaults.TEARDOWN_TIMEOUT,
                   progress: Callable[[str], None] | None = None) -> dict[str, JobInfo]:
        """Wait until none of ``jobs`` is active (Slurm has let go of their
        nodes: COMPLETING counts as active); returns what the scheduler last
        said of each. Asks the scheduler for these ids alone, not through the
        record (which a teardown may find damaged), every 0.5 s at first and
        at most every 5 s. SchedulerError when ``timeout`` runs out, naming
        the jobs still active.
        """
        _check_timeout(timeout)
        watched = sorted(set(jobs), key=lambda j: (len(j), j))
        if not watched:
            return {}

        def look() -> tuple[dict[str, JobInfo], list[str]]:
            listed = {job: info for job, info in self.listing(watched).items() if job in watched}
            return listed, [job for job, info in listed.items() if info.state.is_active]

        def report(seen: tuple[dict[str, JobInfo], list[str]]) -> None:
            if progress is not None:
                progress(f"waiting for {len(seen[1])} job(s) to end: {', '.join(seen[1])}")

        listed, _ = wait_for(  # type: ignore[misc]
            look, timeout=timeout, interval=0.5, backoff=1.5, max_interval=5.0, done=lambda seen: not seen[1],
            progress=report, error=lambda seen: SchedulerError(
                f"{len(seen[1])} job(s) still active {timeout:g}s after the cancel: {', '.join(seen[1])}"))
        return listed

    def _cancel(self, targets: tuple[str, ...], errors: list[str]) -> tuple[str, ...]:
        """One scancel for all; if it fails, one per job, so one bad id
        cannot keep the others running."""
        if not targets:
            return ()
        self.shared.forget()
        try:
            self.scheduler.cancel_jobs(targets, user=self.user)
            return targets
        except SchedulerError as exc:
            log.warning("event=teardown_cancel_failed session=%s jobs=%s error=%s", self.info.job_name,
                        ",".join(targets), exc)
        done: list[str] = []
        for job in targets:
            try:
                self.scheduler.cancel_jobs([job], user=self.user)
                done.append(job)
            except SchedulerError as exc:
                errors.append(f"cancel {job}: {exc}")
        return tuple(done)


def _check_timeout(timeout: object) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigError("timeout", timeout, "must be a number of seconds > 0")


__all__ = ["RecordAs", "SessionJobs"]
