"""The session's shared scheduler answer, and the pace of a wait's scheduler looks.

Issue 11 (slurmctld load): watchers take an answer up to ``max_age`` old
from the session directory; when it is older exactly one process asks; a
damaged file means "ask". A PENDING job is looked at less and less often.
"""

from __future__ import annotations

import json
import multiprocessing
import time
import uuid
from pathlib import Path

import pytest

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.allocations import answers, pacing
from elastic_ray.coordinator.allocations.answers import SchedulerAnswer, SharedAnswers
from elastic_ray.coordinator.allocations.jobs import SessionJobs
from elastic_ray.coordinator.allocations.pacing import SchedulerLooks, next_check_delay
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobInfo, JobState


def _info(job: str, state: JobState = JobState.RUNNING) -> JobInfo:
    return JobInfo(job_id=job, name="er-x", state=state, nodes=("n1", "n2"), start_time=1.5, user="alice",
                   comment="elastic-ray:s:t")


def _answer(asked_at: float, ids=("1", "2"), **jobs: JobState) -> SchedulerAnswer:
    listed = {job: _info(job, state) for job, state in (jobs or {"1": JobState.RUNNING}).items()}
    return SchedulerAnswer(job_name="er-x", user="alice", asked_at=asked_at, ids=frozenset(ids), jobs=listed)


class Asks:
    """An ``ask`` that counts its calls and stores what it answers, like ``SessionJobs`` does."""

    def __init__(self, shared: SharedAnswers, state: JobState = JobState.PENDING):
        self.shared = shared
        self.state = state
        self.calls = 0

    def __call__(self) -> SchedulerAnswer:
        self.calls += 1
        answer = _answer(time.time(), **{"1": self.state})
        self.shared.write(answer)
        return answer


# ------------------------------------------------------------------ the record

def test_an_answer_survives_its_round_trip():
    answer = _answer(100.0, **{"1": JobState.RUNNING, "2": JobState.PENDING})
    back = SchedulerAnswer.from_dict(json.loads(json.dumps(answer.to_dict())))
    assert back == answer
    assert back.jobs["1"].nodes == ("n1", "n2") and back.jobs["2"].state is JobState.PENDING


@pytest.mark.parametrize("change, field", [
    ({"protocol_version": 99}, "protocol_version"),
    ({"asked_at": "yesterday"}, "asked_at"),
    ({"ids": "1,2"}, "ids"),
    ({"jobs": {"1": {"job_id": "1", "name": "er-x", "state": "SLEEPING"}}}, "state"),
    ({"jobs": {"1": {"job_id": "7", "name": "er-x", "state": "RUNNING"}}}, "jobs.1"),
    ({"jobs": {"1": {"job_id": "1", "name": "er-x", "state": "RUNNING", "nodes": "n1"}}}, "nodes"),
])
def test_a_bad_field_is_named(change, field):
    data = {**_answer(1.0).to_dict(), **change}
    with pytest.raises(ValueError, match=field):
        SchedulerAnswer.from_dict(data)


def test_an_answer_serves_only_its_session_its_ids_and_its_age():
    answer = _answer(1000.0, ids=("1", "2"))
    assert answer.serves("er-x", "alice", ["1"], max_age=10, now=1005.0)
    assert not answer.serves("er-x", "alice", ["1"], max_age=10, now=1011.0)      # too old
    assert not answer.serves("er-x", "alice", ["3"], max_age=10, now=1005.0)      # never asked about 3
    assert not answer.serves("er-y", "alice", ["1"], max_age=10, now=1005.0)      # another session
    assert not answer.serves("er-x", "bob", ["1"], max_age=10, now=1005.0)        # another user
    assert not answer.serves("er-x", "alice", ["1"], max_age=10, now=900.0)       # from the future


# ------------------------------------------------------------------ the shared file

def test_a_fresh_answer_is_taken_without_asking(tmp_path):
    shared = SharedAnswers(tmp_path)
    shared.write(_answer(time.time()))
    ask = Asks(shared)
    answer, asked = shared.get("er-x", "alice", ["1"], 10.0, ask)
    assert (asked, ask.calls) == (False, 0)
    assert answer.jobs["1"].state is JobState.RUNNING


def test_a_stale_answer_means_asking_once_and_storing_it(tmp_path):
    shared = SharedAnswers(tmp_path)
    shared.write(_answer(time.time() - 60))
    ask = Asks(shared)
    answer, asked = shared.get("er-x", "alice", ["1"], 10.0, ask)
    assert (asked, ask.calls) == (True, 1)
    assert answer.jobs["1"].state is JobState.PENDING
    again, asked = shared.get("er-x", "alice", ["1"], 10.0, ask)
    assert (asked, ask.calls, again.jobs["1"].state) == (False, 1, JobState.PENDING)


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"protocol_version": 1}', b"[]",
                                     json.dumps({**_answer(0.0).to_dict(), "protocol_version": 2}).encode()])
def test_a_damaged_answer_file_is_ignored(tmp_path, content):
    shared = SharedAnswers(tmp_path)
    (tmp_path / "scheduler-answer.json").write_bytes(content)
    assert shared.read() is None
    ask = Asks(shared)
    _, asked = shared.get("er-x", "alice", ["1"], 3600.0, ask)
    assert (asked, ask.calls) == (True, 1)
    assert shared.read() is not None          # replaced by the fresh answer


