"""Which Slurm jobs belong to a session, and what to do with those it lost track of.

Pure: the session's record, one scheduler answer and a time in; decisions
out. The effects (the query, scancel, the record update) are in
:mod:`.jobs`.

Two rules make sessions unable to touch each other:

* A session's jobs are the ids it *recorded* (head, workers, predecessors,
  successor), never "every job of its name": two sessions given the same job
  name by mistake would otherwise see, wait for and cancel each other's
  jobs. The scheduler is asked by name (one squeue per poll, however many
  jobs) and for the submitting user only; the answer is then cut down to the
  recorded ids here.
* A submission is recorded as an *intent* before sbatch runs, under a marker
  that is unique per submission and names the session
  (``elastic-ray:<session id>:<token>``). Slurm keeps it as the job's
  comment, which squeue prints in the same one call. A job that carries this
  session's marker but whose id was never recorded (sbatch timed out or
  printed something unexpected, the submitter died) is found by it: the
  submitter that saw sbatch fail adopts it at once; any other process, or
  the same one later, cancels it. It is never left running.

Why the comment and not a job-name suffix or the kept batch script's path:
the job name is what the one query per poll selects on (a suffix would need
one query per submission, or a wildcard squeue does not have), and the
script path is only known to Slurm (``%o``) and the submitting host, while
the comment travels with the job in squeue, scontrol and sacct and says
whose session it belongs to to anyone who looks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...protocol.disk.records import AllocationRecord, SubmissionIntent
from ...scheduler.base import JobInfo

MARKER_PREFIX = "elastic-ray"

# An intent without an outcome is "in flight" this long after it was
# written: its job may already be listed while the submitter is still
# recording it, so nobody else may touch that job yet. Longer than any
# submit takes (sbatch's timeout is 60 s; the local scheduler waits up to
# 60 s for its supervisor); after it, the submitter is taken to be dead.
IN_FLIGHT = 300.0
# How long a failed or abandoned intent is kept so that a job the
# controller queues late (after sbatch gave up) is still recognised as a
# submission that failed, and cancelled, rather than adopted by nobody.
WATCH = 1800.0


def make_marker(session_id: str, token: str) -> str:
    """The comment that marks one submission of one session."""
    return f"{MARKER_PREFIX}:{session_id}:{token}"


def marker_session(comment: str) -> str | None:
    """The session id in a marker; None for any other comment."""
    parts = comment.split(":")
    if len(parts) != 3 or parts[0] != MARKER_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


def session_jobs(listed: Mapping[str, JobInfo], wanted: frozenset[str] | set[str]) -> dict[str, JobInfo]:
    """The scheduler's answer cut down to the session's ids.

    A same-named job the session did not record is not the session's, even
    of the same user: another session may carry the name by mistake.
    """
    return {job: info for job, info in listed.items() if job in wanted}


def is_in_flight(intent: SubmissionIntent, now: float, in_flight: float = IN_FLIGHT) -> bool:
    """Its submitter may still be waiting for sbatch, or recording the id."""
    return intent.failed_at is None and now < intent.created_at + in_flight


@dataclass(frozen=True)
class Reconciliation:
    """What to do about jobs the session lost track of.

    ``cancel``: active jobs marked by this session that are not recorded and
    belong to no submission in flight. ``drop``: intents that are settled
    (their job is recorded, or they failed long enough ago). ``why``: one
    reason per job id and per marker, for the log.
    """

    cancel: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()
    why: Mapping[str, str] | None = None

    @property
    def acts(self) -> bool:
        return bool(self.cancel or self.drop)


def reconcile(rec: AllocationRecord, listed: Mapping[str, JobInfo], session_id: str, now: float, *,
              in_flight: float = IN_FLIGHT, watch: float = WATCH) -> Reconciliation:
    """Cancel strays, forget settled intents (the table is in the tests)."""
    recorded = rec.recorded_jobs
    cancel: list[str] = []
    drop: set[str] = set()
    why: dict[str, str] = {}
    for job, info in sorted(listed.items(), key=lambda kv: int(kv[0])):
        if marker_session(info.comment) != session_id:
            continue
        intent = rec.intents.get(info.comment)
        if job in recorded:
            if intent is not None:
                drop.add(info.comment)
                why[info.comment] = f"its job {job} is recorded"
            continue
        if not info.state.is_active:
            continue
        if intent is not None and is_in_flight(intent, now, in_flight):
            continue
        cancel.append(job)
        why[job] = ("its submission failed" if intent is not None and intent.failed_at is not None
                    else "its submitter stopped before recording it" if intent is not None
                    else "the session has no record of it")
    for marker, intent in rec.intents.items():
        if marker in drop or is_in_flight(intent, now, in_flight):
            continue
        settled_at = intent.failed_at if intent.failed_at is not None else intent.created_at + in_flight
        if now >= settled_at + watch:
            drop.add(marker)
            why[marker] = "no job appeared for it while it was watched"
    return Reconciliation(tuple(cancel), tuple(sorted(drop)), why)


def adopt_after_failure(marker: str, listed: Mapping[str, JobInfo]) -> tuple[str | None, tuple[str, ...]]:
    """The submitter saw sbatch fail: the job it made anyway, if listed.

    Returns ``(adopt, cancel)``: the lowest id carrying the marker is the
    submission's job (whatever its state: it was submitted); any other
    active one (one sbatch makes one job, so never expected) is cancelled.
    """
    matches = sorted((job for job, info in listed.items() if info.comment == marker), key=int)
    if not matches:
        return None, ()
    return matches[0], tuple(job for job in matches[1:] if listed[job].state.is_active)


def teardown_targets(rec: AllocationRecord, listed: Mapping[str, JobInfo], session_id: str) -> tuple[str, ...]:
    """The active jobs a teardown cancels: every recorded one, and every one
    marked by this session (a submission in flight or lost), nothing else."""
    return teardown_targets_of(rec.recorded_jobs, listed, session_id)


def teardown_targets_of(ours: frozenset[str] | set[str], listed: Mapping[str, JobInfo], session_id: str, *,
                        seen: frozenset[str] | set[str] = frozenset(), job_name: str = "") -> tuple[str, ...]:
    """As :func:`teardown_targets`, from the ids recorded anywhere (the
    record, its backup, its generation files), plus ``seen``: ids only the
    session directory's files name (``jobs/<job>``, a job log), taken when
    the scheduler lists them active under the session's job name."""
    return tuple(sorted((job for job, info in listed.items() if info.state.is_active
                         and (job in ours or marker_session(info.comment) == session_id
                              or (job in seen and job_name and info.name == job_name))), key=int))


__all__ = ["IN_FLIGHT", "MARKER_PREFIX", "WATCH", "Reconciliation", "adopt_after_failure", "is_in_flight",
           "make_marker", "marker_session", "reconcile", "session_jobs", "teardown_targets",
           "teardown_targets_of"]
