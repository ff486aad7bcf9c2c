"""Where the warm standby head goes (``coordinator.head.standby``), as tables.

The plan is pure: a record, a scheduler answer, the agents' published node
states and the launcher in; the allocation to place a standby on and those
to drop one from out. The keeper (its effect) is driven with a fake session
that records the requests it would send.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import SimpleNamespace

from contextlib import contextmanager
from types import MappingProxyType

from dataclasses import replace

import pytest

from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.head import standby
from elastic_ray.coordinator.head.standby import (
    RECHECK_SOON,
    StandbyKeeper,
    StandbyPlan,
    first_node,
    standby_plan,
)
from elastic_ray.errors import ConfigError
from elastic_ray.protocol.wire.channel import ControlError
from elastic_ray.protocol.disk.records import (
    AllocationRecord,
    ElectionClaim,
    HostedHead,
    HostedHeadState,
    WorkerRecord,
)
from elastic_ray.scheduler.base import JobInfo, JobState
from tests.helpers import node_state

NOW = 1_800_000_000.0
HOUR = 3600.0
ON = RayLauncher(standby_head=True)
R, P = JobState.RUNNING, JobState.PENDING
STARTING, STANDBY, READY, FAILED = (HostedHeadState.STARTING, HostedHeadState.STANDBY, HostedHeadState.READY,
                                    HostedHeadState.FAILED)


def W(job, state="submitted", failures=0, drain_at=None):
    return WorkerRecord(job_id=job, config={"partition": "cpu"}, submitted_at=NOW - 100, state=state,
                        drain_requested_at=drain_at, head_failures=failures)


def J(job, state=R, left=HOUR):
    return JobInfo(job_id=job, name="er-test", state=state, nodes=(f"n{job}",) if state is R else (),
                   time_left=left)


def rec(*workers, head="1", preds=(), successor=None, election=None):
    return AllocationRecord(generation=3, head_job=head, workers=MappingProxyType({w.job_id: w for w in workers}),
                            predecessors=preds, election=election, successor=successor)


def jobs(*infos):
    return {i.job_id: i for i in infos}


def first(job, hosted=None, state="JOINED", failed_ago=10.0, failures=None, **kw):
    """The published state of ``job``'s first node (its hosted head in ``hosted``, which began
    ``failed_ago`` seconds ago; ``failures``: a FAILED one's count in a row)."""
    return node_state(job, f"n{job}-0", state, node_index=0,
                      hosted_head=None if hosted is None else HostedHead(
                          hosted, NOW - failed_ago, address=None if hosted is FAILED else "10.0.0.9:6380",
                          reason="the head did not start; see the Ray log" if hosted is FAILED else None,
                          failures=failures),
                      control=f"tcp://10.0.0.{len(job)}:40{job}", **kw)


def nodes(*states, extra=()):
    """job -> node -> state, from first-node states (and ``extra`` jobs with none published)."""
    out = {job: {} for job in extra}
    for st in states:
        out.setdefault(st.job_id, {})[st.node] = st
    return out


def plan(record, answer, published, launcher=ON):
    return standby_plan(record, answer, published, launcher, NOW)


# ---------------------------------------------------------------- the table

