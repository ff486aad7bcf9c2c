"""What an agent adds to its session's event log: its start, its joins, drains and its end.

:func:`transition_kinds` decides which state changes of the agent's machine
are history (a pure table); :class:`AgentHistory` writes them. The agent's
loop calls it at its start, at every state change and at its exit.

An agent waits at most :data:`LOCK_WAIT` for the log's lock: it writes from
its main loop, which also answers heartbeats and requests, and an event is
worth less than a heartbeat (without the lock the one write is still whole
on a local filesystem).
"""

from __future__ import annotations

from typing import Any

from ..protocol.disk import event_log
from ..protocol.disk.events import EventKind, EventSource
from ..protocol.disk.records import AgentState, GpuUsage

LOCK_WAIT = 0.2


def transition_kinds(previous: AgentState, new: AgentState) -> tuple[EventKind, ...]:
    """The events a change of the agent's state is (none for most changes).

    Joining (the first time, or again after a restart or a new head) is
    ``node_joined``; entering DRAINING is a ``drain_requested`` of this node;
    LEFT after DRAINING is ``drain_finished``; every terminal state is
    ``node_left``: the node is out of the run from then on, although its
    agent may live on for a moment (reporting the node gone, stopping Ray).
    """
    if new is previous:
        return ()
    if new is AgentState.JOINED:
        return (EventKind.NODE_JOINED,)
    if new is AgentState.DRAINING:
        return (EventKind.DRAIN_REQUESTED,)
    if new.is_terminal:
        drained = previous is AgentState.DRAINING and new is AgentState.LEFT
        return (EventKind.DRAIN_FINISHED, EventKind.NODE_LEFT) if drained else (EventKind.NODE_LEFT,)
    return ()


class AgentHistory:
    """One agent's writer of events: its session, job and node fixed once."""

    def __init__(self, session: str, job: str, node: str, role: str) -> None:
        self.session, self.job, self.node, self.role = session, job, node, role
        self._left = False

    def _emit(self, kind: EventKind, reason: str | None = None, **details: Any) -> None:
        event_log.emit(self.session, kind, EventSource.AGENT, job=self.job, node=self.node, reason=reason,
                       lock_wait=LOCK_WAIT, **details)

    def started(self, pid: int) -> None:
        self._emit(EventKind.STARTED, role=self.role, pid=pid)

    def oom_killed(self, kills: int, new: int) -> None:
        """The kernel's OOM killer ended ``new`` more processes of this job on this node (``kills`` so far)."""
        self._emit(EventKind.OOM_KILLED, reason="over the job's memory grant", kills=kills, new=new)

    def transition(self, previous: AgentState, new: AgentState, reason: str, *, head_job: str | None,
                   ray_node_id: str | None, hosted: bool = False, gpu_usage: GpuUsage | None = None) -> None:
        for kind in transition_kinds(previous, new):
            if kind is EventKind.NODE_JOINED:
                self._emit(kind, reason, ray_node_id=ray_node_id, head_job=head_job, hosted=hosted)
            elif kind is EventKind.NODE_LEFT:
                self._left_event(new, reason, None, gpu_usage)
            else:
                self._emit(kind, reason)

    def exited(self, state: AgentState, reason: str, exit_code: int | None,
               gpu_usage: GpuUsage | None = None) -> None:
        """The agent's end: ``node_left`` unless a terminal state already said so."""
        self._left_event(state, reason, exit_code, gpu_usage)

    def _left_event(self, state: AgentState, reason: str, exit_code: int | None, gpu_usage: GpuUsage | None) -> None:
        if not self._left:
            self._left = True
            measured = {} if gpu_usage is None else {
                "gpu_held_seconds": round(gpu_usage.held_gpu_seconds, 3),
                "gpu_idle_seconds": round(gpu_usage.idle_gpu_seconds, 3), "gpu_samples": gpu_usage.samples}
            self._emit(EventKind.NODE_LEFT, reason, state=state.value, exit_code=exit_code, **measured)
