"""The election rules, as tables: every rule, every tie, every refusal.

The module under test is pure, so each case is a record, a scheduler answer
and the expected decision. A seeded random sweep at the end checks the
invariants the tables cannot enumerate.
"""

from __future__ import annotations

import random
from dataclasses import replace
from types import MappingProxyType

import pytest

from elastic_ray.coordinator.head.election import (
    DEFAULT_CLAIM_PERIOD,
    ChoiceKind,
    HeadCondition,
    HostOnWorker,
    SubmitNewHead,
    UsePublishedSuccessor,
    apply_new_head,
    assess_head,
    choose_head,
    claim,
    head_is_healthy,
    holds_claim,
    live_claim,
    live_workers,
    needs_election,
    record_head_failure,
    release,
    time_left_at,
)
from elastic_ray.coordinator.head.claims import election_claim
from elastic_ray.protocol.disk.records import AllocationRecord, ElectionClaim, SessionInfo, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobInfo, JobState

NOW = 1_700_000_000.0
R, P = JobState.RUNNING, JobState.PENDING
UNLIMITED = None
HOUR = 3600.0


def W(job: str, state: str = "submitted", failures: int = 0, drain_at: float | None = None) -> WorkerRecord:
    return WorkerRecord(job_id=job, config={"partition": "cpu"}, submitted_at=NOW - 100, state=state,
                        drain_requested_at=drain_at, head_failures=failures)


def J(job: str, state: JobState = R, left: float | None = HOUR, *, end: float | None = None) -> JobInfo:
    """A job; ``left`` as a time_left snapshot unless ``end`` gives the end time."""
    return JobInfo(job_id=job, name="er-test", state=state, nodes=(f"n{job}",) if state is R else (),
                   end_time=end, time_left=left if end is None else None)


def rec(*workers: WorkerRecord, head: str | None = "1", preds: tuple[str, ...] = (),
        successor: str | None = None, election: ElectionClaim | None = None) -> AllocationRecord:
    return AllocationRecord(generation=3, head_job=head, workers=MappingProxyType({w.job_id: w for w in workers}),
                            predecessors=preds, election=election, successor=successor)


def jobs(*infos: JobInfo) -> dict[str, JobInfo]:
    return {i.job_id: i for i in infos}


# ---------------------------------------------------------------- choose_head

