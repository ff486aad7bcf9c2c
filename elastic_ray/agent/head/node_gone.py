"""Telling the head's GCS at once that a Ray node is gone.

Ray's GCS counts a node ALIVE until its own health check gives up on it
(15-20 s with Ray's defaults); meanwhile every task waits for that node. Two
parties know sooner and say so with a ``mark_dead`` request to the agent
serving the head (see ``protocol.disk.head_agent``):

- the coordinator, when the scheduler shows a worker allocation ended;
- a worker agent, right after it stopped its own Ray node (head lost, drain
  done, leaving): :class:`GoneReporter`, best effort and bounded, so an
  agent's exit is never held up for more than about a second.

The head's side, :class:`MarkDeadService`, runs a ``mark-dead`` GCS probe
(``gcs.mark_nodes_dead``) on a thread of its own and answers through a
deferred reply: the probe takes a second or two, and the agent's loop must
keep beating the heartbeat meanwhile.

Threads: ``MarkDeadService`` is called on the event loop; its probes run on
``agent-mark-dead`` threads, at most ``MAX_IN_FLIGHT`` at once (counted under
``_lock``), and hand their answer back through ``post`` (the loop sends it).
``GoneReporter.report`` is called on the effects thread or the loop at exit;
its ``agent-report-gone`` threads only send a request and log.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...protocol.wire.channel import ControlClient, ControlError, Deferred
from ...protocol.disk.head_agent import head_control_endpoint
from ...protocol.disk.session_dir import SessionDir
from ..node import gcs

log = logging.getLogger("elastic_ray.agent")

MAX_IN_FLIGHT = 2
"""Probes at once: each imports Ray (~75 MB); a burst of reports waits its turn at the caller."""
PROBE_TIMEOUT = 15.0
REPORT_TIMEOUT = 1.0
"""A worker's report waits this long for the head's answer. The request is on
its way within milliseconds; the answer (after the probe) usually is not, and
is not needed."""


class MarkDeadService:
    """The head side of ``mark_dead`` (both layouts: a head agent, or a worker
    agent hosting the head)."""

    def __init__(self, session: SessionDir, job_id: str, serves_head: Callable[[], bool],
                 post: Callable[[Callable[[], None]], None], answer: Callable[[Deferred, Mapping[str, Any]], None],
                 log_event: Callable[..., None]):
        self.session = session
        self.job_id = job_id
        self.serves_head = serves_head
        self.post = post
        self.answer = answer
        self._log = log_event
        self._lock = threading.Lock()
        self._in_flight = 0

    def request(self, body: Mapping[str, Any]) -> Mapping[str, Any] | Deferred:
        """On the loop: refuse at once, or start the probe and defer the answer."""
        if not self.serves_head():
            return {"ok": False, "error": f"agent of job {self.job_id} does not serve the run's head"}
        endpoint = self.session.read_head_endpoint(self.job_id)
        if endpoint is None:
            return {"ok": False, "error": "the head is not published yet"}
        with self._lock:
            if self._in_flight >= MAX_IN_FLIGHT:
                return {"ok": False, "error": "busy: try again"}
            self._in_flight += 1
        ids, reason = list(body["node_ids"]), str(body["reason"])
        deferred = Deferred()
        threading.Thread(target=self._run, args=(endpoint.address, ids, reason, deferred), name="agent-mark-dead",
                         daemon=True).start()
        return deferred

    def _run(self, address: str, ids: list[str], reason: str, deferred: Deferred) -> None:
        started = time.monotonic()
        try:
            result = gcs.mark_nodes_dead(address, ids, message=reason, timeout=PROBE_TIMEOUT)
            reply: dict[str, Any] = {"marked": list(result.marked), "already_dead": list(result.already_dead),
                                     "still_alive": list(result.still_alive)}
            self._log("nodes_marked_dead", marked=",".join(result.marked) or "-",
                      already_dead=len(result.already_dead), still_alive=",".join(result.still_alive) or "-",
                      reason=reason[:200], seconds=f"{time.monotonic() - started:.2f}")
        except Exception as exc:   # a probe failure is an answer, never a dead thread
            reply = {"ok": False, "error": str(exc)[:500]}
            self._log("mark_dead_failed", error=str(exc)[:200], reason=reason[:200])
        finally:
            with self._lock:
                self._in_flight -= 1
        self.post(lambda: self._answer(deferred, reply))

    def _answer(self, deferred: Deferred, reply: Mapping[str, Any]) -> None:
        try:
            self.answer(deferred, reply)
        except ValueError:     # the control socket closed meanwhile (the agent is exiting)
            pass


class GoneReporter:
    """The worker side: after this agent stopped its own Ray node, ask the
    head's agent to mark it DEAD (the raylet may have had no chance to say
    so itself). Best effort: a head that does not answer costs one timeout."""

    def __init__(self, session: SessionDir, secret: bytes, session_id: str, log_event: Callable[..., None],
                 timeout: float = REPORT_TIMEOUT):
        self.session = session
        self.secret = secret
        self.session_id = session_id
        self._log = log_event
        self.timeout = timeout
        self._threads: list[threading.Thread] = []

    def report(self, node_id: str, gcs_address: str | None, reason: str) -> None:
        """Start the report to the head at ``gcs_address`` (the one the node
        joined); returns at once (see :meth:`wait`)."""
        if not gcs_address:
            return
        thread = threading.Thread(target=self._send, args=(gcs_address, node_id, reason),
                                  name="agent-report-gone", daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _send(self, gcs_address: str, node_id: str, reason: str) -> None:
        # Only the head the node joined can know it: after a move, the
        # pointer names a head whose GCS never saw this node id.
        head = self.session.read_ray_head()
        published = self.session.read_head_endpoint(head) if head else None
        endpoint = head_control_endpoint(self.session, head) if head else None
        if published is None or published.address != gcs_address or endpoint is None:
            self._log("node_gone_not_reported", node_id=node_id, why="its head is not the published head")
            return
        try:
            with ControlClient(endpoint, self.secret, self.session_id) as client:
                reply = client.request("mark_dead", {"node_ids": [node_id], "reason": reason[:500]},
                                       timeout=self.timeout)
            self._log("node_gone_reported", node_id=node_id, head=head, ok=reply.get("ok"),
                      marked=",".join(reply.get("marked") or []) or "-")
        except (ControlError, ValueError) as exc:   # a timeout included: the request may still be served
            self._log("node_gone_sent", node_id=node_id, head=head, answer=str(exc)[:120])

    def wait(self, timeout: float = REPORT_TIMEOUT + 0.2) -> None:
        """At exit: give reports still in flight up to ``timeout`` s in total."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))


__all__ = ["GoneReporter", "MarkDeadService"]
