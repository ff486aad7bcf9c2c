"""When a Ray node this agent started counts as joined (or, for a hosted head, ready).

Runs on the thread that started the node (the effects thread, or the hosted
head's own thread) and writes nothing shared but the handle's ``raylet``
(set once). ``cancelled`` is asked on every turn, so a stop that supersedes
the start ends the wait at once (whoever superseded it then holds the node
and stops it).

A node counts as joined once its raylet registered with the GCS: the raylet
logs that in its registration callback (``RayNode.registered_node_id``), so
the agent learns it as soon as the GCS lists the node ALIVE, without a GCS
round trip. Fallbacks, should a Ray version log differently: `ray start`'s
start-up line (printed only after the GCS listed the node) plus the id the
raylet logged, then a GCS probe. The agent does not probe before the start-up
line: each probe is a Python process importing Ray (about 1 s of CPU), which
would compete with `ray start` itself on a small node. A Ray that never
prints the line is probed after ``PROBE_WITHOUT_STARTUP_LINE_AFTER`` anyway.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Callable

from ...polling import wait_for
from . import gcs
from .local_ray import LocalRay
from ..machine import RayEnded, RayJoined
from .proc_watch import ProcWatch
from .ray_node import RayNode

PROBE_WITHOUT_STARTUP_LINE_AFTER = 20.0
PROBE_INTERVAL = 0.5
# How long `ray start` may print nothing the agent recognises after its
# start-up line before the agent asks the GCS instead.
LOGGED_ID_GRACE = 2.0
# A joining `ray start` asks the GCS for the head node (its temp and session
# dirs) and, when no head node is listed yet, sleeps 2 s before it asks again.
# A head's raylet registers a moment after its process starts: a worker that
# starts inside that moment loses 2 s (measured on the lab: every hosting
# node's worker after an election, and every early promoted standby, issue
# 26). Waiting for the registration costs a fraction of that. After
# HEAD_REGISTERED_WAIT without the raylet's line (another log format, a slow
# head) the start goes ahead as before: waiting longer than Ray's own pause
# would cost more than it saves. A standby, started ahead of need, waits up
# to STANDBY_REGISTERED_WAIT before it counts as ready.
HEAD_REGISTERED_WAIT = 3.0
STANDBY_REGISTERED_WAIT = 10.0
HEAD_REGISTERED_RECHECK = 0.05


@dataclass(frozen=True)
class Joined:
    node_id: str | None        # None: the node exited or the start timed out
    how: str = "gcs"           # where the id was seen, for the log


def start_and_join(local: LocalRay, head_address: str | None, generation: int, role: str, start_timeout: float,
                   log: Callable[..., None]) -> RayJoined | RayEnded | None:
    """On the effects thread: start the node's Ray and wait until it joined;
    the event to post, or None if a stop superseded the start (the stop then
    holds the node and stops it)."""
    handle = local.launch(head_address, generation, role)
    if handle is None:
        return None
    joined = wait_joined(handle.node, handle.address, handle.temp_dir, handle.started, handle.started + start_timeout,
                         cancelled=lambda: not local.current(generation), log=log)
    if joined is None:
        return None
    handle.raylet = ProcWatch.find(handle.node.raylet_pid())
    if joined.node_id:
        if role == "worker":   # the node a worker agent reports gone after stopping it (agent.head.node_gone)
            handle.node_id = joined.node_id
        log("ray_joined", node_id=joined.node_id, seconds=f"{time.time() - handle.started:.2f}",
            raylet_pid=handle.raylet.pid if handle.raylet else "-", seen_in=joined.how)
        return RayJoined(time.time(), joined.node_id)
    rc = handle.node.poll_exit()
    return RayEnded(time.time(), f"did not join (ray start exit {rc}); see {handle.log_path}")


def wait_joined(node: RayNode, address: str | None, temp_dir: str, started: float, deadline: float,
                cancelled: Callable[[], bool], log: Callable[..., None]) -> Joined | None:
    """Wait until ``node`` joined, exited, or ``deadline`` passed; None if cancelled."""
    next_probe = 0.0
    logged_checked, finished_seen = False, 0.0
    while time.time() < deadline:
        if node.poll_exit() is not None:
            break
        if cancelled():
            return None
        now = time.time()
        node_id = node.registered_node_id()
        if node_id:
            return Joined(node_id, "raylet registered")
        finished = node.startup_finished()
        if finished and not logged_checked:
            # `ray start` printed its start-up line only once the GCS listed
            # the node: the id its raylet logged is the one joined. (No such
            # line within 2 s, say a new log format: ask the GCS.)
            finished_seen = finished_seen or now
            node_id = node.logged_node_id()
            if node_id:
                return Joined(node_id, "raylet log")
            logged_checked = now - finished_seen > LOGGED_ID_GRACE
        ready = finished or now - started > PROBE_WITHOUT_STARTUP_LINE_AFTER
        if ready and (logged_checked or not finished) and now >= next_probe:
            next_probe = now + PROBE_INTERVAL
            try:
                # A head's own raylet registers like any node, so both roles
                # learn their node id the same way once the GCS lists it.
                node_id = gcs.own_node_id(address, temp_dir, timeout=10)
            except gcs.ProbeError as exc:
                log("probe_failed", error=str(exc)[:200])
            if node_id:
                return Joined(node_id, "gcs")
        time.sleep(0.1)
    return Joined(None)


def wait_gcs_open(node: RayNode, address: str | None, deadline: float,
                  cancelled: Callable[[], bool]) -> bool | None:
    """A hosted head is ready for workers once its GCS accepts connections
    and the head's `ray start` wrote the cluster's facts (session name and
    the like) into the GCS: a joining `ray start` reads them first and, when
    they are missing, sleeps 2 s before each new try (measured on the lab:
    the hosting node's worker stalled 4 s that way right after a failover).
    The head's raylet is started only after that write, so a running raylet
    says it was done, without a GCS client here. Publishing then still
    overlaps the workers' start-up with the rest of the head's. True once
    ready, False if `ray start` exited or the deadline passed, None if
    cancelled."""
    while time.time() < deadline:
        if node.poll_exit() is not None:
            break
        if cancelled():
            return None
        if port_open(address) and node.raylet_pid() is not None:
            return True
        time.sleep(0.1)
    return False


def wait_head_registered(node: RayNode, timeout: float, cancelled: Callable[[], bool],
                         still_needed: Callable[[], bool] = lambda: True) -> bool | None:
    """Wait until the head ``node``'s raylet registered with its GCS (see
    HEAD_REGISTERED_WAIT): True once it did, False when its ``ray start``
    exited, the time ran out or the wait is ``still_needed`` no more, None if
    cancelled."""
    def look() -> str:
        if cancelled():
            return "cancelled"
        if node.registered_node_id() is not None:
            return "registered"
        if node.poll_exit() is not None or not still_needed():
            return "over"
        return ""   # look again

    seen = wait_for(look, timeout=timeout, interval=HEAD_REGISTERED_RECHECK, what="the head's raylet to register",
                    raising=False)
    if seen == "cancelled":
        return None
    return seen == "registered"


def hosted_head_registered(local: LocalRay, generation: int, log: Callable[..., None]) -> bool:
    """Before this node's worker joins the head this node hosts: wait until
    that head's raylet registered (HEAD_REGISTERED_WAIT at most). False when
    the start was superseded meanwhile."""
    hosted = local.hosted
    if hosted is None:
        return True
    t0 = time.time()
    registered = wait_head_registered(hosted.node, HEAD_REGISTERED_WAIT, cancelled=lambda: not local.current(generation))
    if registered is None:
        return False
    log("hosted_head_registered" if registered else "hosted_head_not_registered",
        waited=f"{time.time() - t0:.2f}s")
    return True


def port_open(address: str | None, timeout: float = 0.5) -> bool:
    if not address:
        return False
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False
