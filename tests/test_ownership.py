"""Which jobs are a session's, and what happens to those it lost track of: tables.

The module under test is pure (a record, one scheduler answer, a time), so
every rule is a row: a same-named job of another session is never the
session's; a marked job whose submission is in flight is left to its
submitter; a failed, abandoned or unknown submission's job is cancelled;
intents are forgotten once settled.
"""

from __future__ import annotations

from types import MappingProxyType

import pytest

from elastic_ray.coordinator.allocations.ownership import (
    IN_FLIGHT,
    WATCH,
    adopt_after_failure,
    is_in_flight,
    make_marker,
    marker_session,
    reconcile,
    session_jobs,
    teardown_targets,
)
from elastic_ray.protocol.disk.records import AllocationRecord, SubmissionIntent, WorkerRecord
from elastic_ray.scheduler.base import JobInfo, JobState

NOW = 1_700_000_000.0
SID, OTHER = "a" * 32, "b" * 32
R, P, C, CG = JobState.RUNNING, JobState.PENDING, JobState.CANCELLED, JobState.COMPLETING


def M(token: str, session: str = SID) -> str:
    return make_marker(session, token)


def J(job: str, state: JobState = R, comment: str = "") -> JobInfo:
    return JobInfo(job_id=job, name="er-same", state=state, comment=comment)


def I(token: str, age: float = 10.0, failed_ago: float | None = None) -> SubmissionIntent:  # noqa: E743
    return SubmissionIntent(marker=M(token), role="worker", config={"partition": "cpu"}, created_at=NOW - age,
                            failed_at=None if failed_ago is None else NOW - failed_ago,
                            error=None if failed_ago is None else "sbatch timed out")


def rec(workers: tuple[str, ...] = (), head: str | None = "1", intents: tuple[SubmissionIntent, ...] = (),
        preds: tuple[str, ...] = (), successor: str | None = None) -> AllocationRecord:
    return AllocationRecord(
        head_job=head, predecessors=preds, successor=successor,
        workers=MappingProxyType({w: WorkerRecord(job_id=w, config={}, submitted_at=NOW) for w in workers}),
        intents=MappingProxyType({i.marker: i for i in intents}))


def listing(*jobs: JobInfo) -> dict[str, JobInfo]:
    return {j.job_id: j for j in jobs}


# ----------------------------------------------------------------- markers

def test_a_marker_names_its_session_and_nothing_else_parses():
    assert marker_session(make_marker(SID, "t1")) == SID
    for comment in ("", "(null)", "elastic-ray", f"elastic-ray:{SID}", "elastic-ray::t1", f"elastic-ray:{SID}:",
                    f"other:{SID}:t1", f"elastic-ray:{SID}:t1:extra", "my own comment"):
        assert marker_session(comment) is None, comment


def test_markers_are_safe_in_an_sbatch_directive():
    from elastic_ray.scheduler.render import _DIRECTIVE_UNSAFE

    assert not _DIRECTIVE_UNSAFE.search(make_marker(SID, "0123456789ab"))


# ----------------------------------------------------------------- the session's jobs

def test_a_same_named_job_the_session_did_not_record_is_not_its_own():
    listed = listing(J("1"), J("2"), J("3", comment=M("x", OTHER)), J("4"))
    assert set(session_jobs(listed, {"1", "2"})) == {"1", "2"}
    assert session_jobs(listed, set()) == {}


def test_recorded_jobs_cover_every_role():
    r = rec(workers=("5", "6"), head="7", preds=("2", "3"), successor="9")
    assert r.recorded_jobs == {"2", "3", "5", "6", "7", "9"}
    assert rec(head=None).recorded_jobs == frozenset()


# ----------------------------------------------------------------- reconcile, as a table