CASES = [
    # --- nothing to do
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10")), RayLauncher(standby_head=False),
                 StandbyPlan(None), id="off"),
    pytest.param(rec(), jobs(J("1")), nodes(), ON, StandbyPlan(None), id="no-workers-separate-head"),
    pytest.param(rec(W("10"), head=None), jobs(J("10")), nodes(first("10")), ON, StandbyPlan(None),
                 id="no-head-yet"),
    pytest.param(rec(W("10"), W("11"), election=ElectionClaim("h:1:x", NOW - 1, NOW + 100)),
                 jobs(J("1"), J("10"), J("11")), nodes(first("10"), first("11", STANDBY)), ON, StandbyPlan(None),
                 id="election-in-progress-leaves-all-alone"),
    # --- one worker allocation, separate head
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10")), ON,
                 StandbyPlan("10", place_on="10", soon=True), id="one-worker-place"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", STANDBY)), ON,
                 StandbyPlan("10"), id="one-worker-already-standing"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", STARTING)), ON,
                 StandbyPlan("10", soon=True), id="one-worker-standby-starting"),
    # --- a standby that failed: tried again after 30 s x 2^(failures-1), at most 900 s
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", FAILED)), ON,
                 StandbyPlan("10", retry_at=NOW + 20), id="failed-by-an-older-agent-waits-30s"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", FAILED, failures=1, failed_ago=29.0)), ON,
                 StandbyPlan("10", retry_at=NOW + 1), id="failed-once-waits-30s"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", FAILED, failures=1, failed_ago=30.0)), ON,
                 StandbyPlan("10", place_on="10"), id="failed-once-placed-again-after-30s"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", FAILED, failures=3, failed_ago=100.0)), ON,
                 StandbyPlan("10", retry_at=NOW + 20), id="failed-3x-waits-120s"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", FAILED, failures=3, failed_ago=120.0)), ON,
                 StandbyPlan("10", place_on="10"), id="failed-3x-placed-again-after-120s"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", FAILED, failures=40, failed_ago=899.0)), ON,
                 StandbyPlan("10", retry_at=NOW + 1), id="failed-40x-waits-the-cap-900s"),
    pytest.param(rec(W("10"), W("11")), jobs(J("1"), J("10", left=7200), J("11", left=600)),
                 nodes(first("10", FAILED, failures=2, failed_ago=5.0), first("11", STANDBY)), ON,
                 StandbyPlan("10", drop_on=("11",), retry_at=NOW + 55), id="waiting-target-still-drops-others"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", state="STARTING")), ON,
                 StandbyPlan("10", soon=True), id="first-node-not-joined-yet"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", state="WAITING_FOR_HEAD")), ON,
                 StandbyPlan("10", soon=True), id="first-node-waiting-for-head"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(extra=("10",)), ON,
                 StandbyPlan("10", soon=True), id="no-agent-published-yet"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", STANDBY, exited=True)), ON,
                 StandbyPlan("10", soon=True), id="first-node-agent-exited"),
    pytest.param(rec(W("10")), jobs(J("1"), J("10", P)), nodes(), ON, StandbyPlan(None, soon=True), id="worker-pending"),
    pytest.param(rec(W("10", state="removed")), jobs(J("1"), J("10", P)), nodes(), ON, StandbyPlan(None),
                 id="removed-worker-pending-no-hurry"),
    pytest.param(rec(W("1"), head="1"), jobs(J("1", P)), nodes(), ON, StandbyPlan(None),
                 id="only-the-heads-own-allocation-pending-no-hurry"),
    # --- several, with different time left
    pytest.param(rec(W("10"), W("11"), W("12")), jobs(J("1"), J("10", left=600), J("11", left=7200), J("12")),
                 nodes(first("10"), first("11"), first("12")), ON,
                 StandbyPlan("11", place_on="11", soon=True), id="most-time-left-wins"),
    pytest.param(rec(W("10"), W("11")), jobs(J("1"), J("10", left=600), J("11", left=None)),
                 nodes(first("10"), first("11")), ON,
                 StandbyPlan("11", place_on="11", soon=True), id="unlimited-wins"),
    pytest.param(rec(W("10"), W("11"), W("12")), jobs(J("1"), J("10", left=600), J("11", left=7200), J("12")),
                 nodes(first("10", STANDBY), first("11"), first("12", STARTING)), ON,
                 StandbyPlan("11", place_on="11", drop_on=("10", "12"), soon=True), id="wrong-place-moved"),
    pytest.param(rec(W("10"), W("11")), jobs(J("1"), J("10", left=600), J("11", left=7200)),
                 nodes(first("10", STANDBY), first("11", STANDBY)), ON,
                 StandbyPlan("11", drop_on=("10",)), id="two-standbys-one-dropped"),
    pytest.param(rec(W("10"), W("11")), jobs(J("1"), J("10", left=600), J("11", left=7200)),
                 nodes(first("10", FAILED), first("11", STANDBY)), ON,
                 StandbyPlan("11"), id="a-failed-one-elsewhere-is-not-dropped"),
    pytest.param(rec(W("10"), W("11")), jobs(J("1"), J("10", left=600), J("11", left=7200)),
                 nodes(first("10", STANDBY), first("11", state="STARTING")), ON,
                 StandbyPlan("11", drop_on=("10",), soon=True), id="target-joining-old-one-dropped-already"),
    # --- draining and failed hosts
    pytest.param(rec(W("10"), W("11", state="draining")), jobs(J("1"), J("10", left=600), J("11", left=7200)),
                 nodes(first("10"), first("11", STANDBY)), ON,
                 StandbyPlan("10", place_on="10", drop_on=("11",), soon=True), id="draining-loses-its-standby"),
    pytest.param(rec(W("10"), W("11", drain_at=NOW - 5)), jobs(J("1"), J("10", left=600), J("11", left=7200)),
                 nodes(first("10"), first("11")), ON,
                 StandbyPlan("10", place_on="10", soon=True), id="drain-requested-counts"),
    pytest.param(rec(W("10", state="draining")), jobs(J("1"), J("10")), nodes(first("10", STANDBY)), ON,
                 StandbyPlan(None, drop_on=("10",)), id="only-worker-draining"),
    # a node file still saying STANDBY for a job that left RUNNING (its node cut off, the job
    # requeued or ending): its agents are gone with the standby, nobody to ask to drop it
    pytest.param(rec(W("10"), W("11")), jobs(J("1"), J("10", state=P), J("11")),
                 nodes(first("10", STANDBY), first("11", STANDBY)), ON,
                 StandbyPlan("11"), id="requeued-job-standby-not-dropped"),
    pytest.param(rec(W("10"), W("11")), jobs(J("1"), J("10", state=JobState.COMPLETING), J("11")),
                 nodes(first("10", STANDBY), first("11")), ON,
                 StandbyPlan("11", place_on="11", soon=True), id="ending-job-standby-not-dropped"),
    pytest.param(rec(W("10", failures=1), W("11")), jobs(J("1"), J("10", left=7200), J("11", left=600)),
                 nodes(first("10"), first("11")), ON,
                 StandbyPlan("11", place_on="11", soon=True), id="failed-host-tried-last"),
    pytest.param(rec(W("10", failures=1)), jobs(J("1"), J("10")), nodes(first("10")), ON,
                 StandbyPlan("10", place_on="10", soon=True), id="failed-once-still-eligible-alone"),
    pytest.param(rec(W("10", failures=2)), jobs(J("1"), J("10")), nodes(first("10", STANDBY)), ON,
                 StandbyPlan(None, drop_on=("10",)), id="failed-twice-never"),
    pytest.param(rec(W("10"), W("11"), preds=("11",)), jobs(J("1"), J("10", left=600), J("11", left=7200)),
                 nodes(first("10"), first("11", READY)), ON,
                 StandbyPlan("10", place_on="10", soon=True), id="former-head-skipped-its-ready-head-kept"),
    # --- the head hosted on a worker allocation
    pytest.param(rec(W("10"), W("11"), head="10"), jobs(J("10", left=7200), J("11", left=600)),
                 nodes(first("10", READY), first("11")), ON,
                 StandbyPlan("11", place_on="11", soon=True), id="hosted-head-standby-on-the-other"),
    pytest.param(rec(W("10"), head="10"), jobs(J("10")), nodes(first("10", READY)), ON,
                 StandbyPlan(None), id="hosted-head-alone"),
    pytest.param(rec(W("10"), head="10"), jobs(J("10")), nodes(first("10", STARTING)), ON,
                 StandbyPlan(None), id="the-heads-own-start-never-dropped"),
    pytest.param(rec(W("10"), W("11"), head="10"), jobs(J("10"), J("11")),
                 nodes(first("10", STANDBY), first("11", STANDBY)), ON,
                 StandbyPlan("11"), id="current-host-excluded"),
    # --- a successor
    pytest.param(rec(W("10"), successor="5"), jobs(J("1"), J("5"), J("10")), nodes(first("10", STANDBY)), ON,
                 StandbyPlan(None, drop_on=("10",)), id="successor-running-drops"),
    pytest.param(rec(W("10"), successor="5"), jobs(J("1"), J("5", P), J("10")), nodes(first("10")), ON,
                 StandbyPlan(None), id="successor-pending-no-standby"),
    pytest.param(rec(W("10"), successor="1"), jobs(J("1"), J("10")), nodes(first("10")), ON,
                 StandbyPlan("10", place_on="10", soon=True), id="successor-that-is-the-head-ignored"),
    pytest.param(rec(W("10"), head="2", preds=("1",), successor="1"), jobs(J("2"), J("10")), nodes(first("10")), ON,
                 StandbyPlan("10", place_on="10", soon=True), id="successor-that-was-head-ignored"),
]


