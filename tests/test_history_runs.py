"""history/runs.build: the run's history from its events, whole, shuffled, and with lines lost."""

from __future__ import annotations

import random

import pytest

from elastic_ray.history.runs import (Allocation, Election, Ending, HeadChange, HeadPeriod, NodeInterval, PayloadRun,
                                      Role, build)
from tests.history_events import AGENT, NOW, T0, K, ev, scenario


def _nodes(history) -> list[NodeInterval]:
    return sorted(history.nodes, key=lambda n: (n.job, n.node, n.started_at or 0))


def test_the_scenario_reads_back_whole():
    history = build(scenario(), NOW)
    assert history.session_id == "s-1" and history.created_at == T0 and history.ended_at is None
    assert history.allocations == (
        Allocation("100", Role.HEAD, "cpu", 1, 0, T0, T0 + 30, T0 + 3600, Ending.FAILED, "NODE_FAIL", "ended unasked"),
        Allocation("101", Role.WORKER, "gpu", 2, 4, T0 + 120, T0 + 200),
        Allocation("102", Role.WORKER, "gpu-a", 1, 2, T0 + 300, T0 + 330, T0 + 1870, Ending.REMOVED, "CANCELLED",
                   "removed by the run"),
    )
    assert _nodes(history) == [
        # the head's node has no leave line: it left when its job failed
        NodeInterval("100", "cpu01", T0 + 30, T0 + 60, None, T0 + 3600),
        NodeInterval("101", "gpu01", T0 + 200, T0 + 240, None, NOW, open=True),
        NodeInterval("101", "gpu02", T0 + 200, T0 + 245, None, NOW, open=True),
        NodeInterval("102", "a01", T0 + 330, T0 + 360, T0 + 1800, T0 + 1860, "drained", "LEFT"),
    ]
    assert history.head_periods == (
        HeadPeriod("100", T0, T0 + 3600, HeadChange.FIRST),      # until its job failed, not the election's end
        HeadPeriod("101", T0 + 3620, NOW, HeadChange.ELECTED, open=True),
    )
    assert history.elections == (Election(T0 + 3605, T0 + 3620, "101", "100", "head lost"),)
    assert history.payloads == (PayloadRun("train", "r1", T0 + 400, T0 + 5000, True),)
    assert [a.live for a in history.allocations] == [False, True, False]


@pytest.mark.parametrize("seed", range(5))
def test_the_order_of_the_lines_does_not_matter(seed):
    events = scenario()
    shuffled = events[:]
    random.Random(seed).shuffle(shuffled)
    one, other = build(events, NOW), build(shuffled, NOW)
    assert one.allocations == other.allocations and _nodes(one) == _nodes(other)
    assert (one.head_periods, one.elections, one.payloads) == (other.head_periods, other.elections, other.payloads)


@pytest.mark.parametrize("lost", range(len(scenario()) + 1))
def test_a_log_that_lost_its_oldest_lines_still_builds(lost):
    """The bounded log drops its oldest file: every prefix may be gone."""
    history = build(scenario()[lost:], NOW)
    jobs = {a.job for a in history.allocations}
    assert jobs <= {"100", "101", "102"}
    for interval in history.nodes:
        assert interval.left_at is not None and interval.job in jobs
    for head in history.head_periods:
        assert head.until is not None


def test_what_a_lost_prefix_leaves_unknown():
    events = scenario()
    cut = next(i for i, e in enumerate(events) if e.kind is K.STARTED and e.node == "gpu01")
    history = build(events[cut:], NOW)        # 100's and 101's submissions are gone, 102's is there
    head = history.allocation("100")
    assert head is not None and head.role is None and head.partition is None and head.submitted_at is None
    assert head.ended_how is Ending.FAILED
    worker = history.allocation("101")
    assert worker is not None and worker.role is Role.WORKER and worker.gpus_per_node is None  # from its started line
    assert history.allocation("102").gpus_per_node == 2
    # the first head is known only as the election's previous head, from no known time
    assert history.head_periods[0] == HeadPeriod("100", None, T0 + 3600, HeadChange.EARLIER)
    assert history.head_periods[1].job == "101"


@pytest.mark.parametrize("details, nodes, gpus", [
    ({"nodes": "two", "gpus_per_node": -1}, None, None),
    ({"nodes": True, "gpus_per_node": 1.5}, None, None),
    ({"nodes": "3", "gpus_per_node": 8.0}, 3, 8),
    ({"nodes": None}, None, None),
    ({}, None, None),
])
def test_odd_details_read_as_unknown(details, nodes, gpus):
    history = build([ev(0, K.SUBMITTED, "7", role="worker", partition=5, **details)], T0 + 10)
    allocation = history.allocation("7")
    assert (allocation.nodes_requested, allocation.gpus_per_node) == (nodes, gpus)
    assert allocation.partition == "5"


