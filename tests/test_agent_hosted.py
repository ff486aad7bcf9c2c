"""The hosted head's machine, driven event by event without Ray.

Scenarios are (event, expected hosted state, expected action types), like
``test_agent_machine``: a worker agent hosting the run's head, its start,
failure and hand-over read as short scripts.
"""

from __future__ import annotations

import pytest

from elastic_ray.agent.head.hosted import (
    ENDING_GRACE,
    DropRequested,
    EndpointWritten,
    ExitWanted,
    Goal,
    Handover,
    HandoverTick,
    HostedKilled,
    HostedRayEnded,
    HostedStarted,
    HostedState,
    HostRequested,
    HostSettings,
    Hosting,
    KillHostedHead,
    KillStandby,
    Log,
    PromoteStandby,
    PublishStatus,
    Reply,
    StandbyRequested,
    StartHostedHead,
    StatusSoon,
    WriteEndpoint,
    heartbeat,
    may_serve,
    own_head_live_at_once,
    step,
    watched,
)
from elastic_ray.agent.machine import Exit, State

OWN = "20"
FIRST = HostSettings(own_job=OWN, role="worker", node_index=0, can_host=True, port_strategy="hash_jobid")
ADDR = "10.0.0.5:6379"


def run(script, h=None):
    """Feed events; check (hosted state, [action types]) after each one. Returns the record and last actions."""
    h = h or Hosting(FIRST)
    actions = []
    for event, want_state, want_actions in script:
        h, actions = step(h, event)
        assert h.state is want_state, (event, h)
        assert [type(a) for a in actions] == want_actions, (event, actions)
    return h, actions


def ready(t=0.0):
    """A record whose head is READY (started at t)."""
    h, _ = run([
        (HostRequested(t), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply]),
        (HostedStarted(t + 1, ADDR, up=True), HostedState.STARTING, [WriteEndpoint]),
        (EndpointWritten(t + 1.1, ADDR), HostedState.READY, [Log, StatusSoon]),
    ])
    return h


def reply(actions):
    return next(a.body for a in actions if isinstance(a, Reply))


def logs(actions):
    return [(a.event, dict(a.fields)) for a in actions if isinstance(a, Log)]


# ------------------------------------------------------------------ the request

@pytest.mark.parametrize("settings, error", [
    (HostSettings(OWN, "head", 0, True, "hash_jobid"), "only the first node of a worker allocation hosts a head"),
    (HostSettings(OWN, "worker", 1, True, "hash_jobid"), "only the first node of a worker allocation hosts a head"),
    (HostSettings(OWN, "worker", 0, False, "fixed"), "port_strategy 'fixed' cannot host a head"),
])
def test_a_node_that_may_not_host_refuses_and_changes_nothing(settings, error):
    h, actions = run([(HostRequested(1), None, [Reply])], Hosting(settings))
    assert reply(actions) == {"ok": False, "error": error}
    assert h.as_status() is None


def test_a_request_starts_the_head_and_answers_with_its_state():
    h, actions = run([(HostRequested(5), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply])])
    assert reply(actions) == {"ok": True, "hosted_head": {"state": "STARTING", "at": 5}}


def test_a_repeated_request_starts_nothing_more():
    h, actions = run([
        (HostRequested(5), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply]),
        (HostRequested(6), HostedState.STARTING, [Reply]),
    ])
    assert reply(actions) == {"ok": True, "hosted_head": {"state": "STARTING", "at": 5}}
    h, actions = step(ready(), HostRequested(9))
    assert [type(a) for a in actions] == [Reply]
    assert reply(actions) == {"ok": True, "hosted_head": {"state": "READY", "address": ADDR, "at": 1.1}}


def test_ready_only_after_the_endpoint_is_written():
    h, actions = run([
        (HostRequested(0), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply]),
        (HostedStarted(1, ADDR, up=True), HostedState.STARTING, [WriteEndpoint]),
        (EndpointWritten(2, ADDR), HostedState.READY, [Log, StatusSoon]),
    ])
    assert logs(actions) == [("hosted_head_ready", {"address": ADDR})]
    assert h.as_status() == {"state": "READY", "address": ADDR, "at": 2}