@pytest.mark.parametrize("record, answer, published, launcher, expected", CASES)
def test_standby_plan(record, answer, published, launcher, expected):
    got = plan(record, answer, published, launcher)
    assert got == expected, got.why
    assert got.why


def test_the_plan_sits_on_the_elections_pick():
    """Whatever the plan targets is what choose_head would host on, if the head were lost now."""
    from elastic_ray.coordinator.head.election import HostOnWorker, choose_head
    for case in CASES:
        record, answer, published, launcher, expected = case.values
        got = plan(record, answer, published, launcher)
        if got.target is not None:
            assert choose_head(record, answer, can_host_on_worker=True, now=NOW) == HostOnWorker(got.target)


def test_a_fixed_port_launcher_cannot_keep_a_standby():
    with pytest.raises(ConfigError, match="standby_head"):
        RayLauncher(port_strategy="fixed", standby_head=True)
    with pytest.raises(ConfigError, match="standby_head=1: must be True, False or None"):
        RayLauncher(standby_head=1)
    assert RayLauncher.from_dict(ON.to_dict()) == ON and ON.to_dict()["standby_head"] is True
    assert RayLauncher(port_strategy="hash_jobid", standby_head=True).standby_head


@pytest.mark.parametrize("given, strategy, keeps", [
    (None, "random", True),        # the default launcher keeps a standby
    (None, "hash_jobid", True),
    (None, "fixed", False),        # a worker node cannot host a head: off, no error
    (False, "random", False),      # the user's off switch
    (True, "random", True),
])
def test_the_default_keeps_a_standby_where_a_worker_node_can_host_a_head(given, strategy, keeps):
    launcher = RayLauncher(port_strategy=strategy, standby_head=given)
    assert launcher.keeps_standby is keeps and launcher.standby_head is given
    # session.json keeps the field as given, and reading it back decides alike.
    assert RayLauncher.from_dict(launcher.to_dict()) == launcher
    assert RayLauncher().keeps_standby is True
    # A launcher changed with dataclasses.replace is checked again, without a trap in the default.
    assert replace(RayLauncher(), port_strategy="fixed").keeps_standby is False


