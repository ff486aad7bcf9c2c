"""The seed's hand-over timing, as tables: when a head drains itself ahead of
its walltime (``agent.slurm.walltime``) and what that drain does to the node's
machines. A head with a pre-walltime signal never drains early: its signal
is its hand-over (``agent.slurm.signal_drain``)."""

from __future__ import annotations

import pytest

from elastic_ray.agent.head import hosted
from elastic_ray.agent import machine
from elastic_ray.agent.machine import WALLTIME_MARGIN, DrainRay, DrainRequested, Settings, State
from elastic_ray.agent.slurm.walltime import (
    DEFAULT_HEAD_DRAIN_LEAD,
    WalltimeFacts,
    serves_head,
    walltime_drain,
)

NOW = 1_000_000.0
LEAD = DEFAULT_HEAD_DRAIN_LEAD


def facts(left: float | None, *, serves=True, joined=True, signal=False, lead=LEAD) -> WalltimeFacts:
    return WalltimeFacts(NOW, serves, joined, signal, None if left is None else NOW + left, lead)


@pytest.mark.parametrize("f, deadline", [
    # A serving head without a signal drains once its walltime is within the lead ...
    pytest.param(facts(LEAD), NOW + LEAD - WALLTIME_MARGIN, id="no-signal-exactly-5min"),
    pytest.param(facts(120), NOW + 120 - WALLTIME_MARGIN, id="no-signal-2min-left"),
    pytest.param(facts(LEAD + 1), None, id="no-signal-more-than-5min"),
    pytest.param(facts(3600), None, id="no-signal-an-hour-left"),
    # ... and with very little time left it still hands over, with a short deadline.
    pytest.param(facts(10), NOW + machine.ENDING_GRACE, id="no-signal-10s-left"),
    pytest.param(facts(-5), NOW + machine.ENDING_GRACE, id="no-signal-past-end"),
    # A head with a pre-walltime signal waits for it, however close the walltime.
    pytest.param(facts(LEAD, signal=True), None, id="signal-5min-left"),
    pytest.param(facts(20, signal=True), None, id="signal-20s-left"),
    # Already draining (signal or request_drain), still starting, or leaving: no second drain.
    pytest.param(facts(60, joined=False), None, id="already-draining"),
    # Not the session's head (a successor not yet elected, an ordinary worker).
    pytest.param(facts(60, serves=False), None, id="not-serving"),
    # Unlimited, or the end time not known yet.
    pytest.param(facts(None), None, id="no-end-time"),
    # The lead is a setting (ELASTIC_AGENT_HEAD_DRAIN_LEAD): tests shorten it.
    pytest.param(facts(30, lead=20), None, id="short-lead-not-yet"),
    pytest.param(facts(20, lead=20), NOW + 20 - WALLTIME_MARGIN, id="short-lead-reached"),
    pytest.param(facts(20, lead=0), None, id="lead-zero-never-early"),
])
def test_walltime_drain(f, deadline):
    drain = walltime_drain(f)
    if deadline is None:
        assert drain is None
        return
    assert isinstance(drain, DrainRequested)
    assert drain.now == NOW and drain.deadline == pytest.approx(deadline)
    assert "no pre-walltime signal" in drain.reason


@pytest.mark.parametrize("role, pointer, hosted_ready, serves", [
    # A separate head allocation (ray_head_only) serves while ray_head names it.
    ("head", "7", False, True),
    ("head", "9", False, False),      # a successor head that is not yet elected, or one already replaced
    ("head", None, False, False),
    # In the default layout (or after an election) the first node of a worker
    # allocation hosts the head: only that agent, only once its head is ready.
    ("worker", "7", True, True),
    ("worker", "7", False, False),    # another node of the hosting allocation, or the head not up yet
    ("worker", "9", True, False),     # the head moved elsewhere: its hosted head serves nobody
    ("worker", None, True, False),
])
def test_serves_head(role, pointer, hosted_ready, serves):
    assert serves_head(role, "7", pointer, hosted_ready) is serves


@pytest.mark.parametrize("role, left, signal, drains", [
    ("head", 200, False, True),     # separate head without a signal: drained 5 min ahead
    ("head", 200, True, False),     # separate head with a signal: waits for it
    ("worker", 200, False, True),   # hosted head on a worker allocation without a signal: the same
    ("worker", 200, True, False),   # hosted head on a worker allocation with a signal: waits for it
    ("head", 400, False, False),
    ("worker", 400, False, False),
])
def test_the_walltime_drain_is_the_same_drain_as_a_signal(role, left, signal, drains):
    """Fed to the node's machine, the walltime drain does what a signal or
    request_drain does: a JOINED head (or hosting worker) goes DRAINING, so its
    heartbeat says draining (drivers get SIGTERM, the session elects), and it
    stays until the head has moved."""
    ctx, _ = machine.initial(Settings(role=role), NOW - 100, "7")
    if role == "head":
        ctx, _ = machine.step(ctx, machine.RayJoined(NOW - 90, "node-h"))
    else:
        ctx, _ = machine.step(ctx, machine.HeadSeen(NOW - 95, "7", "10.0.0.1:6379", True))
        ctx, _ = machine.step(ctx, machine.RayJoined(NOW - 90, "node-w"))
    assert ctx.state is State.JOINED
    drain = walltime_drain(facts(left, signal=signal))
    assert (drain is not None) is drains
    if drain is None:
        return
    ctx, actions = machine.step(ctx, drain)
    assert ctx.state is State.DRAINING and ctx.drain_deadline == drain.deadline
    assert actions == ([] if role == "head" else [DrainRay("node-w", drain.deadline, drain.reason)])
    if role == "worker":
        hosting = hosted.Hosting(hosted.HostSettings("7", "worker", 0, True, "random"),
                                 state=hosted.HostedState.READY, at=NOW - 80, address="10.0.0.1:6400")
        assert hosted.heartbeat(hosting, ctx.state) == (True, True), "the hosted head's heartbeat says draining"
    else:
        # The old head stays while the pointer still names it, and leaves
        # (exit 0: the job ends COMPLETED) once the head has moved.
        ctx, actions = machine.step(ctx, machine.HeadSeen(NOW + 1, "7", None, True))
        assert ctx.state is State.DRAINING and actions == []
        ctx, actions = machine.step(ctx, machine.HeadSeen(NOW + 5, "8", "10.0.0.2:6379", True))
        assert ctx.state is State.LEFT and actions[-1] == machine.Exit(0)