@pytest.mark.parametrize("case, record, listed, cancel, drop", [
    ("nothing marked: nothing to do",
     rec(("5",)), listing(J("1"), J("5"), J("8")), (), ()),
    ("another session's marked job, same name: never ours",
     rec(("5",)), listing(J("8", comment=M("t1", OTHER))), (), ()),
    ("an unmarked same-named job (another session, older version): never ours",
     rec(("5",)), listing(J("8")), (), ()),
    ("recorded and marked: ours, nothing to do",
     rec(("5",)), listing(J("5", comment=M("t1"))), (), ()),
    ("recorded while its intent lingers: the intent is settled",
     rec(("5",), intents=(I("t1"),)), listing(J("5", comment=M("t1"))), (), (M("t1"),)),
    ("in flight: listed before the submitter recorded it, left alone",
     rec(intents=(I("t1", age=5),)), listing(J("8", comment=M("t1"))), (), ()),
    ("in flight and pending: left alone",
     rec(intents=(I("t1", age=IN_FLIGHT - 1),)), listing(J("8", P, comment=M("t1"))), (), ()),
    ("submitter gone (in flight too long): cancelled, intent kept to watch",
     rec(intents=(I("t1", age=IN_FLIGHT + 1),)), listing(J("8", P, comment=M("t1"))), ("8",), ()),
    ("submission failed, job queued late: cancelled",
     rec(intents=(I("t1", age=90, failed_ago=30),)), listing(J("8", comment=M("t1"))), ("8",), ()),
    ("marked by this session but no intent at all: cancelled",
     rec(), listing(J("8", P, comment=M("zz"))), ("8",), ()),
    ("a stray that already ended: nothing to cancel",
     rec(), listing(J("8", C, comment=M("zz"))), (), ()),
    ("a stray still completing: cancelled again is harmless, so listed",
     rec(), listing(J("8", CG, comment=M("zz"))), ("8",), ()),
    ("a failed intent watched long enough: forgotten",
     rec(intents=(I("t1", age=WATCH + 100, failed_ago=WATCH + 1),)), listing(), (), (M("t1"),)),
    ("a failed intent still watched: kept",
     rec(intents=(I("t1", age=100, failed_ago=50),)), listing(), (), ()),
    ("an abandoned intent watched long enough: forgotten",
     rec(intents=(I("t1", age=IN_FLIGHT + WATCH + 1),)), listing(), (), (M("t1"),)),
    ("an abandoned intent still watched: kept",
     rec(intents=(I("t1", age=IN_FLIGHT + 1),)), listing(), (), ()),
    ("a predecessor or successor carrying our marker is recorded, not a stray",
     rec(preds=("3",), successor="9"), listing(J("3", comment=M("a")), J("9", P, comment=M("b"))), (), ()),
])
def test_reconcile(case, record, listed, cancel, drop):
    decision = reconcile(record, listed, SID, NOW)
    assert (decision.cancel, decision.drop) == (cancel, drop), case
    assert decision.acts == bool(cancel or drop)
    for key in (*cancel, *drop):
        assert (decision.why or {}).get(key), f"{case}: no reason given for {key}"


def test_reconcile_periods_are_parameters():
    record = rec(intents=(I("t1", age=20),))
    listed = listing(J("8", comment=M("t1")))
    assert reconcile(record, listed, SID, NOW).cancel == ()
    assert reconcile(record, listed, SID, NOW, in_flight=10).cancel == ("8",)
    assert reconcile(record, listed, SID, NOW, in_flight=10, watch=5).drop == (M("t1"),)


def test_in_flight_ends_with_a_failure_or_the_period():
    assert is_in_flight(I("t", age=1), NOW)
    assert not is_in_flight(I("t", age=1, failed_ago=0.5), NOW)
    assert not is_in_flight(I("t", age=IN_FLIGHT), NOW)


# ----------------------------------------------------------------- after a failed sbatch

@pytest.mark.parametrize("case, listed, adopt, cancel", [
    ("not queued", listing(J("5"), J("6", comment=M("other"))), None, ()),
    ("queued: adopted", listing(J("5"), J("7", P, comment=M("t1"))), "7", ()),
    ("queued and already ended: still adopted (it was submitted)", listing(J("7", C, comment=M("t1"))), "7", ()),
    ("queued twice (never expected): the first adopted, the other cancelled",
     listing(J("12", P, comment=M("t1")), J("7", P, comment=M("t1")), J("13", C, comment=M("t1"))), "7", ("12",)),
    ("another session's identical token does not count", listing(J("7", comment=M("t1", OTHER))), None, ()),
])
def test_adopt_after_failure(case, listed, adopt, cancel):
    assert adopt_after_failure(M("t1"), listed) == (adopt, cancel), case


# ----------------------------------------------------------------- teardown

def test_teardown_cancels_recorded_and_marked_jobs_only():
    record = rec(("5", "6"), head="4", preds=("2",), successor="9")
    listed = listing(J("2", C), J("4"), J("5", P), J("6", C), J("9", P), J("11", comment=M("t1")),
                     J("12", comment=M("t2", OTHER)), J("13"), J("14", C, comment=M("t3")))
    assert teardown_targets(record, listed, SID) == ("4", "5", "9", "11")


def test_teardown_of_a_session_with_nothing_active_cancels_nothing():
    assert teardown_targets(rec(("5",)), listing(J("5", C), J("1", C), J("8")), SID) == ()
