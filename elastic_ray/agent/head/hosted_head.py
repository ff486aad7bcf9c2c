"""Hosting the run's head on this node: the effect side of :mod:`agent.head.hosted`.

Threads: the record (``agent.head.hosted.Hosting``, immutable) is changed by the
event loop (a ``host_head``, ``standby_head`` or ``drop_standby`` request, the
head's Ray ending, the hand-over) and by the ``agent-hosted-head`` thread (the
start's outcome; also the standby's promotion and drop), each through the
pure step under ``_lock``; readers take the current record without it. Each
caller carries out the actions of its own step on its own thread: the start's
thread writes the endpoint or kills a head that did not start (slow work the
loop must not wait for), the loop publishes the status and exits. The Ray
node itself is held by ``agent.node.local_ray`` (``LocalRay.hosted``, under its
lock).
"""

from __future__ import annotations

import shutil
import threading
import time
from typing import Callable

from ..node import join
from .hosted import (
    Goal,
    HostedState,
    DropRequested,
    EndpointWritten,
    ExitWanted,
    HandoverTick,
    HostedAction,
    HostedEvent,
    HostedKilled,
    HostedRayEnded,
    HostedStarted,
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
    step,
    watched,
)
from ..node.local_ray import LocalRay, RayHandle
from ..node.proc_watch import ProcWatch
from .publishing import WRITE_RETRY_SECONDS, RetriedWrite
from .standby_worker import StandbyWorker
from ..machine import Exit, State


