"""The agent's state machine, driven event by event without Ray.

Scenarios are written as (event, expected state, expected action types) so
each promise of the seed about a node reads as a short script.
"""

from __future__ import annotations

import pytest

from elastic_ray.agent.machine import (
    ENDING_GRACE,
    WALLTIME_MARGIN,
    DrainRay,
    DrainRequested,
    Exit,
    HeadSeen,
    PublishHead,
    RayEnded,
    RayJoined,
    Settings,
    ShutdownRequested,
    StartRay,
    State,
    StopRay,
    Tick,
    backoff_delay,
    drain_deadline_for_signal,
    initial,
    step,
)
from elastic_ray.scheduler.base import JobState

W = Settings(role="worker", rejoin_timeout=100, max_restarts=3, backoff_base=2, backoff_max=60, start_timeout=30)
H = Settings(role="head", start_timeout=30)


def live(now, job="10", addr="10.0.0.1:6379"):
    return HeadSeen(now, job, addr, True)


def lost(now, job="10"):
    return HeadSeen(now, job, None, False)


def run(settings, script, own_job=None):
    """Feed events; check (state, [action types]) after each one. Returns the context."""
    ctx, actions = initial(settings, 0.0, own_job)
    for event, want_state, want_actions in script:
        ctx, actions = step(ctx, event)
        assert ctx.state is want_state, (event, ctx.history)
        assert [type(a) for a in actions] == want_actions, (event, actions)
    return ctx, actions


def test_worker_waits_then_joins():
    ctx, actions = run(W, [
        (Tick(1), State.WAITING_FOR_HEAD, []),
        (lost(2), State.WAITING_FOR_HEAD, []),
        (live(3), State.STARTING, [StartRay]),
        (RayJoined(5, "n1"), State.JOINED, []),
        (live(6), State.JOINED, []),              # the same head again: nothing to do
    ])
    assert ctx.node_id == "n1" and ctx.head_address == "10.0.0.1:6379"


def test_start_ray_carries_the_head_address():
    ctx, _ = initial(W, 0)
    _, actions = step(ctx, live(1, "10", "1.2.3.4:5"))
    assert actions == [StartRay("1.2.3.4:5")]


def test_restart_backoff_grows_then_gives_up_until_another_head():
    script = [(live(0), State.STARTING, [StartRay]), (RayJoined(1, "a"), State.JOINED, [])]
    t = 10.0
    delays = []
    for failure in range(1, 4):
        script.append((RayEnded(t, "raylet killed"), State.RESTART_BACKOFF, [StopRay]))
        delay = backoff_delay(W, failure)
        delays.append(delay)
        script.append((Tick(t + delay - 0.01), State.RESTART_BACKOFF, []))
        script.append((Tick(t + delay), State.STARTING, [StartRay]))
        script.append((RayJoined(t + delay + 1, f"n{failure}"), State.JOINED, []))
        t += delay + 10
    # The fourth end under the same head: the node stays out.
    script.append((RayEnded(t, "raylet killed"), State.GAVE_UP, [StopRay]))
    script.append((Tick(t + 1000), State.GAVE_UP, []))
    script.append((live(t + 1001), State.GAVE_UP, []))
    # Another head: the count starts again and the node joins it.
    script.append((live(t + 1002, job="11", addr="10.0.0.2:6379"), State.FOLLOWING, [StartRay]))
    script.append((RayJoined(t + 1003, "m"), State.JOINED, []))
    ctx, _ = run(W, script)
    assert delays == [2, 4, 8]
    assert ctx.failures == 0 and ctx.restarts == 3
    assert ctx.state is State.JOINED and ctx.head_job == "11"


def test_backoff_is_capped():
    assert backoff_delay(W, 1) == 2 and backoff_delay(W, 10) == 60


def test_a_node_that_gave_up_waits_out_its_rejoin_timeout_when_the_head_dies():
    ctx, _ = run(Settings(role="worker", max_restarts=0, rejoin_timeout=50), [
        (live(0), State.STARTING, [StartRay]),
        (RayEnded(1, "crash"), State.GAVE_UP, [StopRay]),
        (lost(2), State.GAVE_UP, []),
        (Tick(51), State.GAVE_UP, []),
        (Tick(52), State.RELEASED, [Exit]),
    ])


def test_head_lost_then_released_after_rejoin_timeout():
    run(W, [
        (live(0), State.STARTING, [StartRay]),
        (RayJoined(1, "a"), State.JOINED, []),
        (lost(10), State.WAITING_FOR_HEAD, [StopRay]),
        (Tick(109), State.WAITING_FOR_HEAD, []),
        (Tick(110), State.RELEASED, [Exit]),
    ])


def test_head_lost_then_a_new_head_within_the_timeout():
    ctx, _ = run(W, [
        (live(0), State.STARTING, [StartRay]),
        (RayJoined(1, "a"), State.JOINED, []),
        (lost(10), State.WAITING_FOR_HEAD, [StopRay]),
        (Tick(50), State.WAITING_FOR_HEAD, []),
        (live(60, job="12", addr="10.0.0.3:6379"), State.STARTING, [StartRay]),
        (RayJoined(62, "b"), State.JOINED, []),
        (Tick(500), State.JOINED, []),   # the old rejoin timer is gone
    ])
    assert ctx.no_head_since is None