@pytest.mark.parametrize("events", [
    [ev(0, K.SUBMITTED)], [ev(0, K.STARTED, "1")], [ev(0, K.NODE_LEFT, None, "n1")], [ev(0, K.ELECTION_WON)],
    [ev(0, K.HEAD_MOVED, previous="3")], [ev(0, K.PAYLOAD_FINISHED)], [ev(0, K.DRAIN_REQUESTED, "9")],
    [ev(5, K.NODE_LEFT, "1", "n1"), ev(0, K.STARTED, "1", "n1")], [ev(0, K.ELECTION_WON, "1", previous=4)],
    [ev(0, K.SESSION_ENDED), ev(1, K.STARTED, "1", "n1")], [ev(0, K.SUBMITTED, "1", role=3)],
])
def test_events_missing_what_they_should_carry_are_taken_calmly(events):
    build(events, T0 + 100)


def test_a_node_seen_only_leaving_has_no_start():
    history = build([ev(50, K.NODE_LEFT, "5", "n1", "released", by=AGENT, state="RELEASED")], T0 + 100)
    assert history.nodes == (NodeInterval("5", "n1", None, None, None, T0 + 50, "released", "RELEASED"),)
    assert history.allocation("5").started_at == T0 + 50       # the earliest sign of it


def test_a_node_that_leaves_and_starts_again_has_two_intervals():
    history = build([ev(0, K.STARTED, "5", "n1"), ev(10, K.NODE_LEFT, "5", "n1"), ev(20, K.STARTED, "5", "n1")],
                    T0 + 30)
    assert [(n.started_at, n.left_at, n.open) for n in history.nodes] == [(T0, T0 + 10, False),
                                                                           (T0 + 20, T0 + 30, True)]


def test_a_job_wide_drain_marks_every_node_still_there():
    history = build([ev(0, K.STARTED, "5", "n1"), ev(0, K.STARTED, "5", "n2"), ev(5, K.NODE_LEFT, "5", "n2"),
                     ev(10, K.DRAIN_REQUESTED, "5", reason="signal")], T0 + 20)
    assert [(n.node, n.draining_at) for n in history.nodes] == [("n1", T0 + 10), ("n2", None)]


def test_the_session_s_end_closes_what_is_open():
    history = build([ev(0, K.SUBMITTED, "1", role="head"), ev(1, K.STARTED, "1", "n1"),
                     ev(2, K.PAYLOAD_STARTED, name="p"), ev(100, K.SESSION_ENDED)], T0 + 500)
    assert history.ended_at == T0 + 100
    assert [(n.left_at, n.open) for n in history.nodes] == [(T0 + 100, False)]
    assert [(h.until, h.open) for h in history.head_periods] == [(T0 + 100, False)]
    assert [(p.finished_at, p.open) for p in history.payloads] == [(T0 + 100, False)]


def test_payloads_pair_by_run_id_and_keep_an_orphan_end():
    history = build([ev(0, K.PAYLOAD_STARTED, name="a", run_id="1"), ev(1, K.PAYLOAD_STARTED, name="a", run_id="2"),
                     ev(5, K.PAYLOAD_FINISHED, name="a", run_id="1", ok=False),
                     ev(6, K.PAYLOAD_FINISHED, name="b", run_id="9", ok="yes")], T0 + 10)
    assert history.payloads == (PayloadRun("a", "1", T0, T0 + 5, False), PayloadRun("a", "2", T0 + 1, T0 + 10, None,
                                                                                     open=True),
                                PayloadRun("b", "9", None, T0 + 6, None))


def test_heads_change_by_election_move_and_promotion():
    history = build([ev(0, K.SUBMITTED, "1", role="head"), ev(10, K.ELECTION_WON, "2", previous="1"),
                     ev(11, K.HEAD_MOVED, "2", previous="1"), ev(20, K.HEAD_MOVED, "3", previous="2"),
                     ev(30, K.STANDBY_PROMOTED, "4", previous="3")], T0 + 40)
    assert [(h.job, h.since, h.until, h.how, h.open) for h in history.head_periods] == [
        ("1", T0, T0 + 10, HeadChange.FIRST, False), ("2", T0 + 10, T0 + 20, HeadChange.ELECTED, False),
        ("3", T0 + 20, T0 + 30, HeadChange.MOVED, False), ("4", T0 + 30, T0 + 40, HeadChange.MOVED, True)]
    assert history.elections == (Election(None, T0 + 10, "2", "1"),)    # its start line is lost


