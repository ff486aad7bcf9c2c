"""The waits that used to ask the scheduler every half second (issue 11).

A failover's wait for a healthy head, its wait for a successor, and a
removal's wait for the end of its allocation now watch the fast path (the
heartbeat, ``head.json``, the agents' node files) every poll and ask the
scheduler at a pace; acting (an election) still asks it afresh. And a
failure seen in one shared answer by two processes at once is recorded and
acted on once.
"""

from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from types import SimpleNamespace
from dataclasses import replace

import pytest

from elastic_ray.coordinator.head import failover as failover_mod
from elastic_ray.coordinator.allocations import failures as fl
from elastic_ray.coordinator.allocations import pacing
from elastic_ray.coordinator.allocations.answers import SchedulerAnswer, SharedAnswers
from elastic_ray.coordinator.head.claims import ClaimOutcome, election_claim
from elastic_ray.coordinator.head.election import HeadCondition
from elastic_ray.coordinator.head.failover import Failover
from elastic_ray.coordinator.head.headwatch import HeadObservation
from elastic_ray.coordinator.allocations.pacing import (
    FailoverStep,
    SchedulerLooks,
    SessionLooks,
    failover_step,
)
from elastic_ray.coordinator.allocations.removal import agents_ended, removal_outcome
from elastic_ray.coordinator.head import election
from elastic_ray.protocol.disk.records import (
    AgentState,
    AllocationRecord,
    NodeState,
    SessionInfo,
    WorkerRecord,
)
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobInfo, JobState


def _info(job: str, state: JobState) -> JobInfo:
    return JobInfo(job_id=job, name="er-x", state=state)


# ================================================================ failover_step: every case

@pytest.mark.parametrize("condition", list(HeadCondition))
@pytest.mark.parametrize("alive", [True, False])
@pytest.mark.parametrize("may_ask", [True, False])
def test_failover_step_for_every_condition(condition, alive, may_ask):
    step = failover_step(condition, heartbeat_alive=alive, may_ask=may_ask)
    if condition is HeadCondition.HEALTHY:
        # Handed out on a fresh answer (one per call): a head cancelled a moment ago still answers.
        assert step is (FailoverStep.LOOK_NOW if may_ask else FailoverStep.RETURN)
    elif condition.needs_election:
        # Always to the claim: its holder asks afresh before acting; the others ask nothing.
        assert step is FailoverStep.ELECT
    elif alive and may_ask:
        # Ray answers but the answer says QUEUED/STARTING/...: the answer is behind.
        assert step is FailoverStep.LOOK_NOW
    else:
        assert step is FailoverStep.WAIT


# ================================================================ the paces

def test_a_removal_looks_soon_then_less_often_up_to_10_s():
    delays, previous = [], None
    for state in [JobState.RUNNING, JobState.COMPLETING, None, JobState.PENDING, JobState.RUNNING,
                  JobState.RUNNING, JobState.RUNNING]:
        previous = pacing.removal_check_delay(state, previous)
        delays.append(previous)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


@pytest.mark.parametrize("max_age, delay, expected", [
    (10.0, None, 10.0), (10.0, 2.0, 10.0), (0.0, 8.0, 0.0),   # a number is taken as it is
    (None, None, 0.0), (None, 0.5, 0.5), (None, 8.0, 8.0), (None, 30.0, pacing.WATCH_MAX_AGE),
])
def test_look_max_age(max_age, delay, expected):
    assert pacing.look_max_age(max_age, delay) == expected


def test_a_removal_wait_first_asks_afresh_then_accepts_answers_as_old_as_its_pace():
    now = [0.0]
    seen: list[tuple[float, float]] = []

    def look(job: str, max_age: float) -> JobInfo:
        seen.append((now[0], max_age))
        return _info(job, JobState.RUNNING)

    looks = SchedulerLooks(look, clock=lambda: now[0], pace=pacing.removal_check_delay, max_age=None)
    for _ in range(80):            # reading the node files every 0.5 s for 40 s
        looks.info("7")
        now[0] += 0.5
    assert [t for t, _ in seen] == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 25.5, 35.5]
    assert [a for _, a in seen] == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_a_supervisor_asks_itself_at_its_first_check_and_every_fifth_and_shares_between(monkeypatch):
    ages = [pacing.supervisor_max_age(n) for n in range(11)]
    assert ages == [0.0] + [pacing.WATCH_MAX_AGE] * 4 + [0.0] + [pacing.WATCH_MAX_AGE] * 4 + [0.0]
    monkeypatch.setenv("ELASTIC_RAY_SHARED_ANSWERS", "0")
    assert {pacing.supervisor_max_age(n) for n in range(11)} == {0.0}