def test_a_head_that_did_not_start_is_killed_before_it_counts_as_failed():
    h, actions = run([
        (HostRequested(0), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply]),
        (HostedStarted(120, ADDR, up=False), HostedState.STARTING, [KillHostedHead]),
        (HostedKilled(121), HostedState.FAILED, [Log, StatusSoon]),
    ])
    assert logs(actions) == [("hosted_head_failed", {})]
    assert h.as_status() == {"state": "FAILED", "reason": "the head did not start; see the Ray log", "at": 121, "failures": 1}


def test_a_failed_head_may_be_asked_again():
    h, _ = run([
        (HostRequested(0), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply]),
        (HostedStarted(1, ADDR, up=False), HostedState.STARTING, [KillHostedHead]),
        (HostedKilled(2), HostedState.FAILED, [Log, StatusSoon]),
    ])
    h, actions = run([(HostRequested(3), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply])], h)
    assert reply(actions)["hosted_head"] == {"state": "STARTING", "at": 3}


def test_a_ready_head_whose_ray_ended_fails_and_says_so_at_once():
    h, actions = run([(HostedRayEnded(50), HostedState.FAILED, [Log, PublishStatus])], ready())
    assert h.as_status() == {"state": "FAILED", "reason": "the hosted head's Ray stopped", "at": 50, "failures": 1}


@pytest.mark.parametrize("event", [HostedStarted(1, ADDR, True), EndpointWritten(1, ADDR), HostedKilled(1),
                                   HostedRayEnded(1), HandoverTick(1, OWN)])
def test_outcomes_without_a_start_change_nothing(event):
    h, actions = step(Hosting(FIRST), event)
    assert h == Hosting(FIRST) and actions == []


def test_a_late_start_outcome_does_not_undo_a_ready_or_failed_head():
    h = ready()
    assert step(h, HostedStarted(5, ADDR, up=False)) == (h, [])
    failed, _ = step(h, HostedRayEnded(6))
    assert step(failed, EndpointWritten(7, ADDR)) == (failed, [])


# ------------------------------------------------------------------ the hand-over

def exit_wanted(now, pointer=OWN, hosting_node=True, drain_deadline=None, code=0):
    return ExitWanted(now, code, drain_deadline, hosting_node, pointer)


@pytest.mark.parametrize("h, event", [
    (Hosting(FIRST), exit_wanted(10)),                                  # never hosted
    (ready(), exit_wanted(10, pointer="21")),                           # the run's head is elsewhere
    (ready(), exit_wanted(10, pointer=None)),                           # no pointer
    (ready(), exit_wanted(10, hosting_node=False)),                     # the node is gone already
])
def test_an_agent_not_serving_the_runs_head_exits_at_once(h, event):
    h2, actions = step(h, event)
    assert actions == [Exit(0)] and h2.handover is None


def test_a_starting_or_failed_head_is_not_handed_over():
    starting, _ = step(Hosting(FIRST), HostRequested(0))
    assert step(starting, exit_wanted(10, code=3))[1] == [Exit(3)]
    failed, _ = step(ready(), HostedRayEnded(5))
    assert step(failed, exit_wanted(10))[1] == [Exit(0)]


def test_the_hand_over_waits_until_the_head_moved():
    h, actions = run([(exit_wanted(10, drain_deadline=100, code=0), HostedState.READY, [Log, PublishStatus])], ready())
    assert h.handover == Handover(0, 100)
    assert logs(actions) == [("hosted_head_handover", {"deadline_in": "90.0s"})]
    h, actions = run([
        (HandoverTick(20, OWN), HostedState.READY, []),
        (HandoverTick(21, None), HostedState.READY, []),     # a missing pointer is not a move
        (HandoverTick(22, "21"), HostedState.READY, [Log, Exit]),
    ], h)
    assert logs(actions) == [("hosted_head_handed_over", {"head_job": "21", "why": "head moved"})]
    assert actions[-1] == Exit(0) and h.handover is None


def test_without_a_drain_deadline_the_hand_over_gets_the_ending_grace():
    h, _ = step(ready(), exit_wanted(10, code=0))
    assert h.handover == Handover(0, 10 + ENDING_GRACE)
    h, actions = run([
        (HandoverTick(10 + ENDING_GRACE - 0.01, OWN), HostedState.READY, []),
        (HandoverTick(10 + ENDING_GRACE, OWN), HostedState.READY, [Log, Exit]),
    ], h)
    assert logs(actions)[0][1]["why"] == "deadline reached"


