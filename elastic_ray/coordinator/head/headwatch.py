"""Observe the current head through its signed heartbeat.

The head's agent publishes a heartbeat every second saying whether its Ray
runs and whether it drains. Subscribing to it tells a coordinator within
two seconds that the head is gone, with no Slurm query and no Ray import,
which is what lets a run notice head loss with no caller waiting. A head
agent that dies (even by SIGKILL) is seen at once: the kernel closes its
connection and the subscriber's link watch (``protocol.wire.link_watch``) sees
the drop; a head whose node vanished sends nothing, and is seen by the
silence of its heartbeat.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

import zmq

from ...protocol.wire.channel import ControlClient, ControlError, HeartbeatSubscriber
from ...protocol.wire.head_status import head_draining, head_serves
from ...protocol.wire.link_watch import link_dropped
from ...errors import SessionDirError
from ...protocol.disk.recovery import pointer_to_restore
from ...protocol.disk.session_dir import SessionDir

log = logging.getLogger(__name__)

HEAD_LOST_AFTER = 2.0


@dataclass(frozen=True)
class HeadObservation:
    job: str | None            # what ray_head names
    address: str | None        # its GCS address, once published
    alive: bool                # a heartbeat with ray_ok within HEAD_LOST_AFTER
    draining: bool
    last_beat_age: float | None


class HeadWatch:
    """Follows ``ray_head`` and listens to that head's heartbeat. Thread-safe."""

    def __init__(self, directory: SessionDir, secret: bytes, session_id: str,
                 lost_after: float = HEAD_LOST_AFTER):
        self.dir = directory
        self.secret = secret
        self.session_id = session_id
        self.lost_after = lost_after
        self._lock = threading.Lock()
        self._job: str | None = None
        self._address: str | None = None
        self._sub: HeartbeatSubscriber | None = None
        self._control: str | None = None   # the watched head agent's control endpoint
        self._subscribed_at = 0.0
        self._last_beat: float | None = None
        self._ok = False
        self._draining = False
        self._ctx = zmq.Context.instance()
        self._pointer_failed = False

    def _follow_pointer(self) -> None:
        job, damaged = self.dir.ray_head_state()
        if damaged:
            # Unknown, not "no head": a garbage pointer must not read as a
            # lost head (which would start an election). Put it back instead.
            self._restore_pointer()
            job = self._job
        if job != self._job:
            self._close_sub()
            self._job, self._address, self._last_beat, self._ok, self._draining = job, None, None, False, False
        if self._job is not None and self._sub is None:
            try:
                endpoint = self.dir.read_head_endpoint(self._job)
                if endpoint is None or "heartbeat" not in endpoint.ports:
                    return
                host = endpoint.address.rpartition(":")[0]
                sub = HeartbeatSubscriber(f"tcp://{host}:{endpoint.ports['heartbeat']}", self.secret,
                                          self.session_id, context=self._ctx, watch_link=True)
            except (zmq.ZMQError, OSError) as exc:   # e.g. out of descriptors: no beat heard, try next time
                log.warning("event=head_subscribe_failed head_job=%s error=%s", self._job, exc)
                return
            self._address, self._sub, self._subscribed_at = endpoint.address, sub, time.time()
            self._control = f"tcp://{host}:{endpoint.ports['control']}" if "control" in endpoint.ports else None

    def _restore_pointer(self) -> None:
        """Rewrite a damaged ``ray_head`` from allocation.json's head
        (``recovery.pointer_to_restore`` decides); one event when it is done,
        one when it cannot be (then it is tried again at the next look)."""
        try:
            job = pointer_to_restore(self.dir.ray_head_state()[1], self.dir.read_allocation(), time.time())
            if job is None:
                return
            self.dir.write_ray_head(job)
        except (SessionDirError, OSError) as exc:
            if not self._pointer_failed:
                log.warning("event=ray_head_not_restored path=%s error=%s", self.dir.ray_head_file, exc)
            self._pointer_failed = True
            return
        self._pointer_failed = False
        log.warning("event=ray_head_restored path=%s head_job=%s source=%s", self.dir.ray_head_file, job,
                    self.dir.allocation_file)

    def _read(self, wait: float, until_first: bool = False) -> None:
        """Listen up to ``wait`` s; with ``until_first``, stop at the first
        beat; stop at once when the head's connection drops."""
        sub = self._sub
        if sub is None:
            if wait > 0:
                time.sleep(min(wait, 0.2))
            return
        poller = zmq.Poller()
        poller.register(sub.socket, zmq.POLLIN)
        if sub.link is not None and sub.link.socket is not None:
            poller.register(sub.link.socket, zmq.POLLIN)
        deadline = time.time() + wait
        while True:
            news = False
            envelope = sub.poll(0)
            if envelope is not None and envelope.body.get("head_job") == self._job:
                body = envelope.body
                changed = (bool(body.get("ray_ok")), bool(body.get("draining"))) != (self._ok, self._draining)
                self._last_beat = time.time()
                self._ok = bool(body.get("ray_ok"))
                self._draining = bool(body.get("draining"))
                news = until_first or changed
            # After the beats: a dead head's last beats must not seem newer than its drop.
            if sub.link is not None and sub.link.read(time.time()):
                news = news or self._link_down()
            remaining = deadline - time.time()
            if news or remaining <= 0:
                return   # news: let the caller act on it now
            if envelope is None:
                poller.poll(max(1, int(remaining * 1000)))

    def _link_down(self) -> bool:
        link = self._sub.link if self._sub is not None else None
        return link is not None and link_dropped(link.dropped_at, self._last_beat)

    def observe(self, wait: float = 0.0) -> HeadObservation:
        """Current view; ``wait`` seconds are spent listening first.

        Right after subscribing, no heartbeat can have arrived yet, so the
        first observation waits up to ``lost_after`` for one rather than
        calling a healthy head dead.
        """
        with self._lock:
            self._follow_pointer()
            first = self._sub is not None and self._last_beat is None
            if first and self._ask_head():
                # The head's agent just answered for itself: nothing to wait for.
                first, wait = False, 0.0
            if first:
                wait = max(wait, self.lost_after - (time.time() - self._subscribed_at))
            self._read(wait, until_first=first)
            now = time.time()
            age = None if self._last_beat is None else now - self._last_beat
            alive = age is not None and age <= self.lost_after and self._ok and not self._link_down()
            return HeadObservation(self._job, self._address, alive, self._draining, age)

    def _ask_head(self) -> bool:
        """Ask a newly subscribed head's agent directly (one request, about
        20 ms) instead of waiting for its first beat (up to a beat interval
        plus the subscription's set-up): a fresh ``session status`` or
        ``replace_head`` answers that much sooner. An answer that says it
        serves counts as a beat; anything else changes nothing."""
        endpoint, self._control = self._control, None   # once per subscription
        if endpoint is None:
            return False
        try:
            with ControlClient(endpoint, self.secret, self.session_id, context=self._ctx) as client:
                status = client.request("status", {}, timeout=1.0).get("status") or {}
        except (ControlError, ValueError, zmq.ZMQError, OSError):
            return False
        if status.get("job_id") != self._job or not head_serves(status):
            return False
        self._last_beat, self._ok, self._draining = time.time(), True, head_draining(status)
        return True

    def _close_sub(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None

    def close(self) -> None:
        with self._lock:
            self._close_sub()
