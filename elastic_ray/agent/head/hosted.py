"""The hosted head's decisions: pure, beside :mod:`agent.machine`, tested the same way.

When the session elects a worker allocation to carry the run's head, the
first node of that allocation hosts a head-only Ray control plane next to its
own worker (the ``host_head`` request). That head has a life of its own,
apart from the node's worker state machine::

    (none) --host_head--> STARTING --GCS open, endpoint written--> READY --its Ray ended--> FAILED
                             +--no GCS in time (or `ray start` ended), node killed--> FAILED
    FAILED --host_head--> STARTING (another try)

``failures`` counts the starts (and standbys) that failed since one last came
up: the coordinator waits longer before each new standby (``failures`` and
the FAILED state's ``at`` are in the status it reads).

A warm standby (``RayLauncher.standby_head``) is the same control plane
started ahead of an election, on the allocation the next election would
pick, without the endpoint that would make it the run's head::

    (none)/FAILED --standby_head--> STARTING (goal standby) --GCS open, raylet registered--> STANDBY
    STANDBY --host_head--> STANDBY (goal head) --endpoint written--> READY    (no `ray start`)
    STANDBY --drop_standby--> STANDBY (goal none) --node killed--> (none)
    STANDBY --its Ray ended--> FAILED

The record's ``goal`` says what a start in flight (or a standby) is for:
``head`` (write the endpoint once up), ``standby`` (stay up, unpublished) or
``none`` (dropped: kill it once the start is over). A ``host_head`` during a
standby's start only changes the goal, so the start under way serves the
head; a ``drop_standby`` never touches a head (goal ``head``).

The record changes only after the effect it reports: READY once the endpoint
is written (workers can find the head), FAILED once a failed start was killed
(a new request cannot start a second head on ports the first still holds),
(none) once a dropped standby was killed, for the same reason.

An agent that hosts the run's head and is about to exit hands the head over
first, as a head allocation does: it stays until the session moved the head
elsewhere, the hosted head failed, or the deadline came, so the run's GCS does
not go down with this node while workers still follow it. A standby is never
the run's head: it goes with the node, without a hand-over.

The runner (``agent.head.hosted_head``) turns what happens into events, feeds them
to :func:`step` and carries out the actions it returns.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from ...protocol.disk.records import HostedHeadState
from ..machine import ENDING_GRACE, Exit, State


#: The hosted head's states are the protocol's (one enum on both sides).
HostedState = HostedHeadState


class Goal(str, enum.Enum):
    """What the hosted control plane is for (see the module docstring)."""
    HEAD = "head"
    STANDBY = "standby"
    NONE = "none"


@dataclass(frozen=True)
class HostSettings:
    """What decides whether this agent may host a head at all."""
    own_job: str
    role: str                  # the agent's role: only a worker hosts an elected head
    node_index: int            # only the allocation's first node does
    can_host: bool             # the launcher's port strategy allows a second Ray on the node
    port_strategy: str

    def refusal(self) -> str | None:
        if self.role != "worker" or self.node_index != 0:
            return "only the first node of a worker allocation hosts a head"
        if not self.can_host:
            return f"port_strategy {self.port_strategy!r} cannot host a head"
        return None


@dataclass(frozen=True)
class Handover:
    """A leaving agent still serving the run's head: the exit code it will
    leave with, and when it leaves anyway."""
    code: int
    deadline: float


@dataclass(frozen=True)
class Hosting:
    settings: HostSettings
    state: HostedState | None = None          # None: never asked to host (or a standby dropped)
    at: float | None = None                   # when ``state`` began
    goal: Goal = Goal.HEAD                    # STARTING or STANDBY: what it is for
    address: str | None = None                # STANDBY, READY: the GCS address
    pid: int | None = None                    # STANDBY, READY: its `ray start` (the node's PID)
    reason: str | None = None                 # FAILED: why
    failures: int = 0                         # starts (or standbys) failed since one last came up
    handover: Handover | None = None

    @property
    def ready(self) -> bool:
        return self.state is HostedState.READY

    def as_status(self) -> dict[str, Any] | None:
        """The ``hosted_head`` entry of the agent's status (read by the coordinator)."""
        if self.state is None:
            return None
        if self.state in (HostedState.READY, HostedState.STANDBY):
            up = {"state": self.state.value, "address": self.address, "at": self.at}
            return up if self.pid is None else {**up, "pid": self.pid}
        if self.state is HostedState.FAILED:
            return {"state": self.state.value, "reason": self.reason, "at": self.at, "failures": self.failures}
        return {"state": self.state.value, "at": self.at}


# ------------------------------------------------------------------ events

@dataclass(frozen=True)
class HostRequested:
    """The coordinator asks this agent to host the run's head."""
    now: float


@dataclass(frozen=True)
class StandbyRequested:
    """The coordinator asks this agent to keep a standby head up."""
    now: float