class _Queries:
    """The session's ``query(max_age)``: counts fresh (0) and shared (> 0) looks."""

    def __init__(self, jobs):
        self.jobs = jobs
        self.calls: list[float] = []

    def __call__(self, max_age: float):
        self.calls.append(max_age)
        return dict(self.jobs)


def test_session_looks_pace_by_the_head_state_and_bound_fresh_asks():
    now = [0.0]
    q = _Queries({"5": _info("5", JobState.PENDING)})
    looks = SessionLooks(q, clock=lambda: now[0])
    for _ in range(70):
        looks.jobs("5")
        now[0] += 0.5
    assert q.calls == [pacing.WATCH_MAX_AGE] * 5            # at 0, 2, 6, 14 and 30 s
    assert looks.may_ask("5")
    looks.fresh("5")
    assert q.calls[-1] == 0.0 and not looks.may_ask("5")
    now[0] += pacing.ACTIVE_EVERY
    assert looks.may_ask("5")
    looks.fresh("5")
    assert not looks.may_ask("5")
    assert looks.may_ask("6"), "a new head: the fresh answer was about the old one"
    before = len(q.calls)
    looks.jobs("6")
    assert q.calls[before:] == [pacing.WATCH_MAX_AGE], "a new head is looked at at once"


def test_session_looks_switched_off_ask_every_time(monkeypatch):
    monkeypatch.setenv("ELASTIC_RAY_SHARED_ANSWERS", "0")
    q = _Queries({"5": _info("5", JobState.PENDING)})
    looks = SessionLooks(q, clock=lambda: 0.0)
    for _ in range(3):
        looks.jobs("5")
    assert q.calls == [0.0, 0.0, 0.0]


# ================================================================ Failover with a fake session

class _FakeSession:
    """Just what ``Failover.replace_head`` calls. ``phase`` moves the story on."""

    job_name = "er-x"

    def __init__(self, shared: dict, fresh: dict, claim_held: bool):
        self.shared, self.fresh = shared, fresh
        self.claim_held = claim_held
        self.rec = AllocationRecord(head_job="31")
        self.obs = HeadObservation("31", None, False, False, None)
        self.asked: list[float] = []
        self.claims = 0
        self.on_look = lambda looks: None
        self.looks = 0
        self.on_pointer_read = lambda reads: None
        self.pointer_reads = 0
        self.dir = self   # ``ray_head`` is the record's head here (a test may give a real SessionDir)

    def observe_head(self, wait=0.0):
        self.looks += 1
        self.on_look(self.looks)
        return self.obs

    def record(self):
        return self.rec

    def query(self, extra=None, max_age=0.0):
        self.asked.append(max_age)
        return dict(self.shared if max_age > 0 else self.fresh)

    def assess_head(self, rec, jobs, obs, now):
        alive = obs.alive and obs.job == rec.head_job
        return election.assess_head(rec, jobs, head_alive=alive, now=now)

    @contextmanager
    def election_claim(self, claimant):
        self.claims += 1
        yield ClaimOutcome(self.claim_held, self.rec)

    def read_head_endpoint(self, job):
        return SimpleNamespace(address="10.0.0.2:6379") if job == "32" and self.rec.head_job == "32" else None

    def read_ray_head(self):
        self.pointer_reads += 1
        self.on_pointer_read(self.pointer_reads)
        return self.rec.head_job


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(failover_mod, "POLL_INTERVAL", 0.01)


def test_a_caller_whose_claim_is_held_elsewhere_asks_the_scheduler_nothing_while_it_waits(quick):
    # Head 31 ended; another process holds the claim and elects 32.
    s = _FakeSession(shared={"31": _info("31", JobState.CANCELLED)},
                     fresh={"31": _info("31", JobState.CANCELLED), "32": _info("32", JobState.RUNNING)},
                     claim_held=False)

    def story(looks: int) -> None:
        if looks == 40:   # the other elector switched the head; it answers; the shared answer is behind
            s.rec = AllocationRecord(head_job="32", predecessors=("31",))
            s.obs = HeadObservation("32", "10.0.0.2:6379", True, False, 0.1)
            s.shared = {"31": _info("31", JobState.CANCELLED), "32": _info("32", JobState.PENDING)}

    s.on_look = story
    f = Failover(s)  # type: ignore[arg-type]
    f.elect = lambda *a, **k: pytest.fail("not the claim holder: must not elect")  # type: ignore[method-assign]
    assert f.replace_head(timeout=30, progress=None) == ("32", "10.0.0.2:6379")
    assert s.claims == 39
    # One shared look for the old head, one for the new; one fresh ask, because Ray answered
    # while the shared answer still said PENDING.
    assert s.asked == [pacing.WATCH_MAX_AGE, pacing.WATCH_MAX_AGE, 0.0]