CHOOSE = [
    # --- (1) the published successor
    pytest.param(rec(W("10"), successor="5"), jobs(J("1", JobState.FAILED), J("5"), J("10", left=UNLIMITED)),
                 True, UsePublishedSuccessor("5"), id="running-successor-beats-unlimited-worker"),
    pytest.param(rec(W("10"), successor="5"), jobs(J("5")), False,
                 UsePublishedSuccessor("5"), id="successor-needs-no-port-strategy"),
    pytest.param(rec(W("10"), successor="5"), jobs(J("5", P), J("10")), True,
                 HostOnWorker("10"), id="pending-successor-falls-through"),
    pytest.param(rec(W("10"), successor="5"), jobs(J("5", JobState.COMPLETING), J("10")), True,
                 HostOnWorker("10"), id="completing-successor-falls-through"),
    pytest.param(rec(W("10"), successor="5"), jobs(J("10")), True,
                 HostOnWorker("10"), id="unreported-successor-falls-through"),
    pytest.param(rec(W("10"), head="5", successor="5"), jobs(J("5"), J("10")), True,
                 HostOnWorker("10"), id="successor-that-is-the-head-falls-through"),
    pytest.param(rec(W("10"), head="6", preds=("5",), successor="5"), jobs(J("5"), J("10")), True,
                 HostOnWorker("10"), id="successor-that-was-head-falls-through"),
    pytest.param(rec(successor="5"), jobs(J("5", P)), True,
                 SubmitNewHead(), id="pending-successor-no-workers"),
    # --- (2) worker allocations: most time left
    pytest.param(rec(W("10"), W("11"), W("12")), jobs(J("10", left=600), J("11", left=7200), J("12", left=3600)),
                 True, HostOnWorker("11"), id="most-time-left-wins"),
    pytest.param(rec(W("10"), W("11")), jobs(J("10", left=10 * 24 * HOUR), J("11", left=UNLIMITED)),
                 True, HostOnWorker("11"), id="unlimited-beats-any-finite"),
    pytest.param(rec(W("12"), W("11")), jobs(J("11", left=UNLIMITED), J("12", left=UNLIMITED)),
                 True, HostOnWorker("11"), id="tie-unlimited-lowest-job-id"),
    pytest.param(rec(W("1000"), W("999")), jobs(J("999", left=HOUR), J("1000", left=HOUR)),
                 True, HostOnWorker("999"), id="tie-finite-lowest-job-id-numeric"),
    pytest.param(rec(W("10"), W("11")), jobs(J("10", left=5 * HOUR, end=NOW + HOUR), J("11", left=2 * HOUR)),
                 True, HostOnWorker("11"), id="end-time-preferred-over-snapshot"),
    pytest.param(rec(W("10"), W("11")), jobs(J("10", left=0.0), J("11", left=1.0)),
                 True, HostOnWorker("11"), id="zero-time-left-still-ranked"),
    pytest.param(rec(W("10")), jobs(J("10", left=0.0)),
                 True, HostOnWorker("10"), id="zero-time-left-still-eligible"),
    # --- skipped by the session's intent
    pytest.param(rec(W("10", "draining"), W("11")), jobs(J("10", left=UNLIMITED), J("11", left=60)),
                 True, HostOnWorker("11"), id="draining-skipped"),
    pytest.param(rec(W("10", drain_at=NOW - 5), W("11")), jobs(J("10", left=UNLIMITED), J("11", left=60)),
                 True, HostOnWorker("11"), id="drain-requested-skipped"),
    pytest.param(rec(W("10", "removed"), W("11")), jobs(J("10", left=UNLIMITED), J("11", left=60)),
                 True, HostOnWorker("11"), id="removed-skipped"),
    pytest.param(rec(W("10", "draining"), W("11", "removed")), jobs(J("10"), J("11")),
                 True, SubmitNewHead(), id="only-draining-or-removed"),
    # --- skipped by the scheduler's state
    *[pytest.param(rec(W("10"), W("11")), jobs(J("10", state, left=UNLIMITED), J("11", left=60)),
                   True, HostOnWorker("11"), id=f"{state.value.lower()}-worker-skipped")
      for state in JobState if state is not R],
    pytest.param(rec(W("10"), W("11")), jobs(J("11", left=60)),
                 True, HostOnWorker("11"), id="unreported-worker-skipped"),
    # --- head failures
    pytest.param(rec(W("10", failures=1), W("11")), jobs(J("10", left=UNLIMITED), J("11", left=600)),
                 True, HostOnWorker("11"), id="failed-once-deprioritised"),
    pytest.param(rec(W("10", failures=1), W("11", failures=1)), jobs(J("10", left=60), J("11", left=600)),
                 True, HostOnWorker("11"), id="failed-once-tier-by-time-left"),
    pytest.param(rec(W("10", failures=1), W("11", "draining")), jobs(J("10", left=60), J("11")),
                 True, HostOnWorker("10"), id="failed-once-chosen-when-alone"),
    pytest.param(rec(W("10", failures=2), W("11")), jobs(J("10", left=UNLIMITED), J("11", left=60)),
                 True, HostOnWorker("11"), id="failed-twice-skipped"),
    pytest.param(rec(W("10", failures=2), W("11", failures=3)), jobs(J("10"), J("11")),
                 True, SubmitNewHead(), id="only-failed-twice"),
    # --- port strategy
    pytest.param(rec(W("10")), jobs(J("10", left=UNLIMITED)), False,
                 SubmitNewHead(), id="fixed-port-strategy"),
    # --- never the head or a former head
    pytest.param(rec(W("10"), W("11"), head="10"), jobs(J("10", left=UNLIMITED), J("11", left=60)),
                 True, HostOnWorker("11"), id="current-head-never-chosen"),
    pytest.param(rec(W("10"), W("11"), head="12", preds=("1", "10")),
                 jobs(J("10", left=UNLIMITED), J("11", left=60)),
                 True, HostOnWorker("11"), id="predecessor-never-chosen"),
    pytest.param(rec(W("10"), head="10"), jobs(J("10")), True, SubmitNewHead(), id="only-the-head"),
    pytest.param(rec(W("10"), head="11", preds=("10",)), jobs(J("10")), True, SubmitNewHead(), id="only-a-predecessor"),
    # --- nothing at all
    pytest.param(rec(), jobs(), True, SubmitNewHead(), id="no-workers"),
    pytest.param(rec(head=None), jobs(), True, SubmitNewHead(), id="no-head-no-workers"),
]


