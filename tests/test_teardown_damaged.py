"""Teardown never stops halfway: with a damaged allocation.json, both copies
damaged, or a scheduler that does not answer, it cancels every job it can
learn of and raises one summary only after trying everything. Real `sleep`
jobs on the local scheduler (no Ray), submitted through the session's job
layer as in test_session_isolation."""

from __future__ import annotations

import uuid

import pytest

from elastic_ray.errors import SchedulerError, TeardownIncomplete
from elastic_ray.scheduler.base import JobState
from helpers import wait_until
from elastic_ray.scheduler.local import LocalScheduler
from test_session_isolation import TIMEOUT, add_worker, all_ended, all_running, ids_of, make_session


@pytest.fixture
def local(tmp_path, monkeypatch):
    """A local scheduler; every job left at the end is cancelled."""
    monkeypatch.setenv("ELASTIC_AGENT_RUNTIME_DIR", str(tmp_path / "agent-runtime"))
    scheduler = LocalScheduler(tmp_path / "local-scheduler")
    yield scheduler
    for job, record in scheduler.store.scan()[0].items():
        if record.state.is_active:
            scheduler.cancel(job)
    wait_until(lambda: all(r.state.is_final for r in scheduler.store.scan()[0].values()), TIMEOUT,
               message="every test job to end")


def started(tmp_path, scheduler, label="s"):
    session = make_session(tmp_path, scheduler, f"er-td-{uuid.uuid4().hex[:6]}", label)
    add_worker(session)
    ids = ids_of(session)
    assert len(ids) == 3
    wait_until(lambda: all_running(scheduler, session.job_name, ids), TIMEOUT, message="the jobs to run")
    return session, ids


def test_a_truncated_record_is_restored_and_every_job_cancelled(tmp_path, local):
    session, ids = started(tmp_path, local)
    with open(session.dir.allocation_file, "r+b") as handle:   # in place, as a full disk or a tool does
        handle.truncate(40)
    assert sorted(session.teardown(), key=int) == ids
    wait_until(lambda: all_ended(local, session.job_name, ids), TIMEOUT, message="every job to end")
    assert list(session.path.glob("allocation.json.corrupt-*"))


def test_with_both_copies_damaged_it_cancels_everything_then_reports(tmp_path, local):
    session, ids = started(tmp_path, local)
    other, other_ids = started(tmp_path, local, "o")           # another session of another name: untouched
    session.dir.allocation_file.write_bytes(b"")                 # also the newest generation file
    session.dir.backup_file.write_bytes(b"{")
    for path in session.dir.generation_dir.glob("*.json"):      # and no older generation to learn from
        path.unlink(missing_ok=True)
    with pytest.raises(TeardownIncomplete) as info:
        session.teardown()
    # Learned from the job logs and jobs/ (checked against the session's name in one query).
    assert sorted(info.value.cancelled, key=int) == ids
    assert any(e.startswith("record:") and "allocation.json" in e for e in info.value.errors)
    wait_until(lambda: all_ended(local, session.job_name, ids), TIMEOUT, message="every job to end")
    assert all_running(local, other.job_name, other_ids)
    other.teardown()


def test_a_scheduler_that_does_not_answer_still_gets_every_recorded_id(tmp_path, local, monkeypatch):
    session, ids = started(tmp_path, local)
    real = local.query
    monkeypatch.setattr(local, "query", lambda *a, **k: (_ for _ in ()).throw(SchedulerError("squeue: timeout")))
    with pytest.raises(TeardownIncomplete, match="squeue: timeout") as info:
        session.teardown()
    assert sorted(info.value.cancelled, key=int) == ids
    monkeypatch.setattr(local, "query", real)
    wait_until(lambda: all_ended(local, session.job_name, ids), TIMEOUT, message="every job to end")


def test_one_cancel_that_fails_does_not_keep_the_others_running(tmp_path, local, monkeypatch):
    session, ids = started(tmp_path, local)
    real = local.cancel_jobs

    def refuse_the_head(job_ids, *, user=None):
        if ids[0] in job_ids:
            raise SchedulerError(f"scancel: error on {ids[0]}")
        real(job_ids, user=user)

    monkeypatch.setattr(local, "cancel_jobs", refuse_the_head)
    with pytest.raises(TeardownIncomplete, match=f"cancel {ids[0]}") as info:
        session.teardown()
    assert sorted(info.value.cancelled, key=int) == ids[1:]
    wait_until(lambda: all_ended(local, session.job_name, ids[1:]), TIMEOUT, message="the others to end")
    assert local.query(session.job_name, ids[:1])[ids[0]].state is JobState.RUNNING
    monkeypatch.setattr(local, "cancel_jobs", real)
    session.teardown()