def test_a_caller_waiting_on_anothers_election_takes_its_head_up_at_the_switch():
    """The payload loop's replace_head() while the session's supervisor
    elects: the pointer is watched closely (every POINTER_WATCH) between two
    looks, and a switch seen there is handed out at once (the elector
    switches only to a head it saw ready), not after a poll interval and the
    new head's first heartbeat."""
    s = _FakeSession(shared={"31": _info("31", JobState.CANCELLED)},
                     fresh={"31": _info("31", JobState.CANCELLED), "32": _info("32", JobState.RUNNING)},
                     claim_held=False)

    def switch(reads: int) -> None:
        if reads == 3:   # the other elector switches the head during our first wait
            s.rec = AllocationRecord(head_job="32", predecessors=("31",))
            s.obs = HeadObservation("32", "10.0.0.2:6379", True, False, 0.1)
            s.shared = s.fresh

    s.on_pointer_read = switch
    f = Failover(s)  # type: ignore[arg-type]
    f.elect = lambda *a, **k: pytest.fail("not the claim holder: must not elect")  # type: ignore[method-assign]
    assert failover_mod.POINTER_WATCH * 5 <= failover_mod.POLL_INTERVAL
    assert f.replace_head(timeout=30, progress=None) == ("32", "10.0.0.2:6379")
    assert (s.looks, s.claims, s.pointer_reads) == (1, 1, 3), "one look, then the switch seen at the 3rd read"


def test_an_election_acts_only_on_a_fresh_answer(quick):
    # The shared answer still says RUNNING; the heartbeat is gone; the scheduler now says CANCELLED.
    s = _FakeSession(shared={"31": _info("31", JobState.RUNNING)},
                     fresh={"31": _info("31", JobState.CANCELLED)}, claim_held=True)
    elected: list[dict] = []

    def elect(rec, jobs, progress, deadline):
        elected.append(dict(jobs))
        s.rec = AllocationRecord(head_job="32", predecessors=("31",))
        s.obs = HeadObservation("32", "10.0.0.2:6379", True, False, 0.1)
        s.shared = s.fresh = {"32": _info("32", JobState.RUNNING)}

    f = Failover(s)  # type: ignore[arg-type]
    f.elect = elect  # type: ignore[method-assign]
    assert f.replace_head(timeout=30, progress=None) == ("32", "10.0.0.2:6379")
    assert elected == [{"31": _info("31", JobState.CANCELLED)}]
    assert s.asked[:2] == [pacing.WATCH_MAX_AGE, 0.0]


def test_no_election_when_the_fresh_answer_clears_the_head(quick):
    # The shared answer says the head job ended; the fresh one says it runs and Ray answers again.
    s = _FakeSession(shared={"31": _info("31", JobState.CANCELLED)},
                     fresh={"31": _info("31", JobState.RUNNING)}, claim_held=True)
    s.obs = HeadObservation("31", "10.0.0.1:6379", True, False, 0.1)
    f = Failover(s)  # type: ignore[arg-type]
    f.elect = lambda *a, **k: pytest.fail("the fresh answer said the head is fine")  # type: ignore[method-assign]
    assert f.replace_head(timeout=30, progress=None) == ("31", "10.0.0.1:6379")
    assert s.asked == [pacing.WATCH_MAX_AGE, 0.0]


