"""Head elections, decided without touching anything.

Everything here is a pure function of an :class:`AllocationRecord`, the
scheduler's answer (a mapping of job id to :class:`JobInfo`) and values the
caller measured (the time, whether the head's Ray answers). No file, process,
clock or scheduler is consulted, for three reasons:

* every process of a run (the supervisor and each payload step) may run these
  rules at the same moment, so they must give the same answer for the same
  inputs, whichever process asks;
* the record changes only inside ``SessionDir.update_allocation``, which calls
  a pure function under the lock; the record transforms below (``claim``,
  ``release``, ``apply_new_head``, ``record_head_failure``) are shaped to be
  passed there directly, and return the *same object* when nothing changes so
  that no write (and no generation bump) happens for a no-op;
* the rules have many ties and corner cases, which are far easier to test
  exhaustively as a table than through real Slurm jobs.

The election order follows the contract: (1) a published successor that is
running; (2) otherwise the running, undrained worker allocation with the most
time left, if the launcher can host a head next to a worker; (3) otherwise a
new head allocation.

The intended flow of one election (the I/O layer's part is in brackets)::

    [query the scheduler once]  assess_head -> needs_election?
    claim                       [update_allocation]; lost -> wait for the winner
    choose_head
    [start the head there, wait until it answers]
        ok     -> apply_new_head   [update_allocation, then write ray_head]
        failed -> record_head_failure + release   (worker hosts only)

A worker allocation only becomes ``head_job`` after its head started, so a
failed attempt leaves it an ordinary worker that later elections may retry
(after the others, and never after a second failure).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar, Union

from ... import defaults
from ...protocol.disk.records import AllocationRecord, ElectionClaim, WorkerIntent, WorkerRecord, check_job_id
from ...scheduler.base import JobInfo, JobState, state_text

#: A claim whose elector died blocks the next election this long (seconds).
DEFAULT_CLAIM_PERIOD = defaults.CLAIM_PERIOD

#: A worker allocation that failed this many times to start a head is passed over.
MAX_HEAD_FAILURES = 2


# ---------------------------------------------------------------- time left

def time_left_at(info: JobInfo, now: float) -> float | None:
    """Seconds the job has left at ``now``; None means unlimited.

    The absolute end time is preferred over the scheduler's ``time_left``
    snapshot because it stays correct however old the answer is: two
    processes that query at different moments still rank jobs the same way.
    The snapshot is the fallback when no end time is known.
    """
    if info.end_time is not None and math.isfinite(info.end_time):
        return max(0.0, info.end_time - now)
    if info.time_left is not None and math.isfinite(info.time_left):
        return max(0.0, info.time_left)
    return None


def _format_time_left(seconds: float | None) -> str:
    if seconds is None:
        return "no time limit"
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m left"
    if minutes:
        return f"{minutes}m{secs:02d}s left"
    return f"{secs}s left"


def _job_key(job_id: str) -> tuple[int, str]:
    """Job ids are digits; order them as numbers (older first), deterministically."""
    return (int(job_id), job_id) if job_id.isdigit() else (-1, job_id)


# ---------------------------------------------------------------- the choice

class ChoiceKind(str, enum.Enum):
    """Which of the three election outcomes; handy for logging and ``match``."""

    USE_PUBLISHED_SUCCESSOR = "use_published_successor"
    HOST_ON_WORKER = "host_on_worker"
    SUBMIT_NEW_HEAD = "submit_new_head"


@dataclass(frozen=True)
class UsePublishedSuccessor:
    """Make the published successor (a separate head allocation that is
    already running) the head."""

    job_id: str
    why: str = field(default="", compare=False)
    kind: ClassVar[ChoiceKind] = ChoiceKind.USE_PUBLISHED_SUCCESSOR


@dataclass(frozen=True)
class HostOnWorker:
    """Start a head-only Ray node on the first node of this running worker
    allocation, next to its worker, without waiting in the queue."""

    job_id: str
    why: str = field(default="", compare=False)
    kind: ClassVar[ChoiceKind] = ChoiceKind.HOST_ON_WORKER


@dataclass(frozen=True)
class SubmitNewHead:
    """Submit a new allocation shaped like the session's first head; it is
    elected once it starts."""

    why: str = field(default="", compare=False)
    kind: ClassVar[ChoiceKind] = ChoiceKind.SUBMIT_NEW_HEAD
    job_id: ClassVar[None] = None


#: ``why`` is for people and never takes part in equality, so tests and
#: callers compare decisions, not wording.
HeadChoice = Union[UsePublishedSuccessor, HostOnWorker, SubmitNewHead]


def _worker_is_draining(worker: WorkerRecord) -> bool:
    # A recorded drain request counts even if the state was not moved on:
    # "undrained" is what the contract asks for, and a worker on its way
    # out would hand the head over again almost at once.
    return worker.state == WorkerIntent.DRAINING or worker.drain_requested_at is not None


def _skip_reason(worker: WorkerRecord, info: JobInfo | None, former: frozenset[str],
                 head_job: str | None) -> str | None:
    """Why this worker allocation cannot host the head now, or None if it can."""
    if worker.state == WorkerIntent.REMOVED:
        return "removed"
    if _worker_is_draining(worker):
        return "draining"
    if worker.job_id == head_job:
        return "current head"
    if worker.job_id in former:
        return "former head"
    if info is None:
        return "not reported by the scheduler"
    if info.state is not JobState.RUNNING:
        return "not running"
    if worker.head_failures >= MAX_HEAD_FAILURES:
        return f"failed {worker.head_failures} times as head"
    return None


def choose_head(record: AllocationRecord, jobs: Mapping[str, JobInfo], *,
                can_host_on_worker: bool, now: float) -> HeadChoice:
    """Pick the next head, in the contract's order.

    1. ``record.successor`` if its job is RUNNING (and it is neither the
       current head nor a former one): someone already paid for a head
       allocation and it holds nodes, so nothing is faster.
    2. Otherwise, when ``can_host_on_worker`` (the launcher's port strategy
       gives a second Ray node on the same host its own ports), a worker
       allocation that is RUNNING, recorded as ``submitted`` (not draining or
       removed), has failed fewer than twice as head, and was never head
       before. Workers that never failed come first ("the next election tries
       the other worker allocations first"); within a tier the most time left
       wins, unlimited beating any finite time, since the head should outlive
       as many workers as possible; remaining ties go to the lowest job id so
       that every process elects the same one.
    3. Otherwise submit a new head allocation.

    The current head and former heads are never chosen: they are the ones we
    are moving away from, and choosing them again would only repeat the
    failure or the hand-over.
    """
    former = frozenset(record.predecessors)
    head_job = record.head_job

    successor = record.successor
    successor_note = ""
    if successor is not None:
        info = jobs.get(successor)
        if successor == head_job:
            successor_note = f"published successor {successor} is already the head; "
        elif successor in former:
            successor_note = f"published successor {successor} was head before; "
        elif info is None:
            successor_note = f"published successor {successor} is not reported by the scheduler; "
        elif info.state is not JobState.RUNNING:
            successor_note = f"published successor {successor} is {info.state.value}; "
        else:
            return UsePublishedSuccessor(
                successor, why=f"published successor {successor} is RUNNING "
                               f"({_format_time_left(time_left_at(info, now))})")

    if not can_host_on_worker:
        return SubmitNewHead(why=successor_note + "the port strategy is 'fixed', so no worker "
                                                  "allocation can host a head next to its worker")

    best_key: tuple | None = None
    best: WorkerRecord | None = None
    best_left: float | None = None
    eligible = 0
    skipped: Counter[str] = Counter()
    for worker in record.workers.values():
        info = jobs.get(worker.job_id)
        reason = _skip_reason(worker, info, former, head_job)
        if reason is not None:
            skipped[reason] += 1
            continue
        assert info is not None  # _skip_reason checked it
        eligible += 1
        left = time_left_at(info, now)
        # Smaller is better: failure tier, then unlimited before finite,
        # then more time left, then the lower job id.
        key = (worker.head_failures, left is not None, -(left or 0.0), _job_key(worker.job_id))
        if best_key is None or key < best_key:
            best_key, best, best_left = key, worker, left

    passed = ", ".join(f"{n} {why}" for why, n in sorted(skipped.items()))
    passed_note = f"; passed over: {passed}" if passed else ""
    if best is not None:
        tier = " (it failed once as head; every other eligible one failed too)" if best.head_failures else ""
        return HostOnWorker(
            best.job_id,
            why=(successor_note + f"worker allocation {best.job_id} is RUNNING with "
                 f"{_format_time_left(best_left)}, the most of {eligible} eligible{tier}{passed_note}"))
    if not record.workers:
        return SubmitNewHead(why=successor_note + "no successor and no worker allocation")
    return SubmitNewHead(why=successor_note + f"no worker allocation can host the head{passed_note}")


# ---------------------------------------------------------------- the head's health

class HeadCondition(str, enum.Enum):
    """What the session's current head is doing, as far as an election cares."""

    HEALTHY = "healthy"          # running and answering: keep it
    STARTING = "starting"        # running, Ray not up yet but within its start time: wait
    QUEUED = "queued"            # the head job is still pending: wait for it
    SUSPENDED = "suspended"      # the head job is suspended: it keeps its nodes and resumes
    UNREPORTED = "unreported"    # the scheduler's answer lacks the head job: ask again
    NO_HEAD = "no_head"          # the session has no head: elect
    JOB_ENDED = "job_ended"      # the head job ended (or is completing): elect at once
    RAY_STOPPED = "ray_stopped"  # the job runs but Ray does not answer: elect at once
    DRAINING = "draining"        # the head is phasing out: elect, the old one stays until then

    @property
    def needs_election(self) -> bool:
        return self in _ELECT

    @property
    def hand_over(self) -> bool:
        """The old head still serves while the next one is elected."""
        return self is HeadCondition.DRAINING


_ELECT = frozenset({HeadCondition.NO_HEAD, HeadCondition.JOB_ENDED,
                    HeadCondition.RAY_STOPPED, HeadCondition.DRAINING})


@dataclass(frozen=True)
class HeadAssessment:
    condition: HeadCondition
    why: str = field(default="", compare=False)

    @property
    def needs_election(self) -> bool:
        return self.condition.needs_election


def head_is_healthy(record: AllocationRecord, jobs: Mapping[str, JobInfo], head_alive: bool) -> bool:
    """The head job is RUNNING and its Ray head answers (``head_alive`` is the
    caller's heartbeat verdict). A draining head is still healthy here: it
    serves until the next head is up; ``assess_head`` says it must hand over."""
    if record.head_job is None:
        return False
    info = jobs.get(record.head_job)
    return info is not None and info.state is JobState.RUNNING and head_alive


def assess_head(record: AllocationRecord, jobs: Mapping[str, JobInfo], *, head_alive: bool,
                now: float, head_draining: bool = False, head_starting: bool = False) -> HeadAssessment:
    """Decide whether the session needs an election, and why.

    ``head_alive``: the head's Ray answered its last heartbeat.
    ``head_draining``: the caller saw a drain of the head (its pre-walltime
    signal or a ``request_drain()``), beyond what the record says.
    ``head_starting``: the head was just elected or submitted and is still
    within its start time, so a silent Ray is not yet a failure; without this
    every poll during start-up would elect again.

    Time left alone never starts an election: a head hands over only once it
    drains (its heartbeat says so), because only a drain signals its payload
    drivers. A head with a pre-walltime signal drains when the signal comes;
    one without drains itself ahead of its walltime (``agent.slurm.walltime``).
    Electing on the clock here would move a head without telling its
    drivers, and move a signalled head minutes before it must.

    A missing head job in ``jobs`` is not taken as "ended": the scheduler
    interface reports every id it is asked about, so absence means the caller
    did not ask, and electing on a guess could split the cluster in two.
    """
    head = record.head_job
    if head is None:
        return HeadAssessment(HeadCondition.NO_HEAD, "the session has no head")
    info = jobs.get(head)
    if info is None:
        return HeadAssessment(HeadCondition.UNREPORTED,
                              f"head job {head} is missing from the scheduler's answer; ask again")
    state = info.state
    if state.is_final or state is JobState.COMPLETING:
        return HeadAssessment(HeadCondition.JOB_ENDED, f"head job {head} is {state.value}")
    if state is JobState.PENDING:
        return HeadAssessment(HeadCondition.QUEUED, f"head job {head} is still {state_text(info)}")
    if state is JobState.SUSPENDED:
        return HeadAssessment(HeadCondition.SUSPENDED,
                              f"head job {head} is SUSPENDED; it keeps its nodes and resumes")
    # RUNNING from here on.
    if not head_alive:
        if head_starting:
            return HeadAssessment(HeadCondition.STARTING, f"head {head} is RUNNING, Ray is still starting")
        return HeadAssessment(HeadCondition.RAY_STOPPED, f"head job {head} is RUNNING but its Ray does not answer")
    if head_draining:
        return HeadAssessment(HeadCondition.DRAINING, f"head {head} is draining")
    worker = record.workers.get(head)
    if worker is not None and (worker.state == WorkerIntent.REMOVED or _worker_is_draining(worker)):
        return HeadAssessment(HeadCondition.DRAINING,
                              f"head {head} is hosted on a worker allocation that is {worker.state}")
    return HeadAssessment(HeadCondition.HEALTHY, f"head {head} is RUNNING and answers")


def needs_election(record: AllocationRecord, jobs: Mapping[str, JobInfo], *, head_alive: bool,
                   now: float, head_draining: bool = False, head_starting: bool = False) -> bool:
    """Shorthand for ``assess_head(...).needs_election``."""
    return assess_head(record, jobs, head_alive=head_alive, now=now, head_draining=head_draining,
                       head_starting=head_starting).needs_election


# ---------------------------------------------------------------- claims

def live_claim(record: AllocationRecord, now: float) -> ElectionClaim | None:
    """The election in progress at ``now``, if any (waiters watch this)."""
    current = record.election
    return current if current is not None and current.is_live(now) else None


def claimant_process(claimant: str) -> tuple[str, int] | None:
    """``(host, pid)`` of a claimant named ``host:pid:nonce`` (what Failover
    writes), or None for any other shape (then only expiry frees the claim)."""
    parts = claimant.split(":")
    if len(parts) != 3 or not parts[0] or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def claim(record: AllocationRecord, claimant: str, now: float,
          period: float = DEFAULT_CLAIM_PERIOD,
          holder_dead: Callable[[str], bool] | None = None) -> tuple[AllocationRecord, bool]:
    """Try to become the one process that runs the election.

    Succeeds when no claim is live (none, or an expired one left by an elector that died), when
    ``holder_dead`` says the live claim's holder is known to be gone (a process on this very host that
    no longer exists: waiting out its period would only delay the run), or when the live claim is
    already ours, in which case it is renewed: the holder renews every fraction of the period while it
    works (``claims.election_claim``) to keep the others out. A renewal keeps the original ``since``
    (when the election began) and moves ``expires``. On refusal the very same record is returned, so
    ``update_allocation`` writes nothing.

    Claims compare wall-clock times written by different hosts; clocks are
    assumed to agree to well within ``period``.
    """
    taken = next_claim(live_claim(record, now), claimant, now, period, holder_dead)
    return (record, False) if taken is None else (replace(record, election=taken), True)


def next_claim(current: ElectionClaim | None, claimant: str, now: float, period: float,
               holder_dead: Callable[[str], bool] | None = None) -> ElectionClaim | None:
    """``claimant``'s claim once it asks, given the live one (``current``), or None while another holder
    keeps it; a renewal keeps ``since``. The election claim's and the autoscaler's lease's one rule."""
    if not claimant:
        raise ValueError("claimant must be a non-empty string")
    if not (math.isfinite(period) and period > 0):
        raise ValueError(f"period={period!r}: must be a positive number of seconds")
    if current is not None and current.claimant != claimant:
        if holder_dead is None or not holder_dead(current.claimant):
            return None
        current = None
    since = current.since if current is not None else now
    return ElectionClaim(claimant=claimant, since=since, expires=now + period)


def holds_claim(record: AllocationRecord, claimant: str) -> bool:
    """Whether the record's claim is ``claimant``'s. Asked of the record that
    ``update_allocation(claim ...)`` returned, it says who won; expiry is not
    looked at because that record was written a moment ago."""
    return record.election is not None and record.election.claimant == claimant


def release(record: AllocationRecord, claimant: str) -> AllocationRecord:
    """Give up our claim; someone else's claim (live or not) is left alone,
    so a late elector can never cancel the election that replaced its own."""
    if record.election is None or record.election.claimant != claimant:
        return record
    return replace(record, election=None)


# ---------------------------------------------------------------- record updates

def apply_new_head(record: AllocationRecord, new_head_job: str, *, hosted_on_worker: bool) -> AllocationRecord:
    """Record that ``new_head_job`` now hosts the head (call it once the head answers).

    The old head joins ``predecessors`` (once), so no later election picks it
    again; the successor is cleared if it is the one that took over; the
    election claim is cleared because the election is over. ``hosted_on_worker``
    must agree with the record (a worker-hosted head is one of the session's
    worker allocations, a head allocation is not): a mismatch means the caller
    confused two jobs, and writing that would corrupt the session.
    Applying the current head again only clears the claim, so a retried
    update is harmless.
    """
    check_job_id(new_head_job, "new_head_job")
    is_worker = new_head_job in record.workers
    if hosted_on_worker and not is_worker:
        raise ValueError(f"job {new_head_job} is not a worker allocation of this session")
    if not hosted_on_worker and is_worker:
        raise ValueError(f"job {new_head_job} is a worker allocation; pass hosted_on_worker=True")
    if new_head_job in record.predecessors:
        raise ValueError(f"job {new_head_job} was head before and is never elected again")
    old = record.head_job
    predecessors = record.predecessors
    if old is not None and old != new_head_job and old not in predecessors:
        predecessors = predecessors + (old,)
    successor = None if record.successor == new_head_job else record.successor
    if (old == new_head_job and predecessors == record.predecessors
            and successor == record.successor and record.election is None):
        return record
    return replace(record, head_job=new_head_job, predecessors=predecessors,
                   successor=successor, election=None)


def record_head_failure(record: AllocationRecord, job_id: str) -> AllocationRecord:
    """Count a failed attempt to start the head on this worker allocation, so
    the next election tries the others first and a second failure excludes it.

    Only worker allocations are counted: a head allocation that fails to start
    is simply replaced, so naming one here is a caller error (ValueError).
    """
    worker = record.workers.get(job_id)
    if worker is None:
        raise ValueError(f"job {job_id} is not a worker allocation of this session")
    return record.with_worker(replace(worker, head_failures=worker.head_failures + 1))


# ---------------------------------------------------------------- live workers

@dataclass(frozen=True)
class LiveWorker:
    """A worker allocation that still holds or awaits resources.

    ``info`` is None when the scheduler did not report the job at all (for
    example just after submission, before squeue lists it).
    """

    record: WorkerRecord
    info: JobInfo | None

    @property
    def job_id(self) -> str:
        return self.record.job_id

    @property
    def state(self) -> JobState | None:
        return None if self.info is None else self.info.state

    @property
    def draining(self) -> bool:
        return _worker_is_draining(self.record)


def live_workers(record: AllocationRecord, jobs: Mapping[str, JobInfo]) -> list[LiveWorker]:
    """The worker allocations a (restarted) supervisor can still drain or cancel.

    A worker counts unless the session removed it or the scheduler says its
    job ended (ENDED_UNKNOWN included). A job the scheduler did not report is
    kept: dropping it would leave a job nobody cancels, while listing one
    extra costs at most a cancel of an ended job, which is not an error.
    Sorted by job id (numerically) so listings are stable.
    """
    out = []
    for worker in record.workers.values():
        if worker.state == WorkerIntent.REMOVED:
            continue
        info = jobs.get(worker.job_id)
        if info is not None and not info.state.is_active:
            continue
        out.append(LiveWorker(worker, info))
    out.sort(key=lambda lw: _job_key(lw.job_id))
    return out


__all__ = [
    "DEFAULT_CLAIM_PERIOD", "MAX_HEAD_FAILURES",
    "ChoiceKind", "HeadChoice", "UsePublishedSuccessor", "HostOnWorker", "SubmitNewHead",
    "HeadCondition", "HeadAssessment", "LiveWorker",
    "time_left_at", "choose_head", "head_is_healthy", "assess_head", "needs_election",
    "live_claim", "claimant_process", "claim", "holds_claim", "release", "apply_new_head", "record_head_failure", "live_workers",
]