def test_an_older_answer_never_overwrites_a_newer_one(tmp_path):
    shared = SharedAnswers(tmp_path)
    shared.write(_answer(200.0))
    shared.write(_answer(100.0, **{"1": JobState.FAILED}))
    assert shared.read().asked_at == 200.0


def test_forget_makes_the_next_watcher_ask(tmp_path):
    shared = SharedAnswers(tmp_path)
    shared.write(_answer(time.time()))
    shared.forget()
    shared.forget()   # twice is fine
    ask = Asks(shared)
    assert shared.get("er-x", "alice", ["1"], 10.0, ask)[1] is True


def _one_process(directory: str, start: float, out: str) -> None:
    """A process of the run: wait for a common start, then want an answer at most 10 s old."""
    shared = SharedAnswers(Path(directory))

    def ask() -> SchedulerAnswer:
        with open(out, "a") as f:
            f.write("asked\n")
        time.sleep(0.5)   # a slow squeue: the others must wait for it, not ask too
        answer = _answer(time.time())
        shared.write(answer)
        return answer

    while time.time() < start:
        time.sleep(0.005)
    answer, _ = shared.get("er-x", "alice", ["1"], 10.0, ask)
    with open(out, "a") as f:
        f.write(f"got {answer.jobs['1'].state.value}\n")


def test_of_many_processes_wanting_a_fresh_answer_only_one_asks(tmp_path):
    out = tmp_path / "log.txt"
    ctx = multiprocessing.get_context("spawn")
    start = time.time() + 2.0
    procs = [ctx.Process(target=_one_process, args=(str(tmp_path), start, str(out))) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = out.read_text().splitlines()
    assert lines.count("asked") == 1
    assert lines.count("got RUNNING") == 6


# ------------------------------------------------------------------ through SessionJobs

class CountingScheduler:
    kind = "local"
    user = "alice"

    def __init__(self):
        self.calls = 0
        self.asked: list[list[str]] = []

    def query(self, job_name, job_ids=(), *, user=None):
        self.calls += 1
        self.asked.append(list(job_ids))
        return {job: _info(job, JobState.PENDING) for job in job_ids}


def _jobs(tmp_path: Path, scheduler) -> tuple[SessionJobs, SessionJobs]:
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name="er-x", created_at=time.time(),
                       scheduler={"kind": "local"}, head={"partition": "cpu"}, launcher=RayLauncher().to_dict(),
                       user="alice")
    directory = SessionDir.create(tmp_path / "s", info)
    return SessionJobs(directory, scheduler, info), SessionJobs(SessionDir.open(directory.path), scheduler, info)


def test_two_holders_of_a_session_share_one_query(tmp_path):
    sched = CountingScheduler()
    first, second = _jobs(tmp_path, sched)
    assert first.known("5", max_age=10.0).state is JobState.PENDING
    assert second.known("5", max_age=10.0).state is JobState.PENDING
    assert sched.calls == 1
    second.listing(["5"])          # max_age 0: a decision that acts asks the scheduler itself
    assert sched.calls == 2
    assert first.last_answer is not None and first.last_answer.age(time.time()) < 10


def test_switched_off_every_watcher_asks(tmp_path, monkeypatch):
    monkeypatch.setenv(answers.ENV_SWITCH, "0")
    sched = CountingScheduler()
    first, second = _jobs(tmp_path, sched)
    first.known("5", max_age=10.0)
    second.known("5", max_age=10.0)
    assert sched.calls == 2
    assert pacing.watch_max_age(10.0) == 0.0


# ------------------------------------------------------------------ the pace of a wait

def test_a_pending_job_is_looked_at_less_and_less_often_up_to_30_s():
    delays, previous = [], None
    for _ in range(7):
        previous = next_check_delay(JobState.PENDING, previous)
        delays.append(previous)
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


@pytest.mark.parametrize("state", [JobState.RUNNING, JobState.COMPLETING, None])
def test_a_running_or_unknown_job_is_looked_at_every_10_s(state):
    assert next_check_delay(state, None) == 10.0
    assert next_check_delay(state, 30.0) == 10.0


def test_a_wait_looks_at_the_scheduler_at_its_pace_and_restarts_it_for_another_job():
    now = [0.0]
    seen: list[tuple[str, float, float]] = []

    def look(job: str, max_age: float) -> JobInfo:
        seen.append((job, now[0], max_age))
        return _info(job, JobState.PENDING)

    looks = SchedulerLooks(look, clock=lambda: now[0])
    for _ in range(70):               # a wait reading its files every 0.5 s for 35 s
        assert looks.info("1").state is JobState.PENDING
        now[0] += 0.5
    assert [t for _, t, _ in seen] == [0.0, 2.0, 6.0, 14.0, 30.0]
    assert {age for _, _, age in seen} == {pacing.WATCH_MAX_AGE}
    looks.info("2")                    # the head pointer moved: look at the new job at once
    assert seen[-1][:2] == ("2", 35.0)