def test_a_head_cancelled_a_moment_ago_is_not_handed_out_on_a_shared_answer(quick):
    # Its Ray still answers, the shared answer still says RUNNING; the scheduler says CANCELLED.
    s = _FakeSession(shared={"31": _info("31", JobState.RUNNING)},
                     fresh={"31": _info("31", JobState.CANCELLED)}, claim_held=True)
    s.obs = HeadObservation("31", "10.0.0.1:6379", True, False, 0.1)
    elected: list[dict] = []

    def elect(rec, jobs, progress, deadline):
        elected.append(dict(jobs))
        s.rec = AllocationRecord(head_job="32", predecessors=("31",))
        s.obs = HeadObservation("32", "10.0.0.2:6379", True, False, 0.1)
        s.shared = s.fresh = {"32": _info("32", JobState.RUNNING)}

    f = Failover(s)  # type: ignore[arg-type]
    f.elect = elect  # type: ignore[method-assign]
    assert f.replace_head(timeout=30, progress=None) == ("32", "10.0.0.2:6379")
    assert elected == [{"31": _info("31", JobState.CANCELLED)}]
    # shared, fresh (to confirm: it ended, and the election acts on that one), then the new head: shared, fresh.
    assert s.asked == [pacing.WATCH_MAX_AGE, 0.0, pacing.WATCH_MAX_AGE, 0.0]


def test_no_head_no_worker_and_a_refused_submission_raise_at_once_naming_all_three(quick, tmp_path):
    """Issue 24: the head lost, the last worker allocation gone, and the
    scheduler refusing a new head allocation (its partition inactive):
    replace_head() raises, naming each, instead of waiting out its timeout."""
    from elastic_ray.config.launcher import RayLauncher
    from elastic_ray.errors import SchedulerError

    s = _FakeSession(shared={"31": _info("31", JobState.CANCELLED)}, fresh={"31": _info("31", JobState.CANCELLED)},
                     claim_held=True)
    s.dir = SessionDir.create(tmp_path / "sess", SessionInfo(
        session_id="s-1", job_name="er-x", created_at=1.0, scheduler={"kind": "slurm"},
        head={"partition": "cpu", "time_limit": "60"}))
    s.launcher = RayLauncher()
    refused = "sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)"

    def submit_head_allocation(update):
        raise SchedulerError(refused, argv=("sbatch",), returncode=1, stderr=refused)

    s.submit_head_allocation = submit_head_allocation
    import time
    t0 = time.monotonic()
    with pytest.raises(SchedulerError) as err:
        Failover(s).replace_head(timeout=60, progress=None)  # type: ignore[arg-type]
    assert time.monotonic() - t0 < 5.0, "raised at once, not at the timeout"
    text = str(err.value)
    assert "head 31 is CANCELLED" in text and "no successor and no worker allocation" in text
    assert "Required partition not available" in text and err.value.returncode == 1
    assert s.claims == 1
    # The run's event log keeps it, for `session status` and the history.
    from elastic_ray.protocol.disk import event_log
    from elastic_ray.protocol.disk.events import EventKind
    failed = [e for e in event_log.read(s.dir.path).events if e.kind is EventKind.ELECTION_FAILED]
    assert len(failed) == 1 and "head 31 is CANCELLED" in (failed[0].reason or "")
    assert "Required partition not available" in str(failed[0].details["refusal"])


@pytest.mark.parametrize("message, returncode, refused", [
    ("sbatch: error: Batch job submission failed: Required partition not available (inactive or drain)", 1, True),
    ("sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified",
     1, True),
    ("sbatch: error: Batch job submission failed: Unable to contact slurm controller (connect failure)", 1, False),
    ("sbatch: error: Batch job submission failed: Socket timed out on send/recv operation", 1, False),
    ("sbatch timed out after 30 s", None, False),          # no answer: not a refusal
    ("local scheduler: no partition 'gpu-z'", 1, False),  # another scheduler's wording: left as it is
])
def test_only_an_answered_submission_counts_as_refused(message, returncode, refused):
    from elastic_ray.coordinator.head.failover import refused_submission
    from elastic_ray.errors import SchedulerError
    assert refused_submission(SchedulerError(message, returncode=returncode, stderr=message)) is refused


def test_waiting_for_a_successor_reads_head_json_every_poll_and_asks_the_scheduler_at_its_pace(quick, tmp_path):
    directory = SessionDir.create(tmp_path / "sess", SessionInfo(
        session_id="s-1", job_name="er-x", created_at=1.0, scheduler={"kind": "local"},
        head={"partition": "cpu", "time_limit": "60"}))
    asked: list[float] = []

    class Waiting:
        dir = directory
        claim_period = 120.0
        job_name = "er-x"

        def job_info(self, job_id, unreachable_ok=False, max_age=0.0):
            assert unreachable_ok, "a watcher: a scheduler that does not answer must not end the wait"
            asked.append(max_age)
            return _info(job_id, JobState.PENDING)

    f = Failover(Waiting())  # type: ignore[arg-type]
    f.keep_claim = lambda: None  # type: ignore[method-assign]
    import time
    assert f.wait_head_ready("40", time.monotonic() + 1.0) is False   # still queued at the deadline
    assert asked == [pacing.WATCH_MAX_AGE], "a queued successor: next look after 2 s, not every poll"


