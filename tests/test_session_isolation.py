"""Sessions and users cannot touch each other: real jobs on the local scheduler.

Each test runs `sleep` jobs as a session's head and workers (no Ray), with
the submissions going through the session's own job layer, so intents and
markers are real. What they show:

* two sessions given the same job name: each sees only its own jobs, and
  tearing one down (library or CLI) leaves the other running;
* a same-named job of another user is never listed, cancelled or waited for;
* a submission whose sbatch "timed out" after queueing the job is adopted;
  one whose job the controller queued only after the failure is cancelled
  at the next poll; a submitter that died before recording its job has that
  job cancelled once its intent is no longer in flight;
* allocation.json's intents are a compatible addition.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from elastic_ray.cli.main import main
from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.allocations import ownership
from elastic_ray.coordinator.session import Session
from elastic_ray.errors import SchedulerError
from elastic_ray.protocol.disk.records import AllocationRecord, SessionInfo, SubmissionIntent, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobSpec, JobState, Scheduler
from elastic_ray.scheduler.local import LocalScheduler
from helpers import stays, wait_until

WORKER = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="128M", time_limit="10")
HEAD = SlurmRunAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="128M", time_limit="10")
TIMEOUT = 60.0


def sleep_spec(session: Session, role: str = "worker") -> JobSpec:
    return JobSpec(job_name=session.job_name, role=role, allocation=HEAD if role == "head" else WORKER,
                   node_argv=("sleep", "300"), workdir=session.path,
                   output=str(session.dir.log_dir / f"{role}-%j.out"))


def add_worker(session: Session) -> str:
    return session.jobs.submit(sleep_spec(session), WORKER, lambda r, job: r.with_worker(
        WorkerRecord(job_id=job, config=WORKER.to_dict(), submitted_at=time.time())))


def make_session(tmp_path: Path, scheduler: Scheduler, job_name: str, label: str) -> Session:
    """A session directory with a `sleep` head and one `sleep` worker, submitted with intents."""
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=job_name, created_at=time.time(),
                       scheduler={"kind": "local", "state_dir": str(getattr(scheduler, "state_dir", ""))},
                       head=HEAD.to_dict(), launcher=RayLauncher().to_dict(), user=scheduler.user)
    session = Session(SessionDir.create(tmp_path / label, info), scheduler, supervise=False)
    session.jobs.submit(sleep_spec(session, "head"), HEAD, lambda r, job: replace(r, head_job=job))
    add_worker(session)
    return session


def states(scheduler: LocalScheduler, job_name: str, ids, user: str | None = None) -> dict[str, JobState]:
    return {job: info.state for job, info in scheduler.query(job_name, ids, user=user).items() if job in ids}


def all_running(scheduler: LocalScheduler, job_name: str, ids, user: str | None = None) -> bool:
    return set(states(scheduler, job_name, ids, user).values()) == {JobState.RUNNING}


def all_ended(scheduler: LocalScheduler, job_name: str, ids, user: str | None = None) -> bool:
    return all(s.is_final for s in states(scheduler, job_name, ids, user).values())


@pytest.fixture
def local(tmp_path, monkeypatch):
    """A local scheduler; every job left at the end is cancelled by id, for every user."""
    monkeypatch.setenv("ELASTIC_AGENT_RUNTIME_DIR", str(tmp_path / "agent-runtime"))
    scheduler = LocalScheduler(tmp_path / "local-scheduler")
    yield scheduler
    records, _ = scheduler.store.scan()
    active = [job for job, r in records.items() if r.state.is_active]
    for job in active:
        scheduler.cancel(job)
    wait_until(lambda: all(r.state.is_final for r in scheduler.store.scan()[0].values()), TIMEOUT,
               message="every test job to end")


def ids_of(session: Session) -> list[str]:
    return sorted(session.record().recorded_jobs, key=int)


# ----------------------------------------------------------------- two sessions, one name

def test_two_sessions_with_the_same_name_see_and_tear_down_only_their_own_jobs(tmp_path, local):
    name = f"er-same-{uuid.uuid4().hex[:6]}"
    first, second = make_session(tmp_path, local, name, "a"), make_session(tmp_path, local, name, "b")
    a_ids, b_ids = ids_of(first), ids_of(second)
    assert len(a_ids) == len(b_ids) == 2 and not set(a_ids) & set(b_ids)
    wait_until(lambda: all_running(local, name, a_ids + b_ids), TIMEOUT, message="all four jobs running")

    before = local.calls["query"]
    assert sorted(first.query(), key=int) == a_ids and sorted(second.query(), key=int) == b_ids
    assert local.calls["query"] - before == 2  # one query per poll, per session
    assert local.calls["cancel_jobs"] == 0  # nothing of the other session looked like a stray

    assert sorted(first.teardown(), key=int) == a_ids
    wait_until(lambda: all_ended(local, name, a_ids), TIMEOUT, message="the first session's jobs to end")
    assert {s for s in states(local, name, a_ids).values()} == {JobState.CANCELLED}
    stays(lambda: all_running(local, name, b_ids), 2.0, message="the second session's jobs keep running")
    assert {w.state for w in second.record().workers.values()} == {"submitted"}


def test_cli_teardown_neither_cancels_nor_waits_for_a_same_named_session(tmp_path, local):
    name = f"er-same-{uuid.uuid4().hex[:6]}"
    first, second = make_session(tmp_path, local, name, "a"), make_session(tmp_path, local, name, "b")
    a_ids, b_ids = ids_of(first), ids_of(second)
    wait_until(lambda: all_running(local, name, a_ids + b_ids), TIMEOUT, message="all four jobs running")
    # Were the other session's running jobs waited for, this would fail after --timeout.
    result = CliRunner().invoke(main, ["session", "teardown", str(first.path), "--timeout", "30"],
                                obj={"scheduler": local}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "cancelled 2 job(s); none of the session's 2 job(s) is active"
    assert all_ended(local, name, a_ids)
    assert all_running(local, name, b_ids)


# ----------------------------------------------------------------- another user, same name

def test_a_same_named_job_of_another_user_is_never_listed_cancelled_or_waited_for(tmp_path, local):
    name = f"er-same-{uuid.uuid4().hex[:6]}"
    mine = make_session(tmp_path, local, name, "mine")
    # The other user's own scheduler front on the same (emulated) cluster.
    theirs = LocalScheduler(local.state_dir, user="someone-else")
    assert theirs.user != local.user
    other_job = theirs.submit(JobSpec(job_name=name, role="worker", allocation=WORKER, node_argv=("sleep", "300"),
                                      workdir=tmp_path, output=str(tmp_path / "other-%j.out")))
    my_ids = ids_of(mine)
    wait_until(lambda: all_running(local, name, [other_job], user="someone-else") and all_running(local, name, my_ids),
               TIMEOUT, message="every job running")

    assert other_job not in local.query(name)  # by name: only my jobs
    assert other_job not in mine.query()
    local.cancel_by_name(name)  # by name, as me: never the other user's job
    local.cancel_jobs([other_job])  # by id, as me: skipped (scancel --user)
    wait_until(lambda: all_ended(local, name, my_ids), TIMEOUT, message="my jobs to end")
    stays(lambda: all_running(local, name, [other_job], user="someone-else"), 1.5,
          message="the other user's job keeps running")

    result = CliRunner().invoke(main, ["session", "teardown", str(mine.path), "--timeout", "30"],
                                obj={"scheduler": local}, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert all_running(local, name, [other_job], user="someone-else")


# ----------------------------------------------------------------- submissions that lost their answer

class AnswerLost(Scheduler):
    """A scheduler whose submit loses its answer, as a timed-out sbatch does.

    ``queue`` decides what the controller did: "now" queues the job before
    the error, "later" keeps the spec so the test can queue it after the
    error (a late controller), "never" queues nothing. Everything else is
    the wrapped local scheduler.
    """

    kind = "local"

    def __init__(self, inner: LocalScheduler, queue: str):
        self.inner, self.queue, self.user = inner, queue, inner.user
        self.state_dir = inner.state_dir
        self.kept: list[JobSpec] = []

    def submit(self, spec):
        if self.queue == "now":
            self.inner.submit(spec)
        elif self.queue == "later":
            self.kept.append(spec)
        raise SchedulerError("sbatch --parsable x.sbatch did not finish within 60 s", argv=("sbatch",))

    def query(self, job_name, job_ids=(), *, user=None):
        return self.inner.query(job_name, job_ids, user=user)

    def cancel(self, job_id):
        self.inner.cancel(job_id)

    def cancel_jobs(self, job_ids, *, user=None):
        self.inner.cancel_jobs(job_ids, user=user)

    def cancel_by_name(self, job_name, *, user=None):
        self.inner.cancel_by_name(job_name, user=user)

    def signal(self, job_id, signal_name, *, batch=False):
        self.inner.signal(job_id, signal_name, batch=batch)

    def test_only(self, spec):
        return self.inner.test_only(spec)


def test_a_submission_queued_despite_a_timeout_is_adopted(tmp_path, local):
    session = make_session(tmp_path, local, f"er-lost-{uuid.uuid4().hex[:6]}", "s")
    session.jobs.scheduler = AnswerLost(local, "now")
    job = add_worker(session)  # no exception: the queued job is the submission's
    rec = session.record()
    assert job in rec.workers and not rec.intents
    info = local.query(session.job_name, [job])[job]
    assert info.comment.startswith(f"elastic-ray:{session.info.session_id}:")
    session.jobs.scheduler = local
    assert job in session.query()
    assert local.calls["cancel_jobs"] == 0


def test_a_job_queued_after_its_submission_failed_is_cancelled_at_the_next_poll(tmp_path, local):
    session = make_session(tmp_path, local, f"er-lost-{uuid.uuid4().hex[:6]}", "s")
    lost = AnswerLost(local, "later")
    session.jobs.scheduler = lost
    with pytest.raises(SchedulerError, match="did not finish"):
        add_worker(session)
    (intent,) = session.record().intents.values()
    assert intent.failed_at is not None and intent.role == "worker" and intent.config == WORKER.to_dict()
    session.jobs.scheduler = local
    late = local.submit(lost.kept[0])  # the controller queues it after all
    workers_before = set(session.record().workers)

    assert late not in session.query()  # not the session's: never recorded ...
    wait_until(lambda: local.query(session.job_name, [late])[late].state is JobState.CANCELLED, TIMEOUT,
               message="the stray to be cancelled")  # ... and not left running
    assert set(session.record().workers) == workers_before
    assert all_running(local, session.job_name, ids_of(session))


def test_a_submitter_that_died_before_recording_has_its_job_cancelled_once_not_in_flight(tmp_path, local,
                                                                                         monkeypatch):
    session = make_session(tmp_path, local, f"er-died-{uuid.uuid4().hex[:6]}", "s")
    marker = ownership.make_marker(session.info.session_id, "dead0000")
    session.dir.update_allocation(lambda r: r.with_intent(SubmissionIntent(
        marker=marker, role="worker", config=WORKER.to_dict(), created_at=time.time())))
    orphan = local.submit(replace(sleep_spec(session), comment=marker))  # ... and then the submitter died
    wait_until(lambda: all_running(local, session.job_name, [orphan]), TIMEOUT, message="the orphan running")

    session.query()  # in flight: its submitter may be recording it right now
    assert local.query(session.job_name, [orphan])[orphan].state is JobState.RUNNING
    monkeypatch.setattr(ownership, "IN_FLIGHT", 0.0)
    session.query()
    wait_until(lambda: local.query(session.job_name, [orphan])[orphan].state is JobState.CANCELLED, TIMEOUT,
               message="the orphan to be cancelled")
    monkeypatch.setattr(ownership, "WATCH", 0.0)
    session.query()
    assert not session.record().intents  # settled and forgotten


def test_teardown_also_cancels_a_job_only_its_marker_names(tmp_path, local):
    name = f"er-mark-{uuid.uuid4().hex[:6]}"
    session, other = make_session(tmp_path, local, name, "s"), make_session(tmp_path, local, name, "o")
    marker = ownership.make_marker(session.info.session_id, "inflight0")
    session.dir.update_allocation(lambda r: r.with_intent(SubmissionIntent(
        marker=marker, role="worker", config=WORKER.to_dict(), created_at=time.time())))
    unrecorded = local.submit(replace(sleep_spec(session), comment=marker))
    cancelled = session.teardown()
    assert unrecorded in cancelled and set(ids_of(session)) <= set(cancelled)
    assert not set(ids_of(other)) & set(cancelled)
    wait_until(lambda: all_ended(local, name, [*cancelled]), TIMEOUT, message="the session's jobs to end")


def test_a_submission_refused_before_the_scheduler_leaves_no_intent(tmp_path, local):
    session = make_session(tmp_path, local, f"er-bad-{uuid.uuid4().hex[:6]}", "s")
    bad = replace(sleep_spec(session), output="has blank.out")
    session.jobs.scheduler = _Rendering(local)
    with pytest.raises(ValueError):
        session.jobs.submit(bad, WORKER, lambda r, job: r)
    assert not session.record().intents


class _Rendering(AnswerLost):
    """Renders the batch script first, as sbatch's caller does: a bad value never reaches the scheduler."""

    def __init__(self, inner):
        super().__init__(inner, "never")

    def submit(self, spec):
        from elastic_ray.scheduler.render import render_batch_script

        render_batch_script(spec)
        return self.inner.submit(spec)