def test_a_launcher_read_from_an_older_session_file_keeps_what_its_nodes_were_started_with():
    older = {k: v for k, v in RayLauncher().to_dict().items() if k not in ("standby_head", "network_keepalive_ms")}
    launcher = RayLauncher.from_dict(older)
    assert launcher.standby_head is False and launcher.keeps_standby is False
    assert launcher.network_keepalive_ms is None and launcher.keepalive_env() == {}
    assert RayLauncher.from_dict(RayLauncher().to_dict()) == RayLauncher()   # a new one: the new defaults


def test_first_node_is_the_running_agent_of_node_zero():
    zero, one = first("10"), node_state("10", "n10-1", node_index=1)
    assert first_node({"a": one, "b": zero}) == zero
    assert first_node({"a": one}) is None
    assert first_node({"b": first("10", exited=True)}) is None


# ---------------------------------------------------------------- the keeper (the effect)

class FakeClient:
    def __init__(self, session, endpoint):
        self.session, self.endpoint = session, endpoint

    def request(self, kind, body, timeout):
        self.session.sent.append((self.endpoint, kind, body))
        if self.session.fail:
            raise ControlError("no answer")
        return {"ok": True, "hosted_head": None}


class FakeSession:
    job_name = "er-test"

    def __init__(self, record, answer, published, launcher=ON):
        self.rec, self.answer, self.published, self.launcher = record, answer, published, launcher
        self.dir = SimpleNamespace(path=None)      # no event log (emit writes none); a test may give it one
        self.sent: list = []
        self.fail = False

    def record(self):
        return self.rec

    def query(self, extra=None, max_age=0.0):
        return self.answer

    def node_states(self, job_id):
        return dict(self.published.get(job_id, {}))

    @contextmanager
    def control(self, endpoint):
        yield FakeClient(self, endpoint)


def test_the_keeper_places_drops_and_looks_again_soon_while_on_its_way():
    s = FakeSession(rec(W("10"), W("11")), jobs(J("1"), J("10", left=600), J("11", left=7200)),
                    nodes(first("10", STANDBY), first("11")))
    s.dir.path = Path(tempfile.mkdtemp(prefix="standby-plan-"))
    k = StandbyKeeper(s, interval=30.0)
    assert k.due(NOW)
    got = k.apply(NOW)
    assert got == StandbyPlan("11", place_on="11", drop_on=("10",), soon=True)
    assert s.sent == [("tcp://10.0.0.2:4010", "drop_standby", {"job": "10"}),
                      ("tcp://10.0.0.2:4011", "standby_head", {"job": "11"})]
    assert k.next_at == NOW + RECHECK_SOON and not k.due(NOW + 1)
    placed = [(e.kind, e.job) for e in event_log.read(s.dir.path).events]
    shutil.rmtree(s.dir.path)
    assert placed == [(EventKind.STANDBY_PLACED, "11")]      # the history has the placing, not the drop