def test_a_promoted_standby_is_the_election_s_head_whichever_line_comes_first():
    # failover.host_on_worker writes standby_promoted before the election's election_won.
    history = build([ev(0, K.SUBMITTED, "1", role="head"), ev(5, K.ELECTION_STARTED, previous="1"),
                     ev(6, K.STANDBY_PROMOTED, "2", previous="1"), ev(6.1, K.ELECTION_WON, "2", previous="1"),
                     ev(6.2, K.HEAD_MOVED, "2", previous="1")], T0 + 20)
    assert [(h.job, h.since, h.how) for h in history.head_periods] == [
        ("1", T0, HeadChange.FIRST), ("2", T0 + 6, HeadChange.ELECTED)]
    assert [(e.started_at, e.won_at, e.winner) for e in history.elections] == [(T0 + 5, T0 + 6.1, "2")]


def test_an_election_that_has_not_ended():
    history = build([ev(0, K.ELECTION_STARTED, reason="head lost", previous="1")], T0 + 5)
    assert history.elections == (Election(T0, None, None, "1", "head lost"),)


def test_no_events_is_an_empty_history():
    history = build([], T0)
    assert history.allocations == () and history.nodes == () and history.first_at is None


@pytest.mark.parametrize("seed", range(30))
def test_any_lines_may_be_missing(seed):
    """A writer can die before its line: drop lines anywhere, the history and its figures still come."""
    from elastic_ray.history.usage import usage

    rng = random.Random(seed)
    events = [e for e in scenario() if rng.random() > 0.4]
    history = build(events, NOW)
    figures = usage(history)
    assert figures.node_hours >= 0 and all(n.left_at is not None for n in history.nodes)
    assert all(h.until is not None and (h.since is None or h.until >= h.since) for h in history.head_periods)


def test_a_node_s_own_leave_line_after_its_allocation_ended_closes_the_same_stay():
    """The coordinator records a lost head's job `failed` when it sees it COMPLETING; the head's agent
    writes `node_left` a moment later. That is one stay, ended by the agent, not a second row."""
    from elastic_ray.history.runs import build
    from elastic_ray.protocol.disk.events import Event, EventKind as EK, EventSource as ES

    t0 = 1_796_000_000.0
    events = [Event(at=t0, kind=EK.SUBMITTED, by=ES.COORDINATOR, job="98", details={"role": "head"}),
              Event(at=t0 + 1, kind=EK.STARTED, by=ES.AGENT, job="98", node="cpu-1"),
              Event(at=t0 + 4, kind=EK.NODE_JOINED, by=ES.AGENT, job="98", node="cpu-1"),
              Event(at=t0 + 13.5, kind=EK.FAILED, by=ES.COORDINATOR, job="98", details={"state": "COMPLETING"}),
              Event(at=t0 + 16, kind=EK.NODE_LEFT, by=ES.AGENT, job="98", node="cpu-1", reason="head moved to 99",
                    details={"state": "LEFT"})]
    history = build(events, now=t0 + 30)
    (stay,) = history.nodes_of("98")
    assert (stay.started_at, stay.joined_at, stay.left_at) == (t0 + 1, t0 + 4, t0 + 16)
    assert (stay.left_reason, stay.left_state, stay.open) == ("head moved to 99", "LEFT", False)


def test_a_node_s_drain_line_after_its_allocation_ended_stays_in_the_same_stay():
    """scancel of a head: the coordinator may see COMPLETING before the head's agent writes the drain its
    SIGTERM began. The drain and the leave after it belong to the one stay whose start is known (a new
    stay without a start made the head's usage row `partial`: per-change red, 2026-12-02)."""
    from elastic_ray.history.runs import build
    from elastic_ray.history.usage import usage
    from elastic_ray.protocol.disk.events import Event, EventKind as EK, EventSource as ES

    t0 = 1_796_000_000.0
    events = [Event(at=t0, kind=EK.SUBMITTED, by=ES.COORDINATOR, job="98", details={"role": "head", "gpus_per_node": 0}),
              Event(at=t0 + 1, kind=EK.STARTED, by=ES.AGENT, job="98", node="cpu-1"),
              Event(at=t0 + 4, kind=EK.NODE_JOINED, by=ES.AGENT, job="98", node="cpu-1"),
              Event(at=t0 + 13.5, kind=EK.FAILED, by=ES.COORDINATOR, job="98", details={"state": "COMPLETING"}),
              Event(at=t0 + 13.6, kind=EK.DRAIN_REQUESTED, by=ES.AGENT, job="98", node="cpu-1",
                    reason="draining: SIGTERM (job COMPLETING)"),
              Event(at=t0 + 16, kind=EK.NODE_LEFT, by=ES.AGENT, job="98", node="cpu-1", reason="head moved to 99",
                    details={"state": "LEFT"})]
    history = build(events, now=t0 + 30)
    (stay,) = history.nodes_of("98")
    assert (stay.started_at, stay.joined_at, stay.draining_at, stay.left_at) == (t0 + 1, t0 + 4, t0 + 13.6, t0 + 16)
    row = usage(history).allocations[0]
    assert (row.nodes, row.partial) == (1, False) and row.node_hours == pytest.approx(15 / 3600)