# ----------------------------------------------------------------- the records

def test_intents_are_a_compatible_addition_to_allocation_json(tmp_path):
    empty = AllocationRecord().to_dict()
    assert "intents" not in empty  # a record without intents is written as before
    intent = SubmissionIntent(marker="elastic-ray:s:t", role="head", config={"partition": "cpu"}, created_at=1.0,
                              spec_path="/x/spec.json", failed_at=2.0, error="timed out")
    rec = AllocationRecord().with_intent(intent)
    data = json.loads(json.dumps(rec.to_dict()))
    assert data["protocol_version"] == 1
    assert AllocationRecord.from_dict(data) == rec
    assert AllocationRecord.from_dict({**data, "future_key": [1]}) == rec  # unknown keys are ignored
    assert rec.without_intents({"elastic-ray:s:t"}).intents == {}
    assert rec.without_intents({"other"}) is rec


@pytest.mark.parametrize("bad, match", [
    ({"elastic-ray:s:t": {"marker": "elastic-ray:s:OTHER", "role": "worker", "config": {}, "created_at": 1}},
     "holds marker"),
    ({"m": {"marker": "m", "role": "driver", "config": {}, "created_at": 1}}, "role"),
    ({"m": {"marker": "m", "role": "worker", "config": [], "created_at": 1}}, "config"),
    ({"m": {"marker": "m", "role": "worker", "config": {}}}, "created_at"),
    ({"m": "not an object"}, "intents"),
    ([], "intents"),
])
def test_a_damaged_intent_is_refused_naming_it(bad, match):
    data = {**AllocationRecord().to_dict(), "intents": bad}
    with pytest.raises(ValueError, match=match):
        AllocationRecord.from_dict(data)


def test_session_info_records_the_submitting_user_compatibly():
    info = SessionInfo(session_id="s", job_name="er-x", created_at=1.0, scheduler={"kind": "slurm"},
                       head={"partition": "cpu"}, user="alice")
    assert SessionInfo.from_dict(info.to_dict()).user == "alice"
    old = {k: v for k, v in info.to_dict().items() if k != "user"}
    assert SessionInfo.from_dict(old).user is None
    assert "user" not in replace(info, user=None).to_dict()