def test_the_keeper_once_settled_waits_for_the_next_check():
    s = FakeSession(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", STANDBY)))
    k = StandbyKeeper(s, interval=30.0)
    assert k.apply(NOW) == StandbyPlan("10") and s.sent == []
    assert k.next_at == NOW + 30.0


def test_an_allocation_added_by_the_supervising_process_brings_the_next_look_forward():
    """The keeper's first look (at create) finds no worker allocation and would wait for the
    supervisor's 30 s check; ``add_worker_allocation`` calls ``standby_soon``."""
    from elastic_ray.coordinator.head.supervise import HeadSupervisor

    s = FakeSession(rec(), jobs(J("1")), nodes())
    s.job_name = "er-test"
    k = StandbyKeeper(s, interval=30.0)
    assert k.apply(NOW) == StandbyPlan(None) and not k.due(NOW + 1)
    supervisor = HeadSupervisor(s, interval=30.0, standby=k)   # not started: no thread
    supervisor.standby_soon()
    assert k.due(NOW + 1)
    HeadSupervisor(s, interval=30.0, standby=None).standby_soon()   # no keeper: nothing to do


def test_a_request_that_fails_is_logged_and_tried_at_the_next_look():
    s = FakeSession(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10")))
    s.fail = True
    k = StandbyKeeper(s, interval=30.0)
    k.apply(NOW)
    k.apply(NOW + RECHECK_SOON)
    assert [kind for _, kind, _ in s.sent] == ["standby_head", "standby_head"]


def test_a_look_that_raises_is_not_repeated_at_once():
    s = FakeSession(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10")))
    s.record = lambda: (_ for _ in ()).throw(OSError("disk"))
    k = StandbyKeeper(s, interval=30.0)
    with pytest.raises(OSError):
        k.apply(NOW)
    assert not k.due(NOW + 1) and k.due(NOW + 30)


def test_only_a_standby_launcher_gets_a_keeper():
    assert standby.keeper(FakeSession(rec(), {}, {}, RayLauncher(standby_head=False)), 30.0) is None
    assert isinstance(standby.keeper(FakeSession(rec(), {}, {}), 30.0), StandbyKeeper)


def test_a_removed_allocation_still_running_loses_its_standby():
    """Removal records ``removed`` as soon as the drain is asked; its agents run on meanwhile."""
    s = FakeSession(rec(W("10", state="removed"), W("11")), jobs(J("1"), J("10", left=7200), J("11", left=600)),
                    nodes(first("10", STANDBY, state="DRAINING"), first("11")))
    got = StandbyKeeper(s, interval=30.0).apply(NOW)
    assert got == StandbyPlan("11", place_on="11", drop_on=("10",), soon=True)
    assert [(kind, body["job"]) for _, kind, body in s.sent] == [("drop_standby", "10"), ("standby_head", "11")]


@pytest.mark.parametrize("state, listed", [(R, True), (JobState.COMPLETING, True), (JobState.CANCELLED, False),
                                           (None, False)])
def test_agents_may_run_in_a_removed_allocation_while_its_job_is_active(state, listed):
    record = rec(W("10", state="removed"), W("11"), W("12", state="draining"))
    answer = jobs(J("11"), J("12"), *([J("10", state)] if state is not None else []))
    assert standby.agents_may_run(record, answer) == (["10", "11", "12"] if listed else ["11", "12"])


def test_retry_delays_grow_to_the_cap_and_a_start_that_came_up_resets_them():
    from elastic_ray.coordinator.head.standby_retry import FIRST, MAX, next_try_at, retry_delay
    assert [retry_delay(n) for n in range(0, 8)] == [0.0, 30.0, 60.0, 120.0, 240.0, 480.0, 900.0, 900.0]
    assert (FIRST, MAX) == (30.0, 900.0) and retry_delay(10_000) == MAX
    assert next_try_at(None) is None and next_try_at(HostedHead(STANDBY, NOW, address="a:1")) is None
    assert next_try_at(HostedHead(FAILED, NOW, failures=0)) == NOW + 30.0   # counted as one


def test_the_keeper_looks_again_when_a_failed_standby_s_wait_is_over():
    s = FakeSession(rec(W("10")), jobs(J("1"), J("10")), nodes(first("10", FAILED, failures=2, failed_ago=50.0)))
    k = StandbyKeeper(s, interval=30.0)
    got = k.apply(NOW)
    assert got == StandbyPlan("10", retry_at=NOW + 10) and s.sent == []
    assert "failed 2x in a row" in got.why and "next try in 10s" in got.why
    assert k.next_at == NOW + 10     # sooner than the 30 s check
    s.published = nodes(first("10", FAILED, failures=2, failed_ago=60.0))
    assert k.apply(NOW + 10) == StandbyPlan("10", place_on="10") and [kind for _, kind, _ in s.sent] == ["standby_head"]