@pytest.mark.parametrize("record, answer, can_host, expected", CHOOSE)
def test_choose_head(record, answer, can_host, expected):
    choice = choose_head(record, answer, can_host_on_worker=can_host, now=NOW)
    assert choice == expected
    assert choice.kind is expected.kind
    assert choice.why, "every decision explains itself"


def test_choice_kinds_and_job_ids():
    assert UsePublishedSuccessor("5").kind is ChoiceKind.USE_PUBLISHED_SUCCESSOR
    assert HostOnWorker("5").kind is ChoiceKind.HOST_ON_WORKER
    assert SubmitNewHead().kind is ChoiceKind.SUBMIT_NEW_HEAD
    assert SubmitNewHead().job_id is None
    # ``why`` is for people: it never changes what a decision is.
    assert HostOnWorker("5", why="a") == HostOnWorker("5", why="b")
    assert HostOnWorker("5") != UsePublishedSuccessor("5")


def test_why_names_what_was_passed_over():
    record = rec(W("10", "draining"), W("11", failures=2), W("12"), successor="5")
    choice = choose_head(record, jobs(J("5", P), J("10"), J("11"), J("12")), can_host_on_worker=True, now=NOW)
    assert choice == HostOnWorker("12")
    assert "5 is PENDING" in choice.why
    assert "draining" in choice.why and "failed 2 times" in choice.why
    fixed = choose_head(record, jobs(J("12")), can_host_on_worker=False, now=NOW)
    assert "fixed" in fixed.why


def test_choice_ignores_insertion_order():
    """Every process must elect the same worker, however its dict was built."""
    workers = [W(str(j)) for j in range(100, 140)]
    answer = jobs(*(J(str(j), left=UNLIMITED if j % 7 == 0 else 600) for j in range(100, 140)))
    rnd = random.Random(3)
    first = choose_head(rec(*workers), answer, can_host_on_worker=True, now=NOW)
    for _ in range(10):
        rnd.shuffle(workers)
        assert choose_head(rec(*workers), answer, can_host_on_worker=True, now=NOW) == first == HostOnWorker("105")


@pytest.mark.parametrize("info, expected", [
    (J("1", left=HOUR), HOUR),
    (J("1", left=UNLIMITED), None),
    (J("1", left=HOUR, end=NOW + 60), 60.0),
    (J("1", left=None, end=NOW - 60), 0.0),
    (J("1", left=-5.0), 0.0),
    (J("1", left=None, end=float("inf")), None),
])
def test_time_left_at(info, expected):
    assert time_left_at(info, NOW) == expected


# ---------------------------------------------------------------- the head's health

HEAD_WORKER = W("1")