def test_a_moved_head_is_followed_at_once_with_a_hard_stop():
    ctx, actions = run(W, [
        (live(0), State.STARTING, [StartRay]),
        (RayJoined(1, "a"), State.JOINED, []),
        (live(5, job="11", addr="10.0.0.2:6379"), State.FOLLOWING, [StopRay, StartRay]),
    ])
    assert actions[0] == StopRay(graceful=False)
    assert actions[1] == StartRay("10.0.0.2:6379")
    ctx, _ = step(ctx, RayJoined(8, "b"))
    assert ctx.state is State.JOINED and ctx.node_id == "b"


def test_the_same_job_at_a_new_address_is_followed_too():
    _, actions = run(W, [
        (live(0), State.STARTING, [StartRay]),
        (RayJoined(1, "a"), State.JOINED, []),
        (live(5, addr="10.0.0.9:7000"), State.FOLLOWING, [StopRay, StartRay]),
    ])


def test_drain_lets_the_node_leave_when_idle():
    _, actions = run(W, [
        (live(0), State.STARTING, [StartRay]),
        (RayJoined(1, "a"), State.JOINED, []),
        (DrainRequested(5, 65, "request"), State.DRAINING, [DrainRay]),
        (Tick(30), State.DRAINING, []),
        (live(31), State.DRAINING, []),
        (RayEnded(32, "raylet exited 0"), State.LEFT, [StopRay, Exit]),
    ])
    assert actions[-1] == Exit(0)


def test_drain_stops_the_node_at_the_deadline():
    _, actions = run(W, [
        (live(0), State.STARTING, [StartRay]),
        (RayJoined(1, "a"), State.JOINED, []),
        (DrainRequested(5, 20, "walltime"), State.DRAINING, [DrainRay]),
        (Tick(19.9), State.DRAINING, []),
        (Tick(20), State.LEFT, [StopRay, Exit]),
    ])
    assert actions[0] == StopRay(graceful=True)


def test_an_earlier_drain_deadline_wins_a_later_one_does_not():
    ctx, _ = run(W, [
        (live(0), State.STARTING, [StartRay]),
        (RayJoined(1, "a"), State.JOINED, []),
        (DrainRequested(5, 100, "request"), State.DRAINING, [DrainRay]),
        (DrainRequested(6, 50, "walltime"), State.DRAINING, []),
        (DrainRequested(7, 80, "again"), State.DRAINING, []),
    ])
    assert ctx.drain_deadline == 50


@pytest.mark.parametrize("prefix,ray_running", [
    ([], False),
    ([(live(0), State.STARTING, [StartRay])], True),
])
def test_drain_before_joining_leaves_at_once(prefix, ray_running):
    script = prefix + [(DrainRequested(5, 100, "walltime"), State.LEFT, ([StopRay] if ray_running else []) + [Exit])]
    run(W, script)


def test_ray_that_never_joins_counts_as_a_failure():
    run(W, [
        (live(0), State.STARTING, [StartRay]),
        (Tick(30), State.STARTING, []),
        (Tick(31), State.RESTART_BACKOFF, [StopRay]),
    ])


def test_shutdown_from_any_live_state():
    for script in (
        [],
        [(live(0), State.STARTING, [StartRay])],
        [(live(0), State.STARTING, [StartRay]), (RayJoined(1, "a"), State.JOINED, [])],
    ):
        ctx, _ = run(W, script)
        ctx, actions = step(ctx, ShutdownRequested(9, "asked"))
        assert ctx.state is State.LEFT and actions[-1] == Exit(0)


def test_terminal_states_ignore_everything():
    ctx, _ = run(W, [(ShutdownRequested(1, "x"), State.LEFT, [Exit])])
    for event in (live(2), Tick(3), RayEnded(4, "x"), DrainRequested(5, 6, "x")):
        assert step(ctx, event) == (ctx, [])


def test_head_lost_during_restart_backoff_waits_for_a_head():
    run(W, [
        (live(0), State.STARTING, [StartRay]),
        (RayEnded(1, "x"), State.RESTART_BACKOFF, [StopRay]),
        (lost(2), State.WAITING_FOR_HEAD, []),
        (Tick(3), State.WAITING_FOR_HEAD, []),
    ])


def test_history_is_bounded_and_readable():
    ctx, _ = initial(W, 0)
    for i in range(30):
        ctx, _ = step(ctx, live(i, job=str(100 + i)))
    assert len(ctx.history) == 20
    assert "following new head" in ctx.history[-1]


# ------------------------------------------------------------------ head role

def test_head_starts_publishes_and_fails_when_ray_stops():
    ctx, actions = initial(H, 0, "7")
    assert actions == [StartRay(None)] and ctx.head_job == "7"
    ctx, actions = step(ctx, RayJoined(3, "h"))
    assert ctx.state is State.JOINED and actions == [PublishHead()]
    ctx, actions = step(ctx, RayEnded(9, "gcs died"))
    assert ctx.state is State.FAILED and actions == [StopRay(False), Exit(1)]


