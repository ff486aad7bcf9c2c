"""Worker allocations that end without the session asking: recorded once, reported, kept if asked.

The decisions (what counts as a failure, what is resubmitted) are pure and
tested over every scheduler state; the watch is tested with two "processes"
on one session directory; the whole path runs for real on the local
scheduler with real agents (waiting for a head that never comes, so no Ray).
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.allocations import failures as fl
from elastic_ray.coordinator.head.claims import election_claim
from elastic_ray.coordinator.session import Session
from elastic_ray.errors import ConfigError, SchedulerError
from elastic_ray.protocol.disk.records import AllocationEnding, AllocationRecord, SessionInfo, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobInfo, JobSpec, JobState
from elastic_ray.scheduler.local import LocalScheduler
from helpers import stays, wait_until

NOW = 1_700_000_000.0
FAILURES = {"FAILED", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "OUT_OF_MEMORY", "CANCELLED", "BOOT_FAIL", "DEADLINE",
            "ENDED_UNKNOWN"}
RESUBMITTED = {"FAILED", "NODE_FAIL", "TIMEOUT", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL"}


def worker(job: str = "21", **kw) -> WorkerRecord:
    return WorkerRecord(job_id=job, config={"partition": "cpu", "num_nodes": 1}, submitted_at=NOW - 100, **kw)


def info(job: str, state: JobState, reason: str = "", nodes=("cpu-1",)) -> JobInfo:
    return JobInfo(job, "er-test", state, reason=reason, nodes=nodes)


# ================================================================ pure decisions

def test_the_two_state_sets_are_what_the_docs_say():
    assert {s.value for s in fl.UNEXPECTED_ENDINGS} == FAILURES
    assert {s.value for s in fl.RESUBMIT_ON} == RESUBMITTED
    assert fl.RESUBMIT_ON <= fl.UNEXPECTED_ENDINGS
    assert not any(s.is_active for s in fl.UNEXPECTED_ENDINGS)


@pytest.mark.parametrize("state", list(JobState))
@pytest.mark.parametrize("intent", ["submitted", "draining", "removed"])
def test_an_ending_counts_only_when_the_session_did_not_ask(state, intent):
    got = fl.ended_unexpectedly(worker(state=intent), info("21", state))
    assert got == (intent == "submitted" and state.value in FAILURES)


def test_an_unreported_job_or_an_ending_already_recorded_is_not_news():
    assert not fl.ended_unexpectedly(worker(), None)
    done = worker(ended=AllocationEnding("FAILED", NOW - 5))
    assert not fl.ended_unexpectedly(done, info("21", JobState.FAILED))


def test_mark_endings_records_state_reason_and_nodes_and_writes_nothing_when_nothing_is_new():
    rec = AllocationRecord(workers={"21": worker("21"), "22": worker("22"), "23": worker("23", state="removed")})
    jobs = {"21": info("21", JobState.NODE_FAIL, "NodeDown", ("cpu-1", "cpu-2")),
            "22": info("22", JobState.RUNNING), "23": info("23", JobState.CANCELLED)}
    marked, newly = fl.mark_endings(rec, jobs, NOW)
    assert newly == ("21",)
    assert marked.workers["21"].ended == AllocationEnding("NODE_FAIL", NOW, "NodeDown", ("cpu-1", "cpu-2"))
    assert marked.workers["22"].ended is None and marked.workers["23"].ended is None
    again, newly = fl.mark_endings(marked, jobs, NOW + 30)
    assert again is marked and newly == ()


@pytest.mark.parametrize("state", list(JobState))
def test_resubmission_follows_the_ending_state(state):
    w = worker(resubmit_on_failure=2, ended=AllocationEnding(state.value, NOW))
    assert fl.should_resubmit(w) == (state.value in RESUBMITTED)


@pytest.mark.parametrize("change, due", [
    ({}, True),
    ({"resubmit_on_failure": 0}, False),          # not asked for (or used up)
    ({"ended": None}, False),                     # has not failed
    ({"replaced_by": "30"}, False),               # already replaced
    ({"state": "removed"}, False),                # the user removed it
    ({"state": "draining"}, False),               # a drain was asked for
    ({"hosts_run_head": True}, False),            # the election moves heads
])
def test_resubmission_needs_a_wish_a_failure_and_no_replacement_yet(change, due):
    w = replace(worker(resubmit_on_failure=1, ended=AllocationEnding("FAILED", NOW)), **change)
    assert fl.should_resubmit(w) is due
    assert [x.job_id for x in fl.due_for_resubmission(AllocationRecord(workers={"21": w}))] == (["21"] if due else [])


def test_a_replacement_is_recorded_with_its_predecessor_in_one_update():
    old = worker("21", resubmit_on_failure=2, ended=AllocationEnding("FAILED", NOW))
    rec = AllocationRecord(workers={"21": old})
    new = worker("30", resubmit_on_failure=1, replaces="21")
    after = fl.record_worker(rec, new)
    assert after.workers["30"] == new and after.workers["21"].replaced_by == "30"
    assert fl.record_worker(AllocationRecord(), worker("31")).workers["31"].replaces is None
    assert fl.give_up_resubmitting(after, "21").workers["21"].resubmit_on_failure == 0
    assert fl.give_up_resubmitting(after, "99") is after


def test_failures_of_lists_what_any_process_can_read():
    rec = AllocationRecord(workers={
        "21": worker("21", ended=AllocationEnding("PREEMPTED", NOW, "Preempted", ("gpu-1",)), replaced_by="30"),
        "22": worker("22"),
        "30": worker("30", replaces="21")})
    (failure,) = fl.failures_of(rec)
    assert failure == fl.AllocationFailure(job_id="21", state="PREEMPTED", reason="Preempted", nodes=("gpu-1",),
                                           noticed_at=NOW, partition="cpu", replaced_by="30")
    assert failure.to_dict()["replaced_by"] == "30"


@pytest.mark.parametrize("value", [-1, 1.5, "2", True, None])
def test_resubmit_count_is_a_whole_number(value):
    with pytest.raises(ConfigError, match="resubmit_on_failure"):
        fl.check_resubmit_count(value)


# ================================================================ the record: a compatible addition

def test_new_worker_keys_round_trip_and_are_absent_when_unset():
    plain = worker("21")
    assert not {"ended", "resubmit_on_failure", "replaces", "replaced_by"} & set(plain.to_dict())
    full = worker("21", ended=AllocationEnding("NODE_FAIL", NOW, "NodeDown", ("a", "b")), resubmit_on_failure=3,
                  replaces="20", replaced_by="22")
    assert WorkerRecord.from_dict(full.to_dict()) == full
    assert WorkerRecord.from_dict(plain.to_dict()) == plain


@pytest.mark.parametrize("key, value, words", [
    ("resubmit_on_failure", -1, "resubmit_on_failure"),
    ("resubmit_on_failure", "2", "resubmit_on_failure"),
    ("replaces", "x1", "replaces"),
    ("replaced_by", "", "replaced_by"),
    ("ended", {"state": "", "noticed_at": 1.0}, "ended: 'state'"),
    ("ended", {"state": "FAILED"}, "ended: missing key 'noticed_at'"),
    ("ended", {"state": "FAILED", "noticed_at": 1.0, "nodes": [1]}, "ended: nodes[0]"),
])
def test_bad_new_keys_are_refused_naming_the_key(key, value, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        WorkerRecord.from_dict({**worker("21").to_dict(), key: value})


# ================================================================ the watch: many processes, one record

def _session_dir(tmp_path: Path, rec: AllocationRecord) -> SessionDir:
    info = SessionInfo(session_id="s" * 32, job_name="er-test", created_at=NOW, scheduler={"kind": "slurm"},
                       head={"partition": "cpu"})
    directory = SessionDir.create(tmp_path / "session", info)
    directory.update_allocation(lambda r: replace(rec, generation=r.generation))
    return directory


class Process:
    """One process's watch on a shared directory, with a fake submitter."""

    def __init__(self, directory: SessionDir, next_ids: list[str], *, on_ended=True, error: Exception | None = None):
        self.told: list[fl.AllocationFailure] = []
        self.submitted: list[str] = []
        self.dir = directory
        self.next_ids = next_ids
        self.error = error
        self.watch = fl.FailureWatch(directory, "er-test", resubmit=self.resubmit,
                                     claim=lambda who: election_claim(directory, who, 120.0),
                                     on_ended=self.told.append if on_ended else None)

    def resubmit(self, old: WorkerRecord) -> str:
        if self.error is not None:
            raise self.error
        job = self.next_ids.pop(0)
        self.dir.update_allocation(lambda r: fl.record_worker(r, replace(
            old, job_id=job, ended=None, replaced_by=None, replaces=old.job_id,
            resubmit_on_failure=old.resubmit_on_failure - 1)))
        self.submitted.append(job)
        return job