ASSESS = [
    # (record, answer, kwargs, expected condition)
    pytest.param(rec(head=None), jobs(), {}, HeadCondition.NO_HEAD, id="no-head"),
    pytest.param(rec(), jobs(), {}, HeadCondition.UNREPORTED, id="head-unreported"),
    *[pytest.param(rec(), jobs(J("1", state)), {}, HeadCondition.JOB_ENDED, id=f"head-{state.value.lower()}")
      for state in JobState if state.is_final],
    pytest.param(rec(), jobs(J("1", JobState.COMPLETING)), {}, HeadCondition.JOB_ENDED, id="head-completing"),
    pytest.param(rec(), jobs(J("1", P)), {"head_alive": False}, HeadCondition.QUEUED, id="head-pending"),
    pytest.param(rec(), jobs(J("1", JobState.SUSPENDED)), {"head_alive": False},
                 HeadCondition.SUSPENDED, id="head-suspended"),
    pytest.param(rec(), jobs(J("1")), {}, HeadCondition.HEALTHY, id="healthy"),
    pytest.param(rec(), jobs(J("1")), {"head_alive": False}, HeadCondition.RAY_STOPPED, id="ray-stopped"),
    pytest.param(rec(), jobs(J("1")), {"head_alive": False, "head_starting": True},
                 HeadCondition.STARTING, id="ray-starting"),
    pytest.param(rec(), jobs(J("1")), {"head_starting": True}, HeadCondition.HEALTHY, id="started"),
    pytest.param(rec(), jobs(J("1")), {"head_draining": True}, HeadCondition.DRAINING, id="draining-signal"),
    pytest.param(rec(), jobs(J("1")), {"head_draining": True, "head_alive": False},
                 HeadCondition.RAY_STOPPED, id="stopped-beats-draining"),
    pytest.param(rec(), jobs(J("1", JobState.TIMEOUT)), {"head_draining": True},
                 HeadCondition.JOB_ENDED, id="ended-beats-draining"),
    pytest.param(rec(W("1", "draining")), jobs(J("1")), {}, HeadCondition.DRAINING, id="worker-head-draining"),
    pytest.param(rec(W("1", drain_at=NOW)), jobs(J("1")), {}, HeadCondition.DRAINING, id="worker-head-drain-requested"),
    pytest.param(rec(W("1", "removed")), jobs(J("1")), {}, HeadCondition.DRAINING, id="worker-head-removed"),
    pytest.param(rec(HEAD_WORKER), jobs(J("1")), {}, HeadCondition.HEALTHY, id="worker-head-healthy"),
    # Time left alone never elects: the head's agent drains itself ahead of
    # its walltime (or at its signal), and only that drain moves the head.
    pytest.param(rec(), jobs(J("1", left=300)), {}, HeadCondition.HEALTHY, id="five-minutes-left-no-election"),
    pytest.param(rec(), jobs(J("1", left=None, end=NOW + 299)), {}, HeadCondition.HEALTHY,
                 id="end-time-near-no-election"),
    pytest.param(rec(), jobs(J("1", left=301)), {}, HeadCondition.HEALTHY, id="walltime-far"),
    pytest.param(rec(), jobs(J("1", left=UNLIMITED)), {}, HeadCondition.HEALTHY, id="unlimited-head"),
    pytest.param(rec(), jobs(J("1", left=0.0)), {}, HeadCondition.HEALTHY, id="walltime-reached-still-serving"),
    pytest.param(rec(), jobs(J("1", left=60)), {"head_draining": True},
                 HeadCondition.DRAINING, id="walltime-near-and-draining"),
]

ELECTS = {HeadCondition.NO_HEAD, HeadCondition.JOB_ENDED, HeadCondition.RAY_STOPPED, HeadCondition.DRAINING}


@pytest.mark.parametrize("record, answer, kwargs, expected", ASSESS)
def test_assess_head(record, answer, kwargs, expected):
    kwargs = {"head_alive": True, **kwargs}
    verdict = assess_head(record, answer, now=NOW, **kwargs)
    assert verdict.condition is expected
    assert verdict.why
    assert verdict.needs_election is (expected in ELECTS)
    assert needs_election(record, answer, now=NOW, **kwargs) is verdict.needs_election
    assert verdict.condition.hand_over is (expected is HeadCondition.DRAINING)


