"""The agent's state machine: pure, event-driven, unit-tested without Ray.

The runner (``agent.runner``) turns the world into events (the Ray child
exited, the ``ray_head`` pointer changed, a heartbeat stopped, a control
message or a signal arrived, a timer fired), feeds them to :func:`step`, and
carries out the actions it returns. Every decision lives here, so every
decision is tested exhaustively in ``tests/test_agent_machine.py``.

Worker role::

    WAITING_FOR_HEAD --head live--> STARTING --joined--> JOINED
         ^   |                         |                   |  |  \\
         |   +--no head for rejoin_timeout--> RELEASED     |  |   +--pointer names another head--> FOLLOWING --joined--> JOINED
         |                                                 |  +--drain (signal or request)--> DRAINING --node left/deadline--> LEFT
         +-------------head lost (heartbeat stopped)-------+
                                                           +--Ray ended, head live--> RESTART_BACKOFF --delay--> STARTING
                                                                (after MAX_RESTARTS more ends: GAVE_UP until another head)

Head role: STARTING --ready--> JOINED --drain--> DRAINING --head moved or deadline--> LEFT
(a drain while still STARTING leaves at once: nobody follows an unpublished head; a first
`ray start --head` that ends before the head is ready is started once more);
Ray ending under a head is FAILED (a new head means a new GCS; the
coordinator elects one, the agent does not restart it).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .. import defaults
from ..protocol.disk.records import AgentState
from ..scheduler.base import JobState

# Slurm may deliver the pre-walltime warning up to 30 s early; the drain is
# timed from the job's end time instead, leaving Ray this long to stop cleanly.
WALLTIME_MARGIN = 15.0
# When the signal comes because the job is being ended (scancel, timeout),
# Slurm kills everything after KillWait; stop well before that.
ENDING_GRACE = 3.0


#: The node's states are the protocol's: one enum, written to the node file
#: and the status answer as they are, read back by the coordinator the same way.
State = AgentState


# ------------------------------------------------------------------ events

@dataclass(frozen=True)
class Tick:
    """Time passed; timers (backoff, drain deadline, rejoin timeout) are checked."""
    now: float


@dataclass(frozen=True)
class HeadSeen:
    """What the agent currently knows about the head named by ``ray_head``.

    ``live`` is False when the pointer is absent, the head has no endpoint
    yet, or its heartbeat stopped (or says its Ray is down).
    """
    now: float
    head_job: str | None
    address: str | None
    live: bool


@dataclass(frozen=True)
class RayJoined:
    """The local Ray node is up (worker: registered; head: GCS answers)."""
    now: float
    node_id: str


@dataclass(frozen=True)
class RayEnded:
    """The local Ray node ended (child exited or raylet gone)."""
    now: float
    detail: str


@dataclass(frozen=True)
class DrainRequested:
    now: float
    deadline: float
    reason: str


@dataclass(frozen=True)
class ShutdownRequested:
    now: float
    reason: str


Event = Tick | HeadSeen | RayJoined | RayEnded | DrainRequested | ShutdownRequested


# ------------------------------------------------------------------ actions

@dataclass(frozen=True)
class StartRay:
    head_address: str | None  # None for the head role


@dataclass(frozen=True)
class StopRay:
    """``graceful``: ordered TERM (the raylet first, so Ray marks the node dead
    at once and retries its tasks without counting them); otherwise SIGKILL
    (the head is gone: a graceful stop would wait on a dead GCS)."""
    graceful: bool


@dataclass(frozen=True)
class DrainRay:
    node_id: str
    deadline: float
    reason: str


@dataclass(frozen=True)
class PublishHead:
    """Head role: write the endpoint so workers can join."""


@dataclass(frozen=True)
class Exit:
    code: int


Action = StartRay | StopRay | DrainRay | PublishHead | Exit


# ------------------------------------------------------------------ context

@dataclass(frozen=True)
class Settings:
    role: str                      # "head" or "worker"
    rejoin_timeout: float = defaults.REJOIN_TIMEOUT
    max_restarts: int = 3          # ends after the first one before the node stays out
    backoff_base: float = defaults.BACKOFF_BASE
    backoff_max: float = defaults.BACKOFF_MAX
    start_timeout: float = defaults.START_TIMEOUT

    def __post_init__(self) -> None:
        if self.role not in ("head", "worker"):
            raise ValueError(f"role={self.role!r}: must be 'head' or 'worker'")


@dataclass(frozen=True)
class Context:
    settings: Settings
    state: State
    since: float                              # when the current state began
    reason: str = ""
    head_job: str | None = None               # the head this node follows / is
    head_address: str | None = None
    node_id: str | None = None
    failures: int = 0                         # Ray ends under the current head
    restarts: int = 0                         # total restarts, for status
    next_retry_at: float | None = None
    drain_deadline: float | None = None
    no_head_since: float | None = None
    gave_up_on: str | None = None             # head job under which the node gave up
    history: tuple[str, ...] = field(default=())
    pointed_at: bool = False                  # head role: ray_head has named this head at least once

    def to(self, state: State, now: float, reason: str, **changes) -> "Context":
        entry = f"{self.state.value}->{state.value}: {reason}"
        return replace(self, state=state, since=now, reason=reason, history=(self.history + (entry,))[-20:],
                       **changes)


def initial(settings: Settings, now: float, own_job: str | None = None) -> tuple[Context, list[Action]]:
    """The first state. A head follows itself: ``head_job`` is its own job."""
    if settings.role == "head":
        return Context(settings, State.STARTING, now, "starting the head", head_job=own_job), [StartRay(None)]
    return Context(settings, State.WAITING_FOR_HEAD, now, "waiting for a head", no_head_since=now), []


def backoff_delay(settings: Settings, failures: int) -> float:
    """Delay before restart number ``failures`` (1, 2, 3...): it doubles each time."""
    return min(settings.backoff_max, settings.backoff_base * (2 ** max(0, failures - 1)))


def drain_deadline_for_signal(now: float, job_state: JobState | None, end_time: float | None) -> float:
    """When a signal-triggered drain must be finished.

    A running job with a known end time got the pre-walltime warning: drain
    until 15 s before the end. Anything else (the job is being cancelled or
    timed out, or Slurm did not answer) leaves a few seconds only.
    """
    if job_state is JobState.RUNNING and end_time is not None and end_time - WALLTIME_MARGIN > now:
        return end_time - WALLTIME_MARGIN
    return now + ENDING_GRACE


# ------------------------------------------------------------------ the step function

def step(ctx: Context, event: Event) -> tuple[Context, list[Action]]:
    """Apply one event; return the new context and the actions to carry out."""
    if ctx.state.is_terminal:
        return ctx, []
    if ctx.settings.role == "head":
        return _step_head(ctx, event)
    return _step_worker(ctx, event)


def _step_head(ctx: Context, event: Event) -> tuple[Context, list[Action]]:
    s = ctx.state
    if isinstance(event, RayJoined) and s is State.STARTING:
        return ctx.to(State.JOINED, event.now, "head ready", node_id=event.node_id), [PublishHead()]
    if isinstance(event, RayEnded):
        if s is State.DRAINING:
            return ctx.to(State.LEFT, event.now, f"drained: {event.detail}"), [StopRay(True), Exit(0)]
        if s is State.STARTING and ctx.restarts == 0:
            # Its first `ray start --head` ended before the head was ready: nothing was published, nobody
            # follows it, so one more start costs nobody anything. On a loaded node Ray's own wait for
            # its new GCS (30 s) can run out (seen on 2 busy cores: exit 1, "Timed out while waiting
            # for GCS to become available"). A second end is FAILED, as before.
            return (ctx.to(State.STARTING, event.now, f"head Ray start ended ({event.detail}); starting it once more",
                           restarts=1), [StopRay(False), StartRay(None)])
        return ctx.to(State.FAILED, event.now, f"head Ray stopped: {event.detail}"), [StopRay(False), Exit(1)]
    if isinstance(event, Tick) and s is State.STARTING and event.now - ctx.since > ctx.settings.start_timeout:
        return ctx.to(State.FAILED, event.now, "head did not become ready in time"), [StopRay(False), Exit(1)]
    if isinstance(event, DrainRequested) and s is State.STARTING:
        # Not published yet, so nobody follows it: nothing to hand over.
        return ctx.to(State.LEFT, event.now, f"drain before the head was ready: {event.reason}"), \
            [StopRay(True), Exit(0)]
    if isinstance(event, DrainRequested) and s is State.JOINED:
        # A head hands over: it stays until the session has moved the head
        # elsewhere (the pointer changes) or its deadline comes.
        return ctx.to(State.DRAINING, event.now, f"draining: {event.reason}", drain_deadline=event.deadline), []
    if isinstance(event, DrainRequested) and s is State.DRAINING and event.deadline < (ctx.drain_deadline or 1e300):
        return replace(ctx, drain_deadline=event.deadline), []
    if s is State.DRAINING:
        moved = isinstance(event, HeadSeen) and event.head_job is not None and event.head_job != ctx.head_job \
            and ctx.head_job is not None
        late = isinstance(event, Tick) and ctx.drain_deadline is not None and event.now >= ctx.drain_deadline
        if moved or late:
            why = f"head moved to {event.head_job}" if moved else "drain deadline reached"
            return ctx.to(State.LEFT, event.now, why), [StopRay(True), Exit(0)]
    if isinstance(event, HeadSeen) and event.head_job is not None and event.head_job == ctx.head_job \
            and not ctx.pointed_at:
        ctx = replace(ctx, pointed_at=True)
    if s is State.JOINED and ctx.pointed_at and isinstance(event, HeadSeen) and event.head_job is not None \
            and ctx.head_job is not None and event.head_job != ctx.head_job:
        # (A successor head starts while the pointer still names the old head:
        # only a head that was the session's head can have been replaced.)
        # The session elected another head without this one draining first
        # (its walltime was near, or it was judged lost): it serves nobody now.
        return ctx.to(State.LEFT, event.now, f"replaced by head {event.head_job}"), [StopRay(True), Exit(0)]
    if isinstance(event, ShutdownRequested):
        return ctx.to(State.LEFT, event.now, f"shutdown: {event.reason}"), [StopRay(True), Exit(0)]
    return ctx, []


def _leave(ctx: Context, now: float, reason: str, ray_running: bool) -> tuple[Context, list[Action]]:
    actions: list[Action] = [StopRay(True)] if ray_running else []
    return ctx.to(State.LEFT, now, reason), actions + [Exit(0)]


def _start(ctx: Context, now: float, job: str, address: str, *, following: bool, reason: str,
           stop_first: bool) -> tuple[Context, list[Action]]:
    new_head = job != ctx.head_job
    changes = dict(head_job=job, head_address=address, node_id=None, next_retry_at=None, no_head_since=None)
    if new_head:
        changes.update(failures=0, gave_up_on=None)
    actions: list[Action] = [StopRay(False)] if stop_first else []
    state = State.FOLLOWING if following else State.STARTING
    return ctx.to(state, now, reason, **changes), actions + [StartRay(address)]


def _step_worker(ctx: Context, event: Event) -> tuple[Context, list[Action]]:
    s = ctx.state
    now = event.now
    ray_running = s in (State.STARTING, State.FOLLOWING, State.JOINED, State.DRAINING)

    # Drain and shutdown first: they win over everything else.
    if isinstance(event, ShutdownRequested):
        return _leave(ctx, now, f"shutdown: {event.reason}", ray_running)
    if isinstance(event, DrainRequested):
        if s is State.JOINED and ctx.node_id:
            return (ctx.to(State.DRAINING, now, f"draining: {event.reason}", drain_deadline=event.deadline),
                    [DrainRay(ctx.node_id, event.deadline, event.reason)])
        if s is State.DRAINING:
            if event.deadline < (ctx.drain_deadline or 1e300):
                return replace(ctx, drain_deadline=event.deadline), []
            return ctx, []
        # Nothing runs here yet (or it is still starting): leave at once.
        return _leave(ctx, now, f"drain before joining: {event.reason}", ray_running)

    if s is State.DRAINING:
        if isinstance(event, RayEnded):
            return ctx.to(State.LEFT, now, f"node left after drain ({event.detail})"), [StopRay(True), Exit(0)]
        if isinstance(event, Tick) and ctx.drain_deadline is not None and now >= ctx.drain_deadline:
            return ctx.to(State.LEFT, now, "drain deadline reached; node stopped"), [StopRay(True), Exit(0)]
        if isinstance(event, HeadSeen) and not event.live:
            return ctx.to(State.LEFT, now, "head lost while draining"), [StopRay(False), Exit(0)]
        return ctx, []

    if isinstance(event, HeadSeen):
        return _worker_head_seen(ctx, event)

    if isinstance(event, RayJoined) and s in (State.STARTING, State.FOLLOWING):
        return ctx.to(State.JOINED, now, f"joined head {ctx.head_job}", node_id=event.node_id), []

    if isinstance(event, RayEnded) and s in (State.STARTING, State.FOLLOWING, State.JOINED):
        failures = ctx.failures + 1
        if failures > ctx.settings.max_restarts:
            return (ctx.to(State.GAVE_UP, now, f"Ray ended {failures} times under head {ctx.head_job} "
                                               f"({event.detail}); staying out until another head",
                           failures=failures, node_id=None, gave_up_on=ctx.head_job, next_retry_at=None),
                    [StopRay(False)])
        delay = backoff_delay(ctx.settings, failures)
        return (ctx.to(State.RESTART_BACKOFF, now, f"Ray ended ({event.detail}); restart in {delay:.0f}s",
                       failures=failures, node_id=None, next_retry_at=now + delay),
                [StopRay(False)])

    if isinstance(event, Tick):
        if s is State.RESTART_BACKOFF and ctx.next_retry_at is not None and now >= ctx.next_retry_at:
            assert ctx.head_job is not None and ctx.head_address is not None
            return (ctx.to(State.STARTING, now, f"restart {ctx.failures} of {ctx.settings.max_restarts}",
                           restarts=ctx.restarts + 1, next_retry_at=None),
                    [StartRay(ctx.head_address)])
        if s in (State.STARTING, State.FOLLOWING) and now - ctx.since > ctx.settings.start_timeout:
            return _step_worker(ctx, RayEnded(now, f"did not join within {ctx.settings.start_timeout:.0f}s"))
        if s in (State.WAITING_FOR_HEAD, State.GAVE_UP) and ctx.no_head_since is not None \
                and now - ctx.no_head_since >= ctx.settings.rejoin_timeout:
            return (ctx.to(State.RELEASED, now, f"no live head for {ctx.settings.rejoin_timeout:.0f}s; "
                                                "releasing the allocation"),
                    [Exit(0)])
    return ctx, []


def _worker_head_seen(ctx: Context, event: HeadSeen) -> tuple[Context, list[Action]]:
    s, now = ctx.state, event.now
    usable = event.live and event.head_job is not None and event.address is not None
    if not usable:
        # The head we follow (or the pointer) is gone. Leave at once rather
        # than waiting for Ray's own GCS reconnect timeout.
        no_head_since = ctx.no_head_since if ctx.no_head_since is not None else now
        if s in (State.STARTING, State.FOLLOWING, State.JOINED, State.RESTART_BACKOFF):
            return (ctx.to(State.WAITING_FOR_HEAD, now, f"head {ctx.head_job} lost", node_id=None,
                           next_retry_at=None, no_head_since=no_head_since),
                    [StopRay(False)] if s is not State.RESTART_BACKOFF else [])
        if ctx.no_head_since is None:
            return replace(ctx, no_head_since=now), []
        return ctx, []

    assert event.head_job is not None and event.address is not None
    same_head = event.head_job == ctx.head_job and event.address == ctx.head_address
    if s is State.GAVE_UP:
        if event.head_job == ctx.gave_up_on:
            return (replace(ctx, no_head_since=None), []) if ctx.no_head_since is not None else (ctx, [])
        return _start(ctx, now, event.head_job, event.address, following=True, stop_first=False,
                      reason=f"following new head {event.head_job}")
    if s is State.WAITING_FOR_HEAD:
        if event.head_job == ctx.gave_up_on:
            return ctx.to(State.GAVE_UP, now, f"head {event.head_job} is back; this node gave up on it",
                          no_head_since=None), []
        return _start(ctx, now, event.head_job, event.address, following=False, stop_first=False,
                      reason=f"head {event.head_job} is live at {event.address}")
    if same_head:
        return ctx, []
    # The pointer names another head (or the same job moved address): follow it.
    return _start(ctx, now, event.head_job, event.address, following=True,
                  stop_first=s in (State.STARTING, State.FOLLOWING, State.JOINED),
                  reason=f"following new head {event.head_job}")