def test_two_processes_record_log_and_resubmit_once_and_both_are_told(tmp_path, caplog):
    directory = _session_dir(tmp_path, AllocationRecord(workers={
        "21": worker("21", resubmit_on_failure=1), "22": worker("22")}))
    ids = ["30", "31", "32"]
    a, b = Process(directory, ids), Process(directory, ids)
    answer = {"21": info("21", JobState.NODE_FAIL, "NodeDown"), "22": info("22", JobState.RUNNING)}
    with caplog.at_level(logging.INFO, logger="elastic_ray.coordinator"):
        a.watch.observe(directory.read_allocation(), answer)
        b.watch.observe(directory.read_allocation(), answer)
        a.watch.observe(directory.read_allocation(), answer)  # a later poll sees the same answer
    ended = [r for r in caplog.records if "event=worker_allocation_ended" in r.getMessage()]
    resubmitted = [r for r in caplog.records if "event=worker_allocation_resubmitted" in r.getMessage()]
    assert len(ended) == 1 and "job=21 state=NODE_FAIL reason='NodeDown'" in ended[0].getMessage()
    assert len(resubmitted) == 1 and "job=30 replaces=21" in resubmitted[0].getMessage()
    assert a.submitted + b.submitted == ["30"]
    rec = directory.read_allocation()
    assert rec.workers["21"].replaced_by == "30" and rec.workers["30"].replaces == "21"
    assert rec.workers["30"].resubmit_on_failure == 0 and rec.election is None  # the claim was given back
    assert [f.job_id for f in a.told] == ["21"] and [f.job_id for f in b.told] == ["21"]
    assert a.told[0].replaced_by == "30"

    # The replacement fails too: recorded and told, but its wish is used up.
    answer["30"] = info("30", JobState.FAILED, "NonZeroExitCode")
    b.watch.observe(directory.read_allocation(), answer)
    assert [f.job_id for f in b.told] == ["21", "30"] and directory.read_allocation().workers["30"].replaced_by is None
    assert a.submitted + b.submitted == ["30"]