def test_the_hand_over_ends_when_the_hosted_head_fails():
    h, _ = step(ready(), exit_wanted(10, drain_deadline=100, code=0))
    h, actions = run([
        (HostedRayEnded(11), HostedState.FAILED, [Log, PublishStatus]),
        (HandoverTick(11, OWN), HostedState.FAILED, [Log, Exit]),
    ], h)
    assert logs(actions) == [("hosted_head_handed_over", {"head_job": OWN, "why": "hosted head failed"})]


def test_the_hand_over_keeps_the_exit_code():
    h, _ = step(ready(), exit_wanted(10, drain_deadline=100, code=1))
    assert step(h, HandoverTick(100, OWN))[1][-1] == Exit(1)


# ------------------------------------------------------------------ questions

def test_may_serve_needs_a_ready_head_and_its_node():
    assert may_serve(ready(), True)
    assert not may_serve(ready(), False)
    assert not may_serve(step(Hosting(FIRST), HostRequested(0))[0], True)


def test_the_hosting_agent_counts_its_own_ready_head_as_live_at_once():
    assert own_head_live_at_once(ready(), OWN, heard=False)
    assert not own_head_live_at_once(ready(), OWN, heard=True)          # a heartbeat came already
    assert not own_head_live_at_once(ready(), "21", heard=False)        # another head
    assert not own_head_live_at_once(step(Hosting(FIRST), HostRequested(0))[0], OWN, heard=False)


@pytest.mark.parametrize("node_state, draining", [
    (State.JOINED, False), (State.WAITING_FOR_HEAD, False), (State.DRAINING, True), (State.LEFT, True),
    (State.RELEASED, True),
])
def test_the_hosted_heartbeat_says_draining_once_the_allocation_leaves(node_state, draining):
    assert heartbeat(ready(), node_state) == (True, draining)


def test_the_hosted_heartbeat_says_draining_during_the_hand_over_and_not_ok_unless_ready():
    h, _ = step(ready(), exit_wanted(10, drain_deadline=100))
    assert heartbeat(h, State.JOINED) == (True, True)
    assert heartbeat(step(Hosting(FIRST), HostRequested(0))[0], State.JOINED) == (False, False)


# ------------------------------------------------------------------ the warm standby

def standby(t=0.0):
    """A record whose standby is up (started at t)."""
    h, _ = run([
        (StandbyRequested(t), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply]),
        (HostedStarted(t + 1, ADDR, up=True), HostedState.STANDBY, [Log, StatusSoon]),
    ])
    return h


def test_a_standby_starts_like_a_head_but_writes_no_endpoint():
    h, actions = run([(StandbyRequested(5), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply])])
    assert reply(actions) == {"ok": True, "hosted_head": {"state": "STARTING", "at": 5}} and h.goal is Goal.STANDBY
    h, actions = run([(HostedStarted(7, ADDR, up=True), HostedState.STANDBY, [Log, StatusSoon])], h)
    assert logs(actions) == [("standby_head_ready", {"address": ADDR})]
    assert h.as_status() == {"state": "STANDBY", "address": ADDR, "at": 7}
    assert not h.ready and not may_serve(h, True)


@pytest.mark.parametrize("settings, error", [
    (HostSettings(OWN, "head", 0, True, "hash_jobid"), "only the first node of a worker allocation hosts a head"),
    (HostSettings(OWN, "worker", 1, True, "random"), "only the first node of a worker allocation hosts a head"),
    (HostSettings(OWN, "worker", 0, False, "fixed"), "port_strategy 'fixed' cannot host a head"),
])
def test_a_node_that_may_not_host_refuses_a_standby_too(settings, error):
    h, actions = run([(StandbyRequested(1), None, [Reply])], Hosting(settings))
    assert reply(actions) == {"ok": False, "error": error}


def test_a_standby_request_is_idempotent():
    h, actions = run([
        (StandbyRequested(0), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply]),
        (StandbyRequested(1), HostedState.STARTING, [Reply]),
    ])
    assert h.goal is Goal.STANDBY
    h = standby()
    assert step(h, StandbyRequested(9)) == (h, [Reply({"ok": True, "hosted_head": h.as_status()})])


def test_a_standby_request_leaves_a_head_a_head():
    for h in (ready(), step(Hosting(FIRST), HostRequested(0))[0]):
        h2, actions = step(h, StandbyRequested(9))
        assert h2 == h and [type(a) for a in actions] == [Reply] and reply(actions)["ok"]


