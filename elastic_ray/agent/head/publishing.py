"""Publishing a head this agent serves (its head role's, or a hosted head):
the endpoint file workers find it by, and the heartbeat they watch.

Threads: the heartbeat socket is created and used by the event loop only
(beats, the last beat at exit); the endpoint is written by the loop (head
role) or by the hosted-head thread, which reads only the socket's endpoint,
fixed once the socket exists (it is created before that thread starts).
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import zmq

from ...protocol.wire.channel import HeartbeatPublisher
from ...protocol.disk.records import HeadEndpoint, NodeState
from ...protocol.disk.session_dir import SessionDir
from ..node.local_ray import RayHandle, NodePlace
from .rejoin_order import read_boot_id
from ..status import REFRESH_SECONDS, STATUS_SLACK

log = logging.getLogger("elastic_ray.agent")

# How soon a session-directory write that failed is tried again.
WRITE_RETRY_SECONDS = 1.0


class HeadPublishing:
    def __init__(self, session: SessionDir, secret: bytes, place: NodePlace, zctx: zmq.Context, control_endpoint: str,
                 log: Callable[..., None], *, heartbeat: bool):
        self.session = session
        self.secret = secret
        self.place = place
        self.zctx = zctx
        self.control_endpoint = control_endpoint
        self._log = log
        self.publisher: HeartbeatPublisher | None = None
        self._said: tuple[bool, bool] | None = None   # (ok, draining) of the last beat
        self.endpoint_write = RetriedWrite("head_endpoint", log)
        self._pending_endpoint: RayHandle | None = None
        self._endpoint_retry_at = 0.0
        if heartbeat:
            self.ensure()

    def ensure(self) -> None:
        """Bind the heartbeat socket (once): before any endpoint names its port."""
        if self.publisher is None:
            self.publisher = HeartbeatPublisher(self.secret, self.place.session_id, self.place.node_ip,
                                                context=self.zctx)

    def changed(self, ok: bool, draining: bool) -> bool:
        """Whether a beat now would say something the last one did not."""
        return self.publisher is not None and (ok, draining) != self._said

    def beat(self, ok: bool, draining: bool) -> None:
        if self.publisher is not None:
            self.publisher.publish({"head_job": self.place.job_id, "ray_ok": ok, "draining": draining})
            self._said = (ok, draining)
        pending = self._pending_endpoint
        if pending is not None and time.monotonic() >= self._endpoint_retry_at:
            self.publish_endpoint(pending)

    def publish_endpoint(self, handle: RayHandle) -> bool:
        """The head role's endpoint write, from the event loop: one that fails
        (a full disk) is written again at a later heartbeat, never lost and
        never fatal. The hosted head's thread calls ``write_endpoint`` itself."""
        if self.endpoint_write.run(lambda: self.write_endpoint(handle)):
            self._pending_endpoint = None
            return True
        self._pending_endpoint, self._endpoint_retry_at = handle, time.monotonic() + WRITE_RETRY_SECONDS
        return False

    def write_endpoint(self, handle: RayHandle) -> None:
        assert self.publisher is not None
        p = self.place
        ports = {k: v for k, v in handle.ports.items() if isinstance(v, int) and v > 0}
        ports["gcs_port"] = int(handle.address.rpartition(":")[2]) if handle.address else ports.get("gcs_port", 0)
        ports["heartbeat"] = int(self.publisher.endpoint.rpartition(":")[2])
        ports["control"] = int(self.control_endpoint.rpartition(":")[2])
        endpoint = HeadEndpoint(job_id=p.job_id, host=p.node, address=f"{p.node_ip}:{ports['gcs_port']}",
                                ray_version=_ray_version(), started_at=time.time(), ports=ports,
                                boot_id=read_boot_id(), dashboard=_dashboard(handle))
        self.session.write_head_endpoint(endpoint)
        self._log("head_published", address=endpoint.address, dashboard=endpoint.dashboard or "off")

    def close(self) -> None:
        if self.publisher is None:
            return
        # A last heartbeat saying the head is down: followers leave now
        # instead of after head_lost_after of silence plus a GCS probe.
        # The socket drops what is unsent when it closes, so give its I/O
        # thread a moment to hand the frame to TCP.
        try:
            self.publisher.publish({"head_job": self.place.job_id, "ray_ok": False, "draining": True})
            time.sleep(0.1)
        except Exception as exc:
            log.warning("event=last_heartbeat_failed job=%s error=%s", self.place.job_id, exc)
        self.publisher.close()


def _dashboard(handle: RayHandle) -> str | None:
    """The dashboard's ``ip:port`` as the node was started with it; None when off."""
    command = handle.node.command
    return None if command is None else command.dashboard_address


def _ray_version() -> str:
    # Imported here: importlib.metadata (and the email package it pulls in)
    # is needed only once Ray runs, never on the way to `ray start`.
    from importlib import metadata

    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return "unknown"


class RetriedWrite:
    """A session-directory write that must not be lost to a passing failure
    (a full filesystem, an NFS server that is away): a failed write is kept
    as due and done again at the agent's next tick; one event when a streak
    of failures starts and one when it ends, never one per tick. The agent
    keeps running either way.

    Threads: used by the event loop only.
    """

    def __init__(self, what: str, log: Callable[..., None]):
        self.what = what
        self._log = log
        self.failures = 0

    @property
    def due(self) -> bool:
        return self.failures > 0

    def run(self, write: Callable[[], None]) -> bool:
        """Do ``write`` now; True when it went through."""
        try:
            write()
        except OSError as exc:
            self.failures += 1
            if self.failures == 1:
                self._log(f"{self.what}_write_failed", error=str(exc)[:300], action="retrying at each tick")
            return False
        if self.failures:
            self._log(f"{self.what}_written", failed_tries=self.failures)
            self.failures = 0
        return True


class NodeFile:
    """This agent's node file in the session directory (``jobs/<job>/nodes/<node>.json``).

    Written at every state change, fsynced (a state is a fact other
    processes act on), and rewritten every ``refresh`` s in between, not
    fsynced: only ``updated_at`` moves then, and it is what tells a reader
    (``session status``) that the agent still runs. Without the refresh an
    idle JOINED agent looked hung after 30 s. The refresh rides on the
    agent's periodic status write (``agent.status.REFRESH_SECONDS``, up to
    ``slack`` early), so it adds no wakeup. A failed write is retried
    (:class:`RetriedWrite`).

    Threads: used by the event loop only.
    """

    def __init__(self, session: SessionDir, log: Callable[..., None], refresh: float = REFRESH_SECONDS,
                 slack: float = STATUS_SLACK):
        self.session = session
        self.write = RetriedWrite("node_file", log)
        self.refresh = refresh
        self.slack = slack
        self._next = 0.0

    def publish(self, state: NodeState, now: float, changed: bool) -> bool:
        """Write ``state`` if it ``changed``, a write is due again, or the refresh is due;
        False when a write failed (it is due again)."""
        if not (changed or self.write.due or now >= self._next - self.slack):
            return True
        durable = changed or self.write.due
        if not self.write.run(lambda: self.session.write_node_state(state, durable=durable)):
            return False
        self._next = now + self.refresh
        return True