def test_a_process_opened_later_is_not_told_of_old_failures(tmp_path):
    directory = _session_dir(tmp_path, AllocationRecord(workers={
        "21": worker("21", ended=AllocationEnding("FAILED", NOW))}))
    late = Process(directory, [])
    late.watch.observe(directory.read_allocation(), {"21": info("21", JobState.FAILED)})
    assert late.told == []


def test_a_claim_held_elsewhere_defers_the_resubmission_to_a_later_poll(tmp_path):
    directory = _session_dir(tmp_path, AllocationRecord(workers={"21": worker("21", resubmit_on_failure=1)}))
    p = Process(directory, ["30"])
    answer = {"21": info("21", JobState.PREEMPTED)}
    with election_claim(directory, "an elector", 120.0) as claim:
        assert claim.held
        p.watch.observe(directory.read_allocation(), answer)
        assert p.submitted == [] and directory.read_allocation().workers["21"].ended is not None
    p.watch.observe(directory.read_allocation(), answer)
    assert p.submitted == ["30"]


def test_a_refused_config_stops_resubmitting_and_a_scheduler_error_is_tried_again(tmp_path):
    directory = _session_dir(tmp_path, AllocationRecord(workers={
        "21": worker("21", resubmit_on_failure=2), "22": worker("22", resubmit_on_failure=2)}))
    answer = {"21": info("21", JobState.FAILED), "22": info("22", JobState.BOOT_FAIL)}
    Process(directory, [], error=ConfigError("partition", "x", "no such partition")).watch.observe(
        directory.read_allocation(), {"21": answer["21"]})
    assert directory.read_allocation().workers["21"].resubmit_on_failure == 0
    flaky = Process(directory, ["40"], error=SchedulerError("sbatch: timed out"))
    flaky.watch.observe(directory.read_allocation(), answer)
    assert directory.read_allocation().workers["22"].replaced_by is None
    flaky.error = None
    flaky.watch.observe(directory.read_allocation(), answer)
    assert directory.read_allocation().workers["22"].replaced_by == "40"
    assert directory.read_allocation().workers["21"].replaced_by is None


def test_a_failing_callback_does_not_stop_the_watch_and_a_reentrant_query_is_skipped(tmp_path):
    directory = _session_dir(tmp_path, AllocationRecord(workers={"21": worker("21"), "22": worker("22")}))
    calls = []

    def callback(failure):
        calls.append(failure.job_id)
        watch.observe(directory.read_allocation(), {})  # a callback that queries the session: skipped
        raise RuntimeError("user code")

    watch = fl.FailureWatch(directory, "er-test", resubmit=lambda old: "0", claim=None, on_ended=callback)
    watch.observe(directory.read_allocation(), {"21": info("21", JobState.OUT_OF_MEMORY),
                                                "22": info("22", JobState.DEADLINE)})
    assert calls == ["21", "22"]


# ================================================================ for real on the local scheduler

