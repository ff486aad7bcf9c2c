"""Following the run's head: the ``ray_head`` pointer, the head's heartbeat,
and the checks on a head that fell silent. The judgement is pure
(``agent.head.head_watch``); this module observes and reports.

Threads: everything here runs on the agent's event loop, which alone owns
``watch``, ``subscriber`` and ``_missing_logged``. Two kinds of helper thread
do slow asks and hand their answers back to the loop (``on_loop``) instead of
writing the watch themselves: the ``agent-ask-head`` thread (a new head's
agent asked whether it serves) and the ``agent-head-probe`` thread (a silent
head's GCS asked whether it answers). An answer about a watch that was
replaced meanwhile lands on the old record and changes nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

import zmq

from ...protocol.wire.channel import ControlClient, ControlError, HeartbeatSubscriber
from ...protocol.disk.session_dir import SessionDir
from ..node import gcs
from .head_watch import HEAD_PROBE_TIMEOUT, HeadWatch, PointerRead, answer_counts, beat_time, read_pointer
from .hosted import Hosting, own_head_live_at_once
from ..machine import HeadSeen


class HeadFollower:
    def __init__(self, session: SessionDir, secret: bytes, session_id: str, zctx: zmq.Context, *, role: str,
                 lost_after: float, log: Callable[..., None], on_loop: Callable[[Callable[[], None]], None]):
        self.session = session
        self.secret = secret
        self.session_id = session_id
        self.zctx = zctx
        self.role = role
        self.lost_after = lost_after
        self._log = log
        self._on_loop = on_loop
        self.watch = HeadWatch()
        self.subscriber: HeartbeatSubscriber | None = None
        self._missing_logged = False
        self._subscribe_failures = 0
        self._read_at: float | None = None   # when the queued heartbeats were last taken

    def seen(self, now: float) -> HeadSeen:
        return self.watch.seen(now, self.lost_after)

    def silence_at(self, now: float) -> float:
        """When the followed head's heartbeat turns silent if no beat comes,
        for the loop's timeout: a worker wakes at that moment instead of
        polling for it (``inf`` when nothing is due: no beat heard yet, or
        already silent, when the GCS probe's answer wakes the loop)."""
        watch = self.watch
        if self.role != "worker" or watch.last_beat is None or not watch.beat_ok:
            return float("inf")
        at = watch.last_beat + self.lost_after + 0.001   # silent means quiet for *more* than lost_after
        return at if at > now else float("inf")

    # ------------------------------------------------------------ the pointer
    def refresh(self, now: float, hosting: Hosting) -> None:
        """Read ``ray_head``; on a new head, find its endpoint and subscribe."""
        job, damaged = self.session.ray_head_state()
        if damaged:
            # Unknown, not "no head": keep following the head we follow (a
            # head that is really gone falls silent and is left then); the
            # coordinator rewrites the pointer from allocation.json.
            job = self.watch.job
            if not self._missing_logged:
                self._log("head_pointer_missing", keeping=job, reason="unreadable")
                self._missing_logged = True
        if self.role == "head":
            # A head only needs to know whether the session moved the head away.
            self.watch.job = job
            self._missing_logged = self._missing_logged and damaged
            return
        read = read_pointer(self.watch, job, now, self.lost_after)
        if read is PointerRead.KEEP:
            if not self._missing_logged:
                self._log("head_pointer_missing", keeping=self.watch.job)
                self._missing_logged = True
            return
        if not damaged:
            self._missing_logged = False
        if read is PointerRead.NEW:
            self.subscribe(None)
            self.watch = HeadWatch(job=job)
            self._log("head_pointer", head_job=job)
        watch = self.watch
        if own_head_live_at_once(hosting, watch.job, heard=watch.last_beat is not None):
            watch.last_beat, watch.beat_ok = now, True
        if watch.job is not None and watch.endpoint is None:
            self._find_head(watch)

    def _find_head(self, watch: HeadWatch) -> None:
        """Read the head's endpoint and subscribe to its heartbeat.

        Out of descriptors (EMFILE: e.g. a peer holding hundreds of idle
        connections to this agent) neither the read nor the socket can be
        made: that is logged once per streak and tried again at the next
        pointer read, while the node stays as it is. It must never end the
        agent's loop, which would stop its Ray node.
        """
        try:
            endpoint = self.session.read_head_endpoint(watch.job)
            if endpoint is None or "heartbeat" not in endpoint.ports:
                return
            host = endpoint.address.rpartition(":")[0]
            subscriber = HeartbeatSubscriber(f"tcp://{host}:{endpoint.ports['heartbeat']}", self.secret,
                                             self.session_id, context=self.zctx, watch_link=True)
        except (zmq.ZMQError, OSError) as exc:
            self._subscribe_failures += 1
            if self._subscribe_failures == 1:
                self._log("head_subscribe_failed", head_job=watch.job, error=str(exc)[:200],
                          action="retrying at each pointer read")
            return
        if self._subscribe_failures:
            self._log("head_subscribed", head_job=watch.job, failed_tries=self._subscribe_failures)
            self._subscribe_failures = 0
        watch.endpoint = endpoint
        self.subscribe(subscriber)
        if "control" in endpoint.ports:
            try:
                threading.Thread(target=self._ask_head, args=(watch, f"tcp://{host}:{endpoint.ports['control']}"),
                                 name="agent-ask-head", daemon=True).start()
            except RuntimeError as exc:   # no thread to spare: the heartbeat will tell, a little later
                self._log("head_not_asked", head_job=watch.job, error=str(exc)[:120])

    def _ask_head(self, watch: HeadWatch, endpoint: str) -> None:
        """Ask a newly found head directly whether it serves, instead of waiting
        for its next heartbeat (up to an interval, plus the time a new
        subscription takes): a worker that joins starts Ray that much sooner.
        An answer counts as one heartbeat; no answer changes nothing."""
        try:
            with ControlClient(endpoint, self.secret, self.session_id, context=self.zctx) as client:
                status = client.request("status", {}, timeout=2.0).get("status") or {}
        except (ControlError, ValueError, zmq.ZMQError, OSError) as exc:   # ZMQError: e.g. out of descriptors
            self._log("head_not_asked", head_job=watch.job, error=str(exc)[:120])
            return
        at = time.time()
        self._on_loop(lambda: self._answered(watch, status, at))

    def _answered(self, watch: HeadWatch, status: dict[str, Any], at: float) -> None:
        if answer_counts(watch, status):
            watch.last_beat, watch.beat_ok = at, True

    # ------------------------------------------------------------ the heartbeat
    def subscribe(self, subscriber: HeartbeatSubscriber | None) -> None:
        if self.subscriber is not None:
            self.subscriber.close()
        self.subscriber = subscriber
        self._read_at = None

    def wake_socket(self) -> Any:
        """What the loop waits on for this head: not the heartbeat socket (a
        wakeup per beat is most of what an idle worker would spend) but its
        link watch, readable only when the connection comes or drops. The
        beats queue meanwhile and are taken at every wakeup (``read_heartbeats``)."""
        sub = self.subscriber
        return sub.link.socket if sub is not None and sub.link is not None else None

    def read_heartbeats(self, now: float) -> None:
        """Take the queued beats, each dated by ``beat_time``: the loop does
        not wake per beat, so ``now`` may be well after one arrived."""
        sub = self.subscriber
        if sub is None:
            return
        read_before, self._read_at = self._read_at, now
        while True:
            envelope = sub.poll(0)
            if envelope is None:
                break
            body = envelope.body
            if body.get("head_job") != self.watch.job:
                continue
            self.watch.heard(beat_time(envelope.ts, read_before, now, self.watch.last_beat),
                             bool(body.get("ray_ok")), bool(body.get("draining")))
        if sub.link is not None:
            sub.link.read(now)   # only empties its queue: a drop wakes the loop to take a closing head's last beat

    # ------------------------------------------------------------ a silent head
    def check_silent(self, now: float) -> None:
        """Ask the GCS whether a head whose heartbeat fell silent still serves."""
        watch = self.watch
        if self.role != "worker" or not watch.probe_due(now, self.lost_after):
            return
        assert watch.endpoint is not None
        watch.probing = True
        watch.next_probe = now + self.lost_after
        address, quiet = watch.endpoint.address, now - (watch.last_beat or now)
        self._log("head_silent", head_job=watch.job, quiet=f"{quiet:.1f}s", action="asking its GCS")

        def probe() -> None:
            try:
                answered = gcs.gcs_ready(address, timeout=HEAD_PROBE_TIMEOUT) is not None
            except Exception as exc:   # auth or usage trouble: no evidence that it serves
                self._log("head_probe_failed", error=str(exc)[:200])
                answered = False
            at = time.time()
            self._on_loop(lambda: self._probed(watch, at, answered))

        threading.Thread(target=probe, name="agent-head-probe", daemon=True).start()

    def _probed(self, watch: HeadWatch, at: float, answered: bool) -> None:
        watch.probed(at, answered)
        self._log("head_probe", head_job=watch.job, gcs="answers" if answered else "silent")
