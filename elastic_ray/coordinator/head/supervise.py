"""Every process that holds a Session keeps an eye on the head.

The seed asks that each step process of a run checks the head every 30
seconds once the session has a worker allocation or a separate head, and
elects when it is lost. We do better than polling: the supervisor listens to
the head's heartbeat all the time, so a lost head is noticed about two
seconds after it stopped, and it asks the scheduler (one query) every
``interval`` seconds for what a heartbeat cannot tell (the job ended while
Ray still ran). A head nearing its walltime drains itself (its agent,
at its pre-walltime signal or ahead of the walltime) and says so in its
heartbeat; only then is it moved. Many processes may do this at
once; the claim in allocation.json makes them run one election.
Its periodic look mostly takes the session's shared scheduler answer (one
query per ``WATCH_MAX_AGE`` however many processes supervise; see
``pacing.supervisor_max_age``); acting on it, an election or a replacement
worker, asks the scheduler afresh first.

It also keeps a worker: with ``worker_allocation`` set (or a head-only
head), a session with no live worker allocation submits one again.

With ``RayLauncher.standby_head`` it keeps the warm standby head where the
next election would look (:mod:`.standby`): at every periodic check (and
sooner while one is on its way), but not right after an election, whose new
head's workers are still rejoining: the standby waits for the next check.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Protocol

from ...config import SlurmWorkerAllocationConfig
from ... import defaults
from ...errors import ElasticRayError
from . import election
from .headwatch import HeadObservation
from ..allocations.pacing import supervisor_max_age, watch_max_age
from ..ports import SupervisedSession
from .standby import StandbyKeeper

log = logging.getLogger("elastic_ray.coordinator")

DEFAULT_INTERVAL = defaults.SUPERVISE_INTERVAL


class Startable(Protocol):
    """A loop that runs beside the supervisor (the autoscaler's)."""

    def start(self) -> object: ...

    def stop(self, timeout: float = 10.0) -> None: ...


def should_elect_on_its_own(has_workers: bool, ray_head_only: bool) -> bool:
    """Pure: sessions without worker allocations and without a separate head
    leave failover to an explicit ``replace_head()`` call (the seed's rule)."""
    return has_workers or ray_head_only


ERROR_REPEAT_INTERVAL = 300.0


class RepeatedError:
    """The log of an error that persists (a damaged record, a full disk, a
    scheduler that does not answer): one line when it starts or changes,
    then one every ``interval`` seconds while it lasts, with a count, and
    one when it clears; not one per supervision cycle."""

    def __init__(self, session_name: str, interval: float = ERROR_REPEAT_INTERVAL):
        self.session_name = session_name
        self.interval = interval
        self.text: str | None = None
        self.count = 0
        self._logged_at = 0.0

    def failed(self, text: str, now: float, *, trace: bool = False) -> bool:
        """Note one failure; True when it was logged."""
        if text != self.text:
            self.text, self.count, self._logged_at = text, 1, now
            log.warning("event=supervisor_error session=%s error=%s", self.session_name, text, exc_info=trace)
            return True
        self.count += 1
        if now - self._logged_at < self.interval:
            return False
        self._logged_at = now
        log.warning("event=supervisor_error_persists session=%s times=%d error=%s", self.session_name, self.count,
                    text)
        return True

    def cleared(self, now: float) -> None:
        if self.text is not None:
            log.info("event=supervisor_error_cleared session=%s times=%d", self.session_name, self.count)
            self.text, self.count = None, 0


class HeadSupervisor:
    def __init__(self, session: SupervisedSession, interval: float = DEFAULT_INTERVAL, keep_worker: bool = True,
                 on_event: Callable[[str, dict], None] | None = None, standby: StandbyKeeper | None = None,
                 autoscaler: Startable | None = None):
        self.session = session
        self.standby = standby
        # The autoscaler's loop (coordinator.scaling.runner) runs in a thread of its own beside this one, so
        # a slow turn never delays noticing a lost head; it starts and stops with the supervisor.
        self.autoscaler = autoscaler
        self.interval = interval
        self.keep_worker = keep_worker
        self.on_event = on_event
        self._stop = threading.Event()
        self._checks = 0   # periodic checks so far (every few asks the scheduler itself)
        self._thread = threading.Thread(target=self._run, name="elastic-ray-head-supervisor", daemon=True)
        self.noticed: list[tuple[float, str]] = []  # (time, what) for status and benchmarks
        self._errors = RepeatedError(session.job_name)

    def standby_soon(self) -> None:
        """Let the standby keeper look at its next turn (a worker allocation was just added:
        its standby is placed once its first node joins, not at the next periodic check)."""
        if self.standby is not None:
            self.standby.next_at = 0.0

    @property
    def checks(self) -> int:
        """Periodic checks made so far (for status, benchmarks and tests)."""
        return self._checks

    def start(self) -> "HeadSupervisor":
        self._thread.start()
        if self.autoscaler is not None:
            self.autoscaler.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        if self.autoscaler is not None:
            self.autoscaler.stop(timeout)

    def _emit(self, what: str, **fields) -> None:
        self.noticed.append((time.time(), what))
        del self.noticed[:-100]
        log.info("event=%s session=%s %s", what, self.session.job_name,
                 " ".join(f"{k}={v}" for k, v in fields.items()))
        if self.on_event:
            try:
                self.on_event(what, fields)
            except Exception:  # a callback must not stop supervision
                log.exception("event=supervisor_callback_failed")

    def _run(self) -> None:
        next_full = 0.0
        was_alive = False
        was_draining = False
        while not self._stop.is_set():
            try:
                obs = self.session.observe_head(wait=0.5)
                now = time.time()
                lost = was_alive and not obs.alive
                draining = obs.alive and obs.draining and not was_draining
                was_alive, was_draining = obs.alive, obs.alive and obs.draining
                if lost:
                    self._emit("head_lost", head=obs.job, last_beat_age=f"{obs.last_beat_age or 0:.1f}s")
                if draining:
                    self._emit("head_draining", head=obs.job)
                if lost or draining or now >= next_full:
                    next_full = now + self.interval
                    elected = self._check(now, obs)
                    if self.standby is not None:
                        self.standby.next_at = next_full if elected else now
                if self.standby is not None and self.standby.due(now):
                    self.standby.apply(now)
            except ElasticRayError as exc:
                self._errors.failed(str(exc), time.monotonic())
            except Exception as exc:
                self._errors.failed(f"{type(exc).__name__}: {exc}", time.monotonic(), trace=True)
            else:
                self._errors.cleared(time.monotonic())
            self._stop.wait(0.05)

    def _check(self, now: float, obs: HeadObservation) -> bool:
        """One look at the head (and the workers); True when it ran an election."""
        session = self.session
        rec = session.record()
        # The allocation submitted to host the head (the run's first one, in
        # the default layout) is not an *added* worker allocation.
        added = any(not w.hosts_run_head for w in rec.workers.values())
        if not should_elect_on_its_own(added, session.info.ray_head_only):
            return False
        jobs = session.query(max_age=supervisor_max_age(self._checks))
        self._checks += 1
        assessment = session.assess_head(rec, jobs, obs, now)
        if assessment.needs_election:
            self._emit("election_needed", why=repr(assessment.why))
            head = session.replace_head(timeout=defaults.WAIT_TIMEOUT)
            self._emit("head_ready", head=head.job_id, address=head.address)
            rec, jobs = session.record(), session.query(max_age=watch_max_age())
        if self.keep_worker:
            self._keep_a_worker(rec, jobs)
        return assessment.needs_election

    def _keep_a_worker(self, rec, jobs) -> None:
        session = self.session
        live = election.live_workers(rec, jobs)
        if live:
            return
        template = session.info.worker_allocation
        if template is None:
            return  # nothing to resubmit: the session never named a worker shape
        claimant = f"keep-worker:{id(self)}"
        with session.election_claim(claimant) as claim:
            if not claim.held:
                return  # another process is electing or replenishing
            fresh = session.query()
            if election.live_workers(session.record(), fresh):
                return
            handle = session.add_worker_allocation(SlurmWorkerAllocationConfig.from_dict(template))
            self._emit("worker_resubmitted", job=handle.job_id)