WORKER = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="128M", time_limit="10")
HEAD = SlurmRunAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="128M", time_limit="10")
TIMEOUT = 60.0


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_RUNTIME_DIR", str(tmp_path / "agent-runtime"))
    scheduler = LocalScheduler(tmp_path / "local-scheduler")
    yield scheduler
    records, _ = scheduler.store.scan()
    for job, r in records.items():
        if r.state.is_active:
            scheduler.cancel(job)
    wait_until(lambda: all(r.state.is_final for r in scheduler.store.scan()[0].values()), TIMEOUT,
               message="every test job to end")


def _session(tmp_path: Path, scheduler: LocalScheduler, **kwargs) -> Session:
    """A session whose head is a `sleep` job (no Ray): its worker agents wait for a head that never comes."""
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=f"er-fail-{uuid.uuid4().hex[:6]}",
                       created_at=time.time(), scheduler={"kind": "local", "state_dir": str(scheduler.state_dir)},
                       head=HEAD.to_dict(), launcher=RayLauncher().to_dict(), user=scheduler.user)
    session = Session(SessionDir.create(tmp_path / "session", info), scheduler, supervise=False, **kwargs)
    spec = JobSpec(job_name=session.job_name, role="head", allocation=HEAD, node_argv=("sleep", "300"),
                   workdir=session.path, output=str(session.dir.log_dir / "head-%j.out"))
    session.jobs.submit(spec, HEAD, lambda r, job: replace(r, head_job=job))
    return session


def _running(session: Session, job: str) -> bool:
    return session.job_info(job).state is JobState.RUNNING


def _kill_job(scheduler: LocalScheduler, job: str) -> None:
    """End a job as a node failure would: its local supervisor dies (NODE_FAIL)."""
    os.kill(scheduler.store.read(job).supervisor.pid, signal.SIGKILL)


def test_a_failed_allocation_is_recorded_told_and_resubmitted_once(tmp_path, local):
    told: list[fl.AllocationFailure] = []
    session = _session(tmp_path, local, on_allocation_ended=told.append)
    kept = session.add_worker_allocation(WORKER, resubmit_on_failure=1)
    plain = session.add_worker_allocation(WORKER)
    assert session.record().workers[kept.job_id].resubmit_on_failure == 1
    wait_until(lambda: _running(session, kept.job_id) and _running(session, plain.job_id), TIMEOUT,
               message="both worker allocations running")
    _kill_job(local, kept.job_id)
    _kill_job(local, plain.job_id)
    wait_until(lambda: session.job_info(kept.job_id).state.is_final
               and session.job_info(plain.job_id).state.is_final, TIMEOUT, message="both jobs ended")

    other = Session.open(session.path, local, supervise=False)  # another process of the run
    failures = session.allocation_failures()
    assert [(f.job_id, f.state) for f in failures] == [(kept.job_id, "NODE_FAIL"), (plain.job_id, "NODE_FAIL")]
    assert sorted(f.job_id for f in told) == [kept.job_id, plain.job_id]
    replacement = kept.replaced_by
    assert replacement is not None and plain.replaced_by is None
    assert kept.failure.state == "NODE_FAIL" and plain.failure is not None and replacement.failure is None
    assert session.record().workers[replacement.job_id].replaces == kept.job_id
    assert session.record().workers[replacement.job_id].config == session.record().workers[kept.job_id].config
    # Any number of later queries, from any process, resubmit nothing more.
    other.query()
    session.query()
    assert len(session.record().workers) == 3
    assert replacement.job_id in {w.job_id for w in session.worker_allocations}

    # The replacement's wish is used up: its failure is recorded, not resubmitted.
    wait_until(lambda: _running(session, replacement.job_id), TIMEOUT, message="the replacement running")
    _kill_job(local, replacement.job_id)

    def recorded() -> fl.AllocationFailure | None:
        other.query()
        return replacement.failure

    assert wait_until(recorded, TIMEOUT, message="the replacement's failure recorded").state == "NODE_FAIL"
    assert replacement.replaced_by is None and len(session.record().workers) == 3


def test_removing_or_tearing_down_is_never_a_failure(tmp_path, local):
    session = _session(tmp_path, local)
    removed = session.add_worker_allocation(WORKER, resubmit_on_failure=3)
    torn = session.add_worker_allocation(WORKER, resubmit_on_failure=3)
    wait_until(lambda: _running(session, removed.job_id) and _running(session, torn.job_id), TIMEOUT,
               message="both running")
    assert session.remove_worker_allocation(removed, drain_timeout=5) in ("COMPLETED", "CANCELLED")
    session.teardown()
    wait_until(lambda: all(i.state.is_final for i in session.query().values()), TIMEOUT, message="all ended")
    assert session.allocation_failures() == [] and len(session.record().workers) == 2
    stays(lambda: len(session.record().workers) == 2 and not session.allocation_failures(), 1.0,
          message="no failure recorded and nothing resubmitted")