@pytest.mark.parametrize("record, answer, alive, healthy", [
    (rec(), jobs(J("1")), True, True),
    (rec(), jobs(J("1")), False, False),
    (rec(), jobs(J("1", P)), True, False),
    (rec(), jobs(J("1", JobState.COMPLETING)), True, False),
    (rec(), jobs(J("1", JobState.SUSPENDED)), True, False),
    (rec(), jobs(J("1", JobState.ENDED_UNKNOWN)), True, False),
    (rec(), jobs(), True, False),
    (rec(head=None), jobs(J("1")), True, False),
    (rec(W("1", "draining")), jobs(J("1")), True, True),  # serves until the next head is up
])
def test_head_is_healthy(record, answer, alive, healthy):
    assert head_is_healthy(record, answer, alive) is healthy


# ---------------------------------------------------------------- claims

def test_claim_free_record():
    record = rec()
    claimed, ok = claim(record, "host-a:1", NOW)
    assert ok
    assert claimed.election == ElectionClaim("host-a:1", since=NOW, expires=NOW + DEFAULT_CLAIM_PERIOD)
    assert DEFAULT_CLAIM_PERIOD == 120.0  # the seed: a dead elector's claim blocks the next election for 2 minutes
    assert record.election is None, "records are immutable"
    assert replace(claimed, election=None) == record


def test_claim_refused_while_a_foreign_claim_lives():
    record = rec(election=ElectionClaim("host-a:1", since=NOW - 10, expires=NOW + 1))
    again, ok = claim(record, "host-b:2", NOW)
    assert not ok
    assert again is record, "a refusal must not write"
    assert live_claim(record, NOW).claimant == "host-a:1"


@pytest.mark.parametrize("expires", [NOW, NOW - 0.001, NOW - 3600])
def test_expired_claim_is_taken_over(expires):
    record = rec(election=ElectionClaim("dead-elector", since=expires - 120, expires=expires))
    assert live_claim(record, NOW) is None
    taken, ok = claim(record, "host-b:2", NOW, period=30)
    assert ok
    assert taken.election == ElectionClaim("host-b:2", since=NOW, expires=NOW + 30)


def test_own_claim_is_renewed_keeping_its_start():
    record = rec(election=ElectionClaim("host-a:1", since=NOW - 100, expires=NOW + 20))
    renewed, ok = claim(record, "host-a:1", NOW, period=120)
    assert ok
    assert renewed.election == ElectionClaim("host-a:1", since=NOW - 100, expires=NOW + 120)


def test_own_expired_claim_starts_afresh():
    record = rec(election=ElectionClaim("host-a:1", since=NOW - 300, expires=NOW - 180))
    renewed, ok = claim(record, "host-a:1", NOW)
    assert ok and renewed.election.since == NOW


def test_many_claimants_one_winner():
    """Processes serialised by the allocation lock: the first wins, the rest
    are refused until the claim is released or expires."""
    record = rec()
    winners = []
    for i in range(20):
        record, ok = claim(record, f"step-{i}", NOW + i)
        if ok:
            winners.append(f"step-{i}")
    assert winners == ["step-0"]
    record = release(record, "step-0")
    record, ok = claim(record, "step-7", NOW + 30)
    assert ok and record.election.claimant == "step-7"


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan")])
def test_claim_period_must_be_positive(bad):
    with pytest.raises(ValueError):
        claim(rec(), "a", NOW, period=bad)


def test_claimant_must_be_named():
    with pytest.raises(ValueError):
        claim(rec(), "", NOW)


def test_release():
    mine = rec(election=ElectionClaim("a", since=NOW, expires=NOW + 120))
    assert release(mine, "a").election is None
    assert release(mine, "b") is mine, "someone else's claim is left alone"
    expired_foreign = rec(election=ElectionClaim("a", since=NOW - 500, expires=NOW - 380))
    assert release(expired_foreign, "b") is expired_foreign
    free = rec()
    assert release(free, "a") is free