def test_host_head_on_a_standby_only_publishes_it():
    h, actions = run([(HostRequested(10), HostedState.STANDBY, [Log, PromoteStandby, Reply])], standby())
    assert StartHostedHead not in [type(a) for a in actions]
    assert h.goal is Goal.HEAD and reply(actions)["ok"]
    assert logs(actions) == [("standby_head_promoted", {"address": ADDR})]
    h, actions = run([(EndpointWritten(10.05, ADDR), HostedState.READY, [Log, StatusSoon])], h)
    assert h.as_status() == {"state": "READY", "address": ADDR, "at": 10.05} and h.ready


def test_host_head_during_a_standbys_start_makes_that_start_the_heads():
    h, _ = run([(StandbyRequested(0), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply])])
    h, actions = run([(HostRequested(1), HostedState.STARTING, [Reply])], h)
    assert h.goal is Goal.HEAD
    run([(HostedStarted(2, ADDR, up=True), HostedState.STARTING, [WriteEndpoint]),
         (EndpointWritten(2.1, ADDR), HostedState.READY, [Log, StatusSoon])], h)


def test_a_repeated_host_head_while_promoting_does_nothing_more():
    h, _ = step(standby(), HostRequested(10))
    assert step(h, HostRequested(11)) == (h, [Reply({"ok": True, "hosted_head": h.as_status()})])


def test_dropping_a_standby_kills_it_then_forgets_it():
    h, actions = run([(DropRequested(20), HostedState.STANDBY, [Log, KillStandby, Reply])], standby())
    assert h.goal is Goal.NONE and reply(actions)["ok"]
    h, actions = run([(HostedKilled(21), None, [Log, StatusSoon])], h)
    assert h == Hosting(FIRST) and logs(actions) == [("standby_head_dropped", {})]


def test_dropping_a_starting_standby_kills_it_once_its_start_is_over():
    h, _ = run([(StandbyRequested(0), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply])])
    h, actions = run([(DropRequested(1), HostedState.STARTING, [Log, Reply])], h)
    assert h.goal is Goal.NONE
    for up in (True, False):
        h2, _ = run([(HostedStarted(2, ADDR, up=up), HostedState.STARTING, [KillHostedHead]),
                     (HostedKilled(3), None, [Log, StatusSoon])], h)
        assert h2 == Hosting(FIRST)


@pytest.mark.parametrize("wanted, goal", [(StandbyRequested(2), Goal.STANDBY), (HostRequested(2), Goal.HEAD)])
def test_a_request_during_a_dropped_standbys_start_keeps_that_start(wanted, goal):
    h, _ = step(Hosting(FIRST), StandbyRequested(0))
    h, _ = step(h, DropRequested(1))
    h, actions = run([(wanted, HostedState.STARTING, [Reply])], h)
    assert h.goal is goal


@pytest.mark.parametrize("wanted", [StandbyRequested(22), HostRequested(22)])
def test_a_request_while_a_standby_is_being_killed_is_refused_for_now(wanted):
    h, _ = step(standby(), DropRequested(20))
    h2, actions = run([(wanted, HostedState.STANDBY, [Reply])], h)
    assert h2 == h
    assert reply(actions) == {"ok": False, "error": "the standby head is being stopped; ask again in a moment"}


def test_after_a_drop_a_new_standby_may_start():
    h, _ = step(standby(), DropRequested(20))
    h, _ = step(h, HostedKilled(21))
    run([(StandbyRequested(30), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply])], h)


@pytest.mark.parametrize("h", [
    ready(),
    step(Hosting(FIRST), HostRequested(0))[0],      # a head starting
    step(standby(), HostRequested(10))[0],           # a standby being promoted
], ids=["ready", "starting head", "promoting"])
def test_a_head_is_never_dropped(h):
    h2, actions = step(h, DropRequested(30))
    assert h2 == h
    assert reply(actions) == {"ok": False, "error": "the hosted head is the run's head; it is not dropped"}


@pytest.mark.parametrize("h", [Hosting(FIRST), step(ready(), HostedRayEnded(5))[0]], ids=["none", "failed"])
def test_dropping_nothing_is_fine_and_changes_nothing(h):
    h2, actions = step(h, DropRequested(30))
    assert h2 == h and [type(a) for a in actions] == [Reply] and reply(actions)["ok"]


