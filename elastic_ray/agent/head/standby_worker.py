"""A worker node joined to this node's standby head ahead of need.

After a head loss, the run's first task waits for a worker to join the new
head, and the first to join is the hosting node's own (``rejoin_order``).
That join was a fresh ``ray start``: about 4 s on the lab, most of the time a
relaunched payload waited. So while this node keeps a standby head, it also
keeps a second worker node joined to that standby (same CPUs, GPUs and
memory as the node's worker, its own ports, temp dir and log
``ray-<job>-<node>-worker-hosted.log``). Until a promotion its GCS has no
driver, so nothing runs there and the node's resources are not used twice.
When the standby becomes the run's head, the node's worker follows it by
taking this node over (:meth:`StandbyWorker.adopt`) instead of starting one:
it is in the new head's cluster already.

:func:`wanted` decides, from the hosted head's record and the node's
state, whether the warm worker should be kept; the agent asks at each turn
(``StandbyWorker.watch``) and drops it when not. The start runs on the
hosted-head thread right after the standby is ready; the take-over runs on
the effects thread (``Agent._start_ray``). ``ELASTIC_AGENT_STANDBY_WORKER=off``
turns it off (the standby alone, a fresh ``ray start`` after a promotion).
"""

from __future__ import annotations

import enum
import threading
import time
from typing import Callable

from ...protocol.disk.records import HostedHeadState
from ..machine import RayJoined
from ..node import join
from ..node.local_ray import LocalRay, RayHandle
from ..node.proc_watch import ProcWatch
from .hosted import Goal, Hosting

#: How long a take-over waits for a warm worker still joining before the node starts a fresh one.
ADOPT_WAIT = 10.0


class Verdict(str, enum.Enum):
    KEEP = "keep"
    DROP = "drop"


def wanted(h: Hosting, *, joined_own_head: bool, leaving: bool, ray_ended: bool) -> tuple[Verdict, str]:
    """Keep the warm worker, or drop it (and why)? Pure.

    Kept while this node holds a standby that is not being dropped, and after
    its promotion until the node's worker joined the head (it takes the warm
    worker over on the way, so one still here then was not taken).
    """
    if ray_ended:
        return Verdict.DROP, "its Ray ended"
    if leaving:
        return Verdict.DROP, "the allocation is leaving"
    if h.state is HostedHeadState.STANDBY and h.goal is not Goal.NONE:
        return Verdict.KEEP, ""
    if h.state is HostedHeadState.READY:
        if joined_own_head:
            return Verdict.DROP, "the node's worker joined the head without it"
        return Verdict.KEEP, ""
    if h.state is HostedHeadState.STANDBY:
        return Verdict.DROP, "the standby is being dropped"
    return Verdict.DROP, "no standby on this node"


class StandbyWorker:
    """The effect side: start, take over, drop (see the module docstring)."""

    def __init__(self, local: LocalRay, start_timeout: float, log: Callable[..., None], enabled: bool = True,
                 status_soon: Callable[[], None] = lambda: None):
        self.local = local
        self._status_soon = status_soon   # its join is in the status (``worker_pid``): the supervisor reads it
        self.start_timeout = start_timeout
        self.enabled = enabled
        self._log = log

    # ------------------------------------------------------------ the hosted-head thread
    def start(self, standby: RayHandle) -> None:
        """Join a worker to ``standby`` (just ready) and wait until it joined, failed or was dropped."""
        if not self.enabled or self.local.warm is not None:
            return
        handle = self.local.launch(standby.address, None, "worker", warm=True)
        if handle is None:
            return
        try:
            joined = join.wait_joined(handle.node, handle.address, handle.temp_dir, handle.started,
                                      handle.started + self.start_timeout,
                                      cancelled=lambda: self.local.warm is not handle, log=self._log)
            if joined is None:
                return   # dropped meanwhile: whoever dropped it stops it
            if joined.node_id and handle.node.poll_exit() is None:
                handle.raylet = ProcWatch.find(handle.node.raylet_pid())
                handle.node_id = joined.node_id
                self._log("standby_worker_joined", node_id=joined.node_id, pid=handle.node.pid,
                          seconds=f"{time.time() - handle.started:.2f}")
                self._status_soon()
            else:
                self.drop("it did not join", handle)
        finally:
            handle.settled.set()

    # ------------------------------------------------------------ the effects thread
    def adopt(self, head_address: str | None, generation: int, cancelled: Callable[[], bool]) -> RayJoined | None:
        """The node's worker follows the head this node hosts: take the warm
        worker over if it is joined to that head (waiting up to ADOPT_WAIT for
        one still joining). None: start a fresh worker instead."""
        handle = self.local.warm
        if handle is None or head_address is None or handle.address != head_address:
            return None
        t0 = time.time()
        while not handle.settled.wait(0.05):
            if cancelled() or self.local.warm is not handle or time.time() - t0 > ADOPT_WAIT:
                return None
        if not handle.node_id or handle.ended() or not self.local.adopt_warm(handle, generation):
            return None
        self._log("standby_worker_adopted", node_id=handle.node_id, waited=f"{time.time() - t0:.2f}s")
        return RayJoined(time.time(), handle.node_id)

    # ------------------------------------------------------------ any thread
    def watch(self, h: Hosting, *, joined_own_head: bool, leaving: bool) -> None:
        """At the loop's turn: drop the warm worker once it is not wanted (on a thread of its own)."""
        handle = self.local.warm
        if handle is None:
            return
        verdict, why = wanted(h, joined_own_head=joined_own_head, leaving=leaving, ray_ended=handle.ended())
        if verdict is Verdict.DROP and self.local.take_warm(handle) is not None:
            # Promoted, its node is in the run's cluster: the head hears it is gone.
            report = h.state is HostedHeadState.READY
            threading.Thread(target=self._stop, args=(handle, why, report), name="agent-standby-worker",
                             daemon=True).start()

    def drop(self, why: str, handle: RayHandle | None = None) -> None:
        """Stop the warm worker (``handle`` only, when given) on this thread."""
        taken = self.local.take_warm(handle)
        if taken is not None:
            self._stop(taken, why)

    def _stop(self, handle: RayHandle, why: str, report: bool = False) -> None:
        if not report:
            handle.node_id = None   # its GCS is an unpromoted standby's: nobody there to tell
        self.local.stop(handle, graceful=False)
        self._log("standby_worker_dropped", why=why)
        self._status_soon()