def test_holds_claim_says_who_won():
    record, _ = claim(rec(), "a", NOW)
    assert holds_claim(record, "a")
    assert not holds_claim(record, "b")
    assert not holds_claim(rec(), "a")
    # the record a loser gets back still names the winner
    refused, ok = claim(record, "b", NOW + 1)
    assert not ok and not holds_claim(refused, "b") and holds_claim(refused, "a")


# ---------------------------------------------------------------- the claim helper (a context manager)

@pytest.fixture
def session_dir(tmp_path) -> SessionDir:
    info = SessionInfo(session_id="s-1", job_name="er-test", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu", "time_limit": "60"})
    return SessionDir.create(tmp_path / "sess", info)


def test_claim_helper_takes_and_releases(session_dir):
    with election_claim(session_dir, "a", 120.0, clock=lambda: NOW) as outcome:
        assert outcome.held and outcome.holder is None
        held = session_dir.read_allocation().election
        assert held == ElectionClaim("a", since=NOW, expires=NOW + 120.0)
        assert outcome.record.election == held, "the record as the claim left it"
    assert session_dir.read_allocation().election is None


def test_claim_helper_releases_on_an_exception(session_dir):
    with pytest.raises(RuntimeError, match="elector failed"):
        with election_claim(session_dir, "a", 120.0, clock=lambda: NOW):
            raise RuntimeError("elector failed")
    assert session_dir.read_allocation().election is None


def test_claim_helper_reports_someone_elses_live_claim_and_leaves_it(session_dir):
    with election_claim(session_dir, "a", 60.0, clock=lambda: NOW):
        generation = session_dir.read_allocation().generation
        with election_claim(session_dir, "b", 60.0, clock=lambda: NOW + 10) as other:
            assert not other.held
            assert other.holder == ElectionClaim("a", since=NOW, expires=NOW + 60.0)
        after = session_dir.read_allocation()
        assert after.election == other.holder, "a loser never releases the winner's claim"
        assert after.generation == generation, "losing writes nothing"


def test_claim_helper_takes_over_an_expired_claim(session_dir):
    session_dir.update_allocation(lambda r: replace(r, election=ElectionClaim("dead", since=NOW - 300,
                                                                              expires=NOW - 180)))
    with election_claim(session_dir, "b", 120.0, clock=lambda: NOW) as outcome:
        assert outcome.held
        assert session_dir.read_allocation().election == ElectionClaim("b", since=NOW, expires=NOW + 120.0)
    assert session_dir.read_allocation().election is None


def test_claim_helper_refuses_a_bad_period_before_writing(session_dir):
    with pytest.raises(ValueError, match="period"):
        with election_claim(session_dir, "a", 0.0):
            pass
    assert session_dir.read_allocation().election is None


# ---------------------------------------------------------------- apply_new_head

def test_apply_new_head_on_worker():
    record = rec(W("10"), W("11"), head="1", preds=("0",), successor="7",
                 election=ElectionClaim("a", since=NOW, expires=NOW + 120))
    out = apply_new_head(record, "10", hosted_on_worker=True)
    assert out.head_job == "10"
    assert out.predecessors == ("0", "1")
    assert out.successor == "7", "another successor is left for the caller to handle"
    assert out.election is None
    assert out.workers == record.workers
    assert AllocationRecord.from_dict(out.to_dict()) == out


def test_apply_published_successor():
    record = rec(W("10"), head="1", successor="7", election=ElectionClaim("a", since=NOW, expires=NOW + 120))
    out = apply_new_head(record, "7", hosted_on_worker=False)
    assert (out.head_job, out.predecessors, out.successor, out.election) == ("7", ("1",), None, None)


@pytest.mark.parametrize("head, preds, expected", [
    (None, (), ()),
    ("1", (), ("1",)),
    ("1", ("1",), ("1",)),           # already there: no duplicate
    ("2", ("1",), ("1", "2")),
])
def test_apply_new_head_predecessors(head, preds, expected):
    assert apply_new_head(rec(head=head, preds=preds), "9", hosted_on_worker=False).predecessors == expected


def test_apply_same_head_again_is_idempotent():
    record = rec(head="9", preds=("1",))
    assert apply_new_head(record, "9", hosted_on_worker=False) is record
    claimed = replace(record, election=ElectionClaim("a", since=NOW, expires=NOW + 1))
    out = apply_new_head(claimed, "9", hosted_on_worker=False)
    assert out.election is None and out.predecessors == ("1",) and out.head_job == "9"


@pytest.mark.parametrize("record, job, on_worker", [
    (rec(W("10")), "11", True),           # not a worker of this session
    (rec(W("10")), "10", False),          # is a worker: must say so
    (rec(head="2", preds=("1",)), "1", False),  # former heads never return
    (rec(), "abc", False),                # not a job id
])
def test_apply_new_head_rejects(record, job, on_worker):
    with pytest.raises(ValueError):
        apply_new_head(record, job, hosted_on_worker=on_worker)


# ---------------------------------------------------------------- head failures

def test_record_head_failure_counts_and_excludes():
    record = rec(W("10"), W("11"))
    answer = jobs(J("10", left=UNLIMITED), J("11", left=60))
    assert choose_head(record, answer, can_host_on_worker=True, now=NOW) == HostOnWorker("10")
    once = record_head_failure(record, "10")
    assert once.workers["10"].head_failures == 1 and once.workers["11"].head_failures == 0
    assert record.workers["10"].head_failures == 0, "records are immutable"
    assert choose_head(once, answer, can_host_on_worker=True, now=NOW) == HostOnWorker("11")
    both = record_head_failure(once, "11")
    assert choose_head(both, answer, can_host_on_worker=True, now=NOW) == HostOnWorker("10")
    twice = record_head_failure(both, "10")
    assert twice.workers["10"].head_failures == 2
    assert choose_head(twice, answer, can_host_on_worker=True, now=NOW) == HostOnWorker("11")
    done = record_head_failure(twice, "11")
    assert choose_head(done, answer, can_host_on_worker=True, now=NOW) == SubmitNewHead()
    assert AllocationRecord.from_dict(done.to_dict()) == done


def test_record_head_failure_of_a_non_worker():
    with pytest.raises(ValueError):
        record_head_failure(rec(W("10")), "5")


# ---------------------------------------------------------------- live_workers

def test_live_workers():
    record = rec(
        W("1000"), W("999"), W("30", "draining"), W("31", "removed"), W("40"), W("41"), W("42"),
        W("43"), W("44"), W("45"), W("50"),
    )
    answer = jobs(J("1000", P), J("999"), J("30"), J("31"), J("40", JobState.COMPLETED),
                  J("41", JobState.ENDED_UNKNOWN), J("42", JobState.COMPLETING), J("43", JobState.SUSPENDED),
                  J("44", JobState.TIMEOUT), J("45", JobState.CANCELLED))
    live = live_workers(record, answer)
    assert [lw.job_id for lw in live] == ["30", "42", "43", "50", "999", "1000"]
    by_id = {lw.job_id: lw for lw in live}
    assert by_id["50"].info is None and by_id["50"].state is None, "unreported is kept"
    assert by_id["30"].draining and not by_id["999"].draining
    assert by_id["1000"].state is P and by_id["1000"].record is record.workers["1000"]
    assert live_workers(rec(), {}) == []


@pytest.mark.parametrize("state", list(JobState))
def test_live_workers_every_state(state):
    live = live_workers(rec(W("10")), jobs(J("10", state)))
    assert bool(live) is state.is_active


# ---------------------------------------------------------------- random sweep

STATES = list(JobState)


def _random_case(rnd: random.Random):
    n = rnd.choice([0, 1, 2, 3, 5, 8, 20])
    ids = rnd.sample(range(10, 200), n)
    workers, infos = [], []
    for job in map(str, ids):
        workers.append(W(job, rnd.choice(["submitted"] * 4 + ["draining", "removed"]),
                         failures=rnd.choice([0, 0, 0, 1, 1, 2, 3])))
        if rnd.random() < 0.9:
            state = R if rnd.random() < 0.6 else rnd.choice(STATES)
            # A few distinct values so that ties happen often.
            left = rnd.choice([UNLIMITED, 0.0, 60.0, 600.0, 600.0, HOUR, HOUR])
            infos.append(J(job, state, left=left, end=(NOW + left if left is not None and rnd.random() < 0.5 else None)))
    job_ids = [w.job_id for w in workers]
    head = rnd.choice(job_ids + ["1", None]) if job_ids else rnd.choice(["1", None])
    preds = tuple(j for j in job_ids if rnd.random() < 0.1 and j != head)
    successor = rnd.choice([None, None, "5", "6"])
    if successor is not None:
        infos.append(J(successor, rnd.choice([R, P, JobState.COMPLETED])))
    rnd.shuffle(workers)
    return rec(*workers, head=head, preds=preds, successor=successor), jobs(*infos), rnd.random() < 0.8


def _eligible(record, answer):
    out = []
    for w in record.workers.values():
        info = answer.get(w.job_id)
        if (info is not None and info.state is R and w.state == "submitted" and w.drain_requested_at is None
                and w.head_failures < 2 and w.job_id != record.head_job and w.job_id not in record.predecessors):
            out.append((w, info))
    return out


def _rank(left):
    return float("inf") if left is None else left


def test_random_records_keep_the_invariants():
    rnd = random.Random(20240917)
    kinds = {k: 0 for k in ChoiceKind}
    for case in range(500):
        record, answer, can_host = _random_case(rnd)
        choice = choose_head(record, answer, can_host_on_worker=can_host, now=NOW)
        kinds[choice.kind] += 1
        eligible = _eligible(record, answer)
        succ = record.successor
        succ_ok = (succ is not None and succ in answer and answer[succ].state is R
                   and succ != record.head_job and succ not in record.predecessors)
        ctx = f"case {case}: {record!r} {answer!r} -> {choice!r}"
        assert choice.why, ctx
        if succ_ok:
            assert choice == UsePublishedSuccessor(succ), ctx
            continue
        if not can_host or not eligible:
            assert choice == SubmitNewHead(), ctx
            continue
        assert isinstance(choice, HostOnWorker), ctx
        worker = record.workers[choice.job_id]
        info = answer[choice.job_id]
        assert info.state is R and worker.state == "submitted" and worker.head_failures < 2, ctx
        assert choice.job_id != record.head_job and choice.job_id not in record.predecessors, ctx
        tier = min(w.head_failures for w, _ in eligible)
        assert worker.head_failures == tier, f"a worker that never failed is tried first; {ctx}"
        mine = _rank(time_left_at(info, NOW))
        for other, other_info in eligible:
            if other.head_failures == tier:
                theirs = _rank(time_left_at(other_info, NOW))
                assert theirs <= mine, f"{other.job_id} has more time left; {ctx}"
                if theirs == mine:
                    assert int(choice.job_id) <= int(other.job_id), f"tie goes to the lowest id; {ctx}"
        # The same inputs give the same answer, whatever the dict order.
        shuffled = list(record.workers.values())
        rnd.shuffle(shuffled)
        again = replace(record, workers=MappingProxyType({w.job_id: w for w in shuffled}))
        assert choose_head(again, answer, can_host_on_worker=can_host, now=NOW) == choice, ctx
    assert all(kinds.values()), f"the sweep must reach every outcome: {kinds}"