def test_a_standby_that_does_not_start_fails_like_a_head():
    h, _ = step(Hosting(FIRST), StandbyRequested(0))
    h, _ = run([(HostedStarted(120, None, up=False), HostedState.STARTING, [KillHostedHead]),
                (HostedKilled(121), HostedState.FAILED, [Log, StatusSoon])], h)
    assert h.as_status()["reason"] == "the head did not start; see the Ray log"
    run([(StandbyRequested(130), HostedState.STARTING, [StartHostedHead, PublishStatus, Reply])], h)


@pytest.mark.parametrize("h", [standby(), step(standby(), HostRequested(10))[0]], ids=["standby", "promoting"])
def test_a_standby_whose_ray_ended_fails(h):
    assert watched(h)
    h2, actions = run([(HostedRayEnded(40), HostedState.FAILED, [Log, PublishStatus])], h)
    assert h2.as_status() == {"state": "FAILED", "reason": "the standby head's Ray stopped", "at": 40, "failures": 1}
    assert logs(actions) == [("hosted_head_failed", {"was": "STANDBY"})]


def test_the_end_of_a_dropped_standbys_ray_is_its_kill_not_a_failure():
    h, _ = step(standby(), DropRequested(20))
    assert not watched(h)
    assert step(h, HostedRayEnded(21)) == (h, [])


def test_watched_only_once_up():
    assert not watched(Hosting(FIRST))
    assert not watched(step(Hosting(FIRST), StandbyRequested(0))[0])
    assert watched(ready()) and watched(standby())
    assert not watched(step(ready(), HostedRayEnded(5))[0])


@pytest.mark.parametrize("event", [EndpointWritten(5, ADDR), HostedStarted(5, ADDR, True), HostedKilled(5),
                                   HandoverTick(5, OWN)])
def test_a_standing_standby_ignores_stray_outcomes(event):
    h = standby()
    assert step(h, event) == (h, [])


@pytest.mark.parametrize("pointer", [OWN, "21", None])
def test_a_standby_is_never_handed_over(pointer):
    h2, actions = step(standby(), exit_wanted(10, pointer=pointer, code=2))
    assert actions == [Exit(2)] and h2.handover is None


def test_a_promoting_standby_leaving_is_not_handed_over_either():
    h, _ = step(standby(), HostRequested(10))
    assert step(h, exit_wanted(11))[1] == [Exit(0)]


def test_the_standbys_heartbeat_is_not_ok():
    assert heartbeat(standby(), State.JOINED) == (False, False)
    assert not own_head_live_at_once(standby(), OWN, heard=False)


def test_the_standbys_pid_is_published_and_kept_by_the_head_it_becomes():
    h, _ = step(Hosting(FIRST), StandbyRequested(0))
    h, _ = step(h, HostedStarted(1, ADDR, up=True, pid=4321))
    assert h.as_status() == {"state": "STANDBY", "address": ADDR, "at": 1, "pid": 4321}
    h, _ = step(h, HostRequested(2))
    h, _ = step(h, EndpointWritten(2.05, ADDR))
    assert h.as_status() == {"state": "READY", "address": ADDR, "at": 2.05, "pid": 4321}
    failed, _ = step(h, HostedRayEnded(3))
    assert "pid" not in failed.as_status()


def test_failures_in_a_row_are_counted_and_a_start_that_came_up_resets_them():
    """The count the coordinator paces its next standby by (coordinator/head/standby_retry.py)."""
    h = Hosting(FIRST)
    for n in (1, 2, 3):
        h, _ = step(h, StandbyRequested(10 * n))
        h, _ = step(h, HostedStarted(10 * n + 1, None, up=False))
        h, _ = step(h, HostedKilled(10 * n + 2))
        assert (h.state, h.failures, h.as_status()["failures"], h.as_status()["at"]) == (
            HostedState.FAILED, n, n, 10 * n + 2)
    h, _ = step(h, StandbyRequested(100))
    h, _ = step(h, HostedStarted(101, "10.0.0.1:6380", up=True, pid=7))
    assert (h.state, h.failures) == (HostedState.STANDBY, 0) and "failures" not in h.as_status()
    h, _ = step(h, HostedRayEnded(200))
    assert (h.state, h.failures) == (HostedState.FAILED, 1)
