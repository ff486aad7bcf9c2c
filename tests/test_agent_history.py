"""Which of an agent's state changes are history: a table."""

from __future__ import annotations

import pytest

from elastic_ray.agent.history import AgentHistory, transition_kinds
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind as K
from elastic_ray.protocol.disk.records import AgentState as S


@pytest.mark.parametrize("previous, new, kinds", [
    (S.STARTING, S.JOINED, (K.NODE_JOINED,)),
    (S.FOLLOWING, S.JOINED, (K.NODE_JOINED,)),          # joined the new head
    (S.RESTART_BACKOFF, S.JOINED, (K.NODE_JOINED,)),    # joined again after Ray ended
    (S.JOINED, S.DRAINING, (K.DRAIN_REQUESTED,)),
    (S.DRAINING, S.LEFT, (K.DRAIN_FINISHED, K.NODE_LEFT)),
    (S.JOINED, S.LEFT, (K.NODE_LEFT,)),                 # shut down without a drain
    (S.WAITING_FOR_HEAD, S.RELEASED, (K.NODE_LEFT,)),
    (S.JOINED, S.FAILED, (K.NODE_LEFT,)),
    (S.DRAINING, S.FAILED, (K.NODE_LEFT,)),             # a drain that did not finish is no drain_finished
    (S.WAITING_FOR_HEAD, S.STARTING, ()),
    (S.JOINED, S.FOLLOWING, ()),
    (S.JOINED, S.RESTART_BACKOFF, ()),
    (S.JOINED, S.GAVE_UP, ()),
    (S.JOINED, S.JOINED, ()),
])
def test_the_state_changes_that_are_events(previous, new, kinds):
    assert transition_kinds(previous, new) == kinds


def test_an_agent_writes_node_left_once_whether_its_state_or_its_exit_says_it(tmp_path):
    history = AgentHistory(str(tmp_path), "7", "n1", "worker")
    history.started(123)
    history.transition(S.STARTING, S.JOINED, "raylet registered", head_job="3", ray_node_id="ab")
    history.transition(S.JOINED, S.DRAINING, "signal SIGTERM", head_job="3", ray_node_id="ab")
    history.transition(S.DRAINING, S.LEFT, "drained", head_job="3", ray_node_id="ab")
    history.exited(S.LEFT, "drained", 0)
    events = event_log.read(tmp_path).events
    assert [e.kind for e in events] == [K.STARTED, K.NODE_JOINED, K.DRAIN_REQUESTED, K.DRAIN_FINISHED, K.NODE_LEFT]
    assert all((e.job, e.node) == ("7", "n1") for e in events)
    assert events[1].details == {"ray_node_id": "ab", "head_job": "3", "hosted": False}
    assert events[-1].details == {"state": "LEFT", "exit_code": None}
    other = AgentHistory(str(tmp_path / "x"), "8", "n2", "worker")   # no directory: nothing raised
    other.exited(S.JOINED, "killed", -9)


# ---------------------------------------------------------------- the coordinator's pending events
from elastic_ray.coordinator.allocations.jobs import pending_news  # noqa: E402
from elastic_ray.scheduler.base import JobInfo, JobState  # noqa: E402


def _job(job: str, state: JobState, reason: str = "") -> JobInfo:
    return JobInfo(job_id=job, name="er-x", state=state, reason=reason)


P, R = JobState.PENDING, JobState.RUNNING


@pytest.mark.parametrize("previous, listed, seen, news, seen_after", [
    ({}, {"1": _job("1", P, "Resources")}, {}, [("1", "Resources")], {"1": "Resources"}),
    ({"1": _job("1", P, "Resources")}, {"1": _job("1", P, "Resources")}, {}, [], {"1": "Resources"}),
    ({"1": _job("1", P, "Resources")}, {"1": _job("1", P, "Priority")}, {}, [("1", "Priority")], {"1": "Priority"}),
    ({}, {"1": _job("1", P, "Priority")}, {"1": "Priority"}, [], {"1": "Priority"}),   # the stored answer was forgotten
    ({}, {"1": _job("1", P)}, {}, [("1", "pending")], {"1": "pending"}),              # no reason given
    ({}, {"1": _job("1", P, "None")}, {}, [], {"1": "None"}),                          # Slurm has not looked yet
    ({"1": _job("1", P, "None")}, {"1": _job("1", P, "Resources")}, {"1": "None"}, [("1", "Resources")],
     {"1": "Resources"}),
    ({"1": _job("1", P, "Resources")}, {"1": _job("1", R)}, {"1": "Resources"}, [], {}),
    ({"1": _job("1", R)}, {"1": _job("1", P, "BeginTime")}, {}, [("1", "BeginTime")], {"1": "BeginTime"}),  # requeued
    ({}, {"2": _job("2", P, "A"), "1": _job("1", P, "B")}, {}, [("1", "B"), ("2", "A")], {"1": "B", "2": "A"}),
])
def test_a_pending_reason_is_news_once(previous, listed, seen, news, seen_after):
    assert pending_news(previous, listed, seen) == news
    assert seen == seen_after