@dataclass(frozen=True)
class DropRequested:
    """The coordinator moved the standby elsewhere: stop this one."""
    now: float


@dataclass(frozen=True)
class HostedStarted:
    """The start is over: ``up`` if the head's GCS accepts connections and
    `ray start` still runs; otherwise it did neither within the start timeout."""
    now: float
    address: str | None
    up: bool
    pid: int | None = None


@dataclass(frozen=True)
class EndpointWritten:
    now: float
    address: str | None


@dataclass(frozen=True)
class HostedKilled:
    """A head that did not start, or a dropped standby, was killed."""
    now: float


@dataclass(frozen=True)
class HostedRayEnded:
    """The Ray of a ready hosted head (or a standby) ended."""
    now: float


@dataclass(frozen=True)
class ExitWanted:
    """The node's machine said exit. ``hosting_node``: this agent holds a hosted
    Ray node; ``pointer``: what ``ray_head`` names (read only when it matters)."""
    now: float
    code: int
    drain_deadline: float | None
    hosting_node: bool
    pointer: str | None


@dataclass(frozen=True)
class HandoverTick:
    """Time passed during a hand-over; ``head_job`` is what ``ray_head`` names now."""
    now: float
    head_job: str | None


HostedEvent = HostRequested | StandbyRequested | DropRequested | HostedStarted | EndpointWritten | HostedKilled | HostedRayEnded | ExitWanted | HandoverTick


# ------------------------------------------------------------------ actions

@dataclass(frozen=True)
class Reply:
    """The answer to a ``host_head``, ``standby_head`` or ``drop_standby`` request."""
    body: dict[str, Any]


@dataclass(frozen=True)
class StartHostedHead:
    """Start the head on its own thread (the node's worker Ray may need
    stopping and starting meanwhile; a slow head start must not hold that up)."""


@dataclass(frozen=True)
class WriteEndpoint:
    """Publish the hosted head's endpoint so workers can join it."""


@dataclass(frozen=True)
class PromoteStandby:
    """Write the standby's endpoint, on a thread of its own (the request's
    reply must not wait for a file write that a full disk may retry)."""


@dataclass(frozen=True)
class KillHostedHead:
    pass


@dataclass(frozen=True)
class KillStandby:
    """Kill the standby's Ray (a thread of its own: the event loop must not wait for it)."""


@dataclass(frozen=True)
class Log:
    event: str
    fields: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class PublishStatus:
    """Write the status now, also to the session (the coordinator reads it there)."""


@dataclass(frozen=True)
class StatusSoon:
    """Ask the event loop to write the status at its next turn."""


HostedAction = Reply | StartHostedHead | WriteEndpoint | PromoteStandby | KillHostedHead | KillStandby | Log | PublishStatus | StatusSoon | Exit


# ------------------------------------------------------------------ the step function

def step(h: Hosting, event: HostedEvent) -> tuple[Hosting, list[HostedAction]]:
    """Apply one event; return the new record and the actions to carry out, in order."""
    s = h.state
    if isinstance(event, (HostRequested, StandbyRequested, DropRequested)):
        return _request(h, event)
    if isinstance(event, HostedStarted) and s is HostedState.STARTING:
        if not event.up or h.goal is Goal.NONE:
            return h, [KillHostedHead()]
        if h.goal is Goal.HEAD:
            return replace(h, pid=event.pid, failures=0), [WriteEndpoint()]
        return (replace(h, state=HostedState.STANDBY, at=event.now, address=event.address, pid=event.pid,
                        failures=0),
                [Log("standby_head_ready", (("address", event.address),)), StatusSoon()])
    if isinstance(event, EndpointWritten) and h.goal is Goal.HEAD and s in (HostedState.STARTING, HostedState.STANDBY):
        return (replace(h, state=HostedState.READY, at=event.now, address=event.address),
                [Log("hosted_head_ready", (("address", event.address),)), StatusSoon()])
    if isinstance(event, HostedKilled) and (s is HostedState.STARTING
                                            or (s is HostedState.STANDBY and h.goal is Goal.NONE)):
        if h.goal is Goal.NONE:
            return Hosting(h.settings), [Log("standby_head_dropped"), StatusSoon()]
        return (_failed(h, event.now, "the head did not start; see the Ray log"),
                [Log("hosted_head_failed"), StatusSoon()])
    if isinstance(event, HostedRayEnded) and watched(h):
        why = "the hosted head's Ray stopped" if s is HostedState.READY else "the standby head's Ray stopped"
        return _failed(h, event.now, why), [Log("hosted_head_failed", (("was", s.value),)), PublishStatus()]
    if isinstance(event, ExitWanted):
        if not (may_serve(h, event.hosting_node) and event.pointer == h.settings.own_job):
            return h, [Exit(event.code)]
        # The run's head lives in this agent: hand it over before leaving,
        # instead of taking the run's GCS down with this node. Without a
        # drain deadline of its own (a shutdown request) it waits only as
        # long as a job being ended may (Slurm's KillWait is running).
        deadline = event.drain_deadline or (event.now + ENDING_GRACE)
        return (replace(h, handover=Handover(event.code, deadline)),
                [Log("hosted_head_handover", (("deadline_in", f"{deadline - event.now:.1f}s"),)), PublishStatus()])
    if isinstance(event, HandoverTick) and h.handover is not None:
        moved = event.head_job is not None and event.head_job != h.settings.own_job
        failed = not h.ready
        if moved or failed or event.now >= h.handover.deadline:
            why = "head moved" if moved else ("hosted head failed" if failed else "deadline reached")
            return (replace(h, handover=None),
                    [Log("hosted_head_handed_over", (("head_job", event.head_job), ("why", why))),
                     Exit(h.handover.code)])
    return h, []