# ================================================================ removal's decision

def _node(node: str, *, exited: bool, code: int | None) -> NodeState:
    return NodeState(session="s", job_id="7", node=node, node_ip="10.0.0.1", role="worker",
                     state=AgentState.RELEASED if exited else AgentState.DRAINING, since=1.0, max_restarts=3,
                     rejoin_timeout=60.0, started_at=1.0, updated_at=2.0, pid=10, control="tcp://x:1",
                     exited=exited, exit_code=code)


CLEAN, DRAINING, FAILED, NO_CODE = (dict(exited=True, code=0), dict(exited=False, code=None),
                                    dict(exited=True, code=1), dict(exited=True, code=None))


@pytest.mark.parametrize("nodes, published, ended", [
    (1, [CLEAN], True),
    (2, [CLEAN, CLEAN], True),
    (2, [CLEAN], False),              # the other node never published: it may still run
    (1, [], False),
    (1, [DRAINING], False),
    (2, [CLEAN, DRAINING], False),
    (1, [FAILED], False),             # not a clean end: the scheduler says how it ended
    (1, [NO_CODE], False),
    (0, [], False),
])
def test_agents_ended(nodes, published, ended):
    states = {f"n{i}": _node(f"n{i}", **p) for i, p in enumerate(published)}
    assert agents_ended(states, nodes) is ended


@pytest.mark.parametrize("state", list(JobState))
@pytest.mark.parametrize("clean", [True, False])
def test_removal_outcome_takes_the_schedulers_final_state_first_then_the_agents_end(state, clean):
    states = {"n0": _node("n0", **(CLEAN if clean else DRAINING))}
    outcome = removal_outcome(_info("7", state), states, 1)
    if state.is_final:
        assert outcome == state.value
    elif clean:
        assert outcome == "COMPLETED"
    else:
        assert outcome is None
    assert removal_outcome(None, states, 1) == ("COMPLETED" if clean else None)


# ================================================================ failures seen in one shared answer

def test_two_processes_reading_one_shared_answer_at_once_record_and_resubmit_once(tmp_path):
    info = SessionInfo(session_id="s" * 32, job_name="er-x", created_at=1.0, scheduler={"kind": "slurm"},
                       head={"partition": "cpu"})
    directory = SessionDir.create(tmp_path / "session", info)
    directory.update_allocation(lambda r: r.with_worker(WorkerRecord(
        job_id="21", config={"partition": "cpu"}, submitted_at=1.0, resubmit_on_failure=3)))
    SharedAnswers(directory.path).write(SchedulerAnswer(
        job_name="er-x", user="u", asked_at=__import__("time").time(), ids=frozenset({"21"}),
        jobs={"21": _info("21", JobState.NODE_FAIL)}))
    ids = itertools.count(30)
    submitted: list[str] = []
    lock = threading.Lock()
    told: list[list[str]] = [[], []]

    def resubmit(old: WorkerRecord) -> str:
        with lock:
            job = str(next(ids))
            submitted.append(job)
        directory.update_allocation(lambda r: fl.record_worker(r, replace(
            old, job_id=job, ended=None, replaced_by=None, replaces=old.job_id,
            resubmit_on_failure=old.resubmit_on_failure - 1)))
        return job

    watches = [fl.FailureWatch(directory, "er-x", resubmit=resubmit,
                               claim=lambda who: election_claim(directory, who, 120.0),
                               on_ended=lambda f, i=i: told[i].append(f.job_id)) for i in range(2)]
    start = threading.Barrier(2)

    def process(i: int) -> None:
        answer, _ = SharedAnswers(directory.path).get("er-x", "u", {"21"}, 10.0, lambda: pytest.fail("asked"))
        start.wait()
        for _ in range(3):   # later polls see the same shared answer again
            watches[i].observe(directory.read_allocation(), answer.jobs)

    threads = [threading.Thread(target=process, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    rec = directory.read_allocation()
    assert submitted == ["30"], "one failure, one replacement"
    assert rec.workers["21"].ended is not None and rec.workers["21"].ended.state == "NODE_FAIL"
    assert rec.workers["21"].replaced_by == "30" and rec.workers["30"].ended is None
    assert told == [["21"], ["21"]], "each Session object is told once"