def test_a_head_whose_first_start_ended_before_ready_starts_once_more_then_fails():
    ctx, _ = initial(H, 0, "7")
    ctx, actions = step(ctx, RayEnded(40, "ray start exited with 1"))
    assert (ctx.state, ctx.restarts, ctx.since) == (State.STARTING, 1, 40)
    assert actions == [StopRay(False), StartRay(None)] and "starting it once more" in ctx.reason
    ctx, actions = step(ctx, Tick(60))          # its start timeout counts from the second start
    assert ctx.state is State.STARTING and actions == []
    ctx, actions = step(ctx, RayEnded(80, "ray start exited with 1"))
    assert ctx.state is State.FAILED and actions == [StopRay(False), Exit(1)]
    ctx, _ = initial(H, 0, "7")                  # the second start succeeds: the head serves as usual
    ctx, _ = step(ctx, RayEnded(40, "ray start exited with 1"))
    ctx, actions = step(ctx, RayJoined(45, "h"))
    assert ctx.state is State.JOINED and actions == [PublishHead()]


def test_head_that_never_gets_ready_fails():
    ctx, _ = initial(H, 0, "7")
    ctx, actions = step(ctx, Tick(31))
    assert ctx.state is State.FAILED and Exit(1) in actions


def test_draining_head_stays_until_the_head_moved():
    ctx, _ = initial(H, 0, "7")
    ctx, _ = step(ctx, RayJoined(1, "h"))
    ctx, actions = step(ctx, DrainRequested(2, 300, "walltime"))
    assert ctx.state is State.DRAINING and actions == []
    ctx, actions = step(ctx, HeadSeen(3, "7", "a:1", True))
    assert ctx.state is State.DRAINING
    ctx, actions = step(ctx, HeadSeen(4, "8", "b:1", True))
    assert ctx.state is State.LEFT and actions == [StopRay(True), Exit(0)]


def test_draining_head_leaves_at_its_deadline():
    ctx, _ = initial(H, 0, "7")
    ctx, _ = step(ctx, RayJoined(1, "h"))
    ctx, _ = step(ctx, DrainRequested(2, 50, "request"))
    ctx, actions = step(ctx, Tick(50))
    assert ctx.state is State.LEFT and actions[-1] == Exit(0)


def test_settings_refuse_a_bad_role():
    with pytest.raises(ValueError, match="role"):
        Settings(role="boss")


def test_head_asked_to_drain_before_it_is_ready_leaves_at_once():
    # Nobody can follow a head that has not published its endpoint, so there
    # is nothing to hand over: waiting for a pointer move would only keep
    # the job (and its start-up) alive until the deadline.
    ctx, _ = initial(H, 0, "7")
    ctx, actions = step(ctx, DrainRequested(1, 500, "SIGTERM"))
    assert ctx.state is State.LEFT
    assert [type(a) for a in actions] == [StopRay, Exit] and actions[0].graceful and actions[1].code == 0
    # A RayJoined that was already on its way changes nothing.
    ctx2, actions = step(ctx, RayJoined(2, "n"))
    assert ctx2 is ctx and actions == []


def test_a_replaced_head_leaves_even_without_a_drain():
    ctx, _ = initial(H, 0, "7")
    ctx, _ = step(ctx, RayJoined(1, "h"))
    ctx, actions = step(ctx, HeadSeen(2, "7", "a:1", True))
    assert ctx.state is State.JOINED and actions == []
    ctx, actions = step(ctx, HeadSeen(3, None, None, False))   # an unreadable pointer is not a move
    assert ctx.state is State.JOINED
    ctx, actions = step(ctx, HeadSeen(4, "9", "b:1", True))
    assert ctx.state is State.LEFT and actions == [StopRay(True), Exit(0)]


def test_a_successor_head_does_not_leave_before_it_was_ever_the_head():
    ctx, _ = initial(H, 0, "9")
    ctx, _ = step(ctx, RayJoined(1, "h"))
    ctx, actions = step(ctx, HeadSeen(2, "7", "a:1", True))   # the old head is still current
    assert ctx.state is State.JOINED and actions == []
    ctx, _ = step(ctx, HeadSeen(3, "9", "b:1", True))          # the session switched to us
    ctx, actions = step(ctx, HeadSeen(4, "11", "c:1", True))   # and later away from us
    assert ctx.state is State.LEFT


@pytest.mark.parametrize("job_state, end, want", [
    (JobState.RUNNING, 1000.0, 1000.0 - WALLTIME_MARGIN),   # the pre-walltime warning: drain until 15 s before
    (JobState.RUNNING, 110.0, 100.0 + ENDING_GRACE),        # too close to the end for the margin
    (JobState.RUNNING, None, 100.0 + ENDING_GRACE),         # Slurm did not say when
    (JobState.CANCELLED, 1000.0, 100.0 + ENDING_GRACE),     # being cancelled: KillWait runs
    (None, None, 100.0 + ENDING_GRACE),                     # no answer at all
])
def test_drain_deadline_for_signal(job_state, end, want):
    assert drain_deadline_for_signal(100.0, job_state, end) == want