def _request(h: Hosting, event: HostRequested | StandbyRequested | DropRequested
             ) -> tuple[Hosting, list[HostedAction]]:
    """The three control requests about the hosted control plane."""
    s, goal = h.state, h.goal
    if isinstance(event, DropRequested):
        # Never the run's head (nor one becoming it): only a standby is dropped.
        if goal is Goal.HEAD and s in (HostedState.STARTING, HostedState.STANDBY, HostedState.READY):
            return h, [Reply({"ok": False, "error": "the hosted head is the run's head; it is not dropped"})]
        if s is HostedState.STARTING and goal is Goal.STANDBY:
            # The start under way is killed once it is over (HostedStarted).
            h = replace(h, goal=Goal.NONE)
            return h, [Log("standby_head_drop"), Reply({"ok": True, "hosted_head": h.as_status()})]
        if s is HostedState.STANDBY and goal is Goal.STANDBY:
            h = replace(h, goal=Goal.NONE)
            return h, [Log("standby_head_drop"), KillStandby(), Reply({"ok": True, "hosted_head": h.as_status()})]
        return h, [Reply({"ok": True, "hosted_head": h.as_status()})]   # nothing (left) to drop
    refusal = h.settings.refusal()
    if refusal is not None:
        return h, [Reply({"ok": False, "error": refusal})]
    wanted = Goal.HEAD if isinstance(event, HostRequested) else Goal.STANDBY
    if s is None or s is HostedState.FAILED:
        h = replace(h, state=HostedState.STARTING, at=event.now, goal=wanted, address=None, pid=None, reason=None)
        return h, [StartHostedHead(), PublishStatus(), Reply({"ok": True, "hosted_head": h.as_status()})]
    if s is HostedState.STANDBY and goal is Goal.NONE:
        # Its kill is under way and cannot be undone; the ports it holds are free once it is over.
        return h, [Reply({"ok": False, "error": "the standby head is being stopped; ask again in a moment"})]
    if s is HostedState.STARTING and goal is not Goal.HEAD:
        # A start under way serves the new goal: a dropped standby's start is
        # kept, a standby's start becomes the head's.
        h = replace(h, goal=wanted)
        return h, [Reply({"ok": True, "hosted_head": h.as_status()})]
    if s is HostedState.STANDBY and goal is Goal.STANDBY and wanted is Goal.HEAD:
        # The whole point of a standby: the head is up already, only its endpoint is missing.
        h = replace(h, goal=Goal.HEAD)
        return h, [Log("standby_head_promoted", (("address", h.address),)), PromoteStandby(),
                   Reply({"ok": True, "hosted_head": h.as_status()})]
    return h, [Reply({"ok": True, "hosted_head": h.as_status()})]   # idempotent (a head stays a head)


def _failed(h: Hosting, now: float, reason: str) -> Hosting:
    return replace(h, state=HostedState.FAILED, at=now, address=None, pid=None, reason=reason,
                   failures=h.failures + 1)


# ------------------------------------------------------------------ questions

def watched(h: Hosting) -> bool:
    """Does the end of the hosted node's Ray change anything? A ready head's
    and a standby's do (FAILED); a dropped standby's end is its kill's outcome."""
    return h.state is HostedState.READY or (h.state is HostedState.STANDBY and h.goal is not Goal.NONE)


def may_serve(h: Hosting, hosting_node: bool) -> bool:
    """Could this agent be serving the run's head? Only then is ``ray_head``
    worth reading before an exit."""
    return hosting_node and h.ready


def own_head_live_at_once(h: Hosting, head_job: str | None, heard: bool) -> bool:
    """``ray_head`` names the head this agent hosts and it is ready: its worker
    may join without waiting for its own heartbeat to come back through the
    subscription."""
    return head_job == h.settings.own_job and not heard and h.ready


def heartbeat(h: Hosting, node_state: State) -> tuple[bool, bool]:
    """(ray_ok, draining) of the hosted head's heartbeat. Draining once the
    allocation is leaving: whoever watches the head should elect another."""
    draining = h.handover is not None or node_state in (State.DRAINING, State.LEFT, State.RELEASED)
    return h.ready, draining