class HostedHead:
    def __init__(self, settings: HostSettings, local: LocalRay, start_timeout: float, *,
                 log: Callable[..., None], ensure_publisher: Callable[[], None],
                 write_endpoint: Callable[[RayHandle], None], publish_status: Callable[[], None],
                 status_soon: Callable[[], None], standby_worker: bool = True):
        self.local = local
        # A worker joined to the standby ahead of need (agent.head.standby_worker).
        # (not with hash_jobid: its worker ports are the node's worker's, one block per role)
        self.worker = StandbyWorker(local, start_timeout, log, status_soon=status_soon,
                                    enabled=standby_worker and settings.port_strategy == "random")
        self.start_timeout = start_timeout
        self._log = log
        self._ensure_publisher = ensure_publisher
        self._write_endpoint = write_endpoint
        self._publish_status = publish_status
        self._status_soon = status_soon
        self._lock = threading.Lock()
        self._record = Hosting(settings)

    @property
    def record(self) -> Hosting:
        return self._record

    def status(self) -> dict | None:
        """The ``hosted_head`` entry of the agent's status; a standby's names
        its worker once that joined (``worker_pid``)."""
        entry = self._record.as_status()
        warm = self.local.warm
        if entry is not None and self._record.state is HostedState.STANDBY and warm is not None and warm.node_id:
            entry["worker_pid"] = warm.node.pid
        return entry

    def heartbeat(self, node_state: State) -> tuple[bool, bool]:
        return heartbeat(self._record, node_state)

    # ------------------------------------------------------------ event loop
    def request(self, now: float) -> dict:
        """Answer a ``host_head`` request (starting the head, or promoting the standby, if need be)."""
        return self._reply(HostRequested(now))

    def standby(self, now: float) -> dict:
        """Answer a ``standby_head`` request (starting the standby if need be)."""
        return self._reply(StandbyRequested(now))

    def drop(self, now: float) -> dict:
        """Answer a ``drop_standby`` request (killing the standby, if there is one)."""
        return self._reply(DropRequested(now))

    def _reply(self, event: HostedEvent) -> dict:
        return next(a.body for a in self._handle(event) if isinstance(a, Reply))

    def watch(self, now: float, joined_own_head: bool = False, leaving: bool = False) -> None:
        """Notice that the Ray of a ready hosted head (or of the standby) ended;
        drop the standby's warm worker once it is not wanted."""
        handle = self.local.hosted
        if handle is not None and watched(self._record) and handle.node.poll_exit() is not None:
            self._handle(HostedRayEnded(now))
        self.worker.watch(self._record, joined_own_head=joined_own_head, leaving=leaving)

    def exit_wanted(self, now: float, code: int, drain_deadline: float | None,
                    read_pointer: Callable[[], str | None]) -> int | None:
        """The exit code to leave with now, or None while the head is handed over."""
        hosting_node = self.local.hosted is not None
        pointer = read_pointer() if may_serve(self._record, hosting_node) else None
        return _exit_code(self._handle(ExitWanted(now, code, drain_deadline, hosting_node, pointer)))

    def check_handover(self, now: float, head_job: str | None) -> int | None:
        """During a hand-over: the exit code once the head moved, failed, or the deadline came."""
        if self._record.handover is None:
            return None
        return _exit_code(self._handle(HandoverTick(now, head_job)))

    # ------------------------------------------------------------ both threads
    def _handle(self, event: HostedEvent, handle: RayHandle | None = None) -> list[HostedAction]:
        """Step, then carry out the actions; ``handle``: the node a start's outcome is about."""
        with self._lock:
            self._record, actions = step(self._record, event)
        for action in actions:
            if isinstance(action, StartHostedHead):
                self._ensure_publisher()
                threading.Thread(target=self._start, name="agent-hosted-head", daemon=True).start()
            elif isinstance(action, WriteEndpoint) and handle is not None:
                if self._write_endpoint_until_done(handle):
                    self._handle(EndpointWritten(time.time(), handle.address))
            elif isinstance(action, KillHostedHead) and handle is not None:
                self.local.kill_hosted(handle)
                self._handle(HostedKilled(time.time()))
            elif isinstance(action, (PromoteStandby, KillStandby)):
                # The standby's node is the one ``local.hosted`` holds (its start put it there).
                work = self._promote if isinstance(action, PromoteStandby) else self._kill_standby
                threading.Thread(target=work, args=(self.local.hosted,), name="agent-hosted-head",
                                 daemon=True).start()
            elif isinstance(action, Log):
                self._log(action.event, **dict(action.fields))
            elif isinstance(action, PublishStatus):
                self._publish_status()
            elif isinstance(action, StatusSoon):
                self._status_soon()
        return actions

    # ------------------------------------------------------------ the hosted-head thread
    def _write_endpoint_until_done(self, handle: RayHandle) -> bool:
        """Publish the endpoint, again each second while it fails (a full
        disk) and the hosted node still runs: a passing failure must not cost
        the run its head. False when the node ended first."""
        retried = RetriedWrite("hosted_endpoint", self._log)
        while not retried.run(lambda: self._write_endpoint(handle)):
            if handle.node.poll_exit() is not None or not self.local.current(None):
                return False
            time.sleep(WRITE_RETRY_SECONDS)
        return True

    def _promote(self, handle: RayHandle | None) -> None:
        """The standby becomes the run's head: its endpoint, no `ray start`. A
        node that ended meanwhile is noticed by ``watch`` (FAILED)."""
        if handle is not None and self._write_endpoint_until_done(handle):
            self._handle(EndpointWritten(time.time(), handle.address))

    def _kill_standby(self, handle: RayHandle | None) -> None:
        self.worker.drop("the standby is dropped")
        if handle is not None:
            self.local.kill_hosted(handle)
            shutil.rmtree(handle.temp_dir, ignore_errors=True)   # a run may move its standby many times
        self._handle(HostedKilled(time.time()))

    def _start(self) -> None:
        handle = self.local.launch(None, None, "head")
        if handle is None:
            return
        up = join.wait_gcs_open(handle.node, handle.address, handle.started + self.start_timeout,
                                cancelled=lambda: not self.local.current(None))
        if up is None:
            return  # the agent is exiting; its shutdown stops the node
        if up and self._record.goal is Goal.STANDBY:
            # A standby is ready once a worker can join it without a stall:
            # its raylet registered (see join.HEAD_REGISTERED_WAIT). It starts
            # ahead of need, so this wait costs the run nothing; a head
            # wanted now is published at once (its own node's worker waits
            # for the registration instead, see Agent._start_ray).
            t0 = time.time()
            registered = join.wait_head_registered(
                handle.node, join.STANDBY_REGISTERED_WAIT, cancelled=lambda: not self.local.current(None),
                still_needed=lambda: self._record.goal is Goal.STANDBY)
            if registered is None:
                return
            if registered or self._record.goal is Goal.STANDBY:
                self._log("standby_head_registered" if registered else "standby_head_not_registered",
                          waited=f"{time.time() - t0:.2f}s")
        handle.raylet = ProcWatch.find(handle.node.raylet_pid())
        self._handle(HostedStarted(time.time(), handle.address, up and handle.node.poll_exit() is None,
                                   handle.node.pid), handle)
        if self._record.state is HostedState.STANDBY and self.local.hosted is handle:
            self.worker.start(handle)


def _exit_code(actions: list[HostedAction]) -> int | None:
    return next((a.code for a in actions if isinstance(a, Exit)), None)
