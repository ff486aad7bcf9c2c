"""Tell the head at once about the Ray nodes of a worker allocation that ended.

When Slurm ends a worker allocation the hard way (FAILED after its agent was
killed, NODE_FAIL, CANCELLED, TIMEOUT, PREEMPTED, OUT_OF_MEMORY, or back to
PENDING after a requeue), nobody unregisters its Ray nodes: the GCS keeps
them ALIVE until its own health check gives up, and every task meant for
them waits that long. The session learns of the end from a scheduler query
it makes anyway; this module turns that into a ``mark_dead`` request to the
agent serving the head (``protocol.disk.head_agent``), once per (job, node id).

Not one more scheduler query: :class:`LostNodeReporter` observes the answer
of every query the session makes (``SessionJobs.listing``, the one place all
of them go through). The caller never waits for it: the files are read and
the request is sent on a thread of its own, which only ever looks at the
latest answer. Repeats are harmless (another process may report the same
node): the head's probe skips nodes its GCS no longer holds ALIVE.

Decisions are pure (:func:`jobs_to_check`, :func:`head_takes_reports`,
:func:`nodes_to_report`);
:class:`LostNodeReporter` is the thin shell around them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Set
from typing import Any

from ...protocol.wire.channel import ControlClient, ControlError
from ...protocol.wire.frames import MAX_MARK_DEAD_IDS, is_ray_node_id
from ...protocol.disk.head_agent import head_control_endpoint
from ...protocol.disk.records import AllocationRecord, NodeState
from ...protocol.disk.session_dir import SessionDir
from ...scheduler.base import JobInfo, JobState

log = logging.getLogger("elastic_ray.coordinator")

#: How long the head's agent may take to run its GCS probe and answer.
REQUEST_TIMEOUT = 20.0
#: After a failed report, wait this long before trying again; give up after MAX_ATTEMPTS.
RETRY_AFTER = 5.0
MAX_ATTEMPTS = 3


def jobs_to_check(rec: AllocationRecord, jobs: Mapping[str, JobInfo], head_job: str | None,
                  settled: Set[str] = frozenset()) -> list[str]:
    """Worker allocations whose Ray nodes may be gone without having said so.

    Every recorded worker allocation the scheduler reports in any state but
    RUNNING: a job that ended, is ending (COMPLETING), is SUSPENDED, or is
    PENDING again after a requeue has no live Ray node any more. The job that
    hosts the current head is left out (its GCS went with it), and so are
    ``settled`` jobs (ended, and already dealt with).
    """
    return sorted((job for job, info in jobs.items()
                   if job in rec.workers and job != head_job and job not in settled
                   and info.state is not JobState.RUNNING), key=int)


def head_takes_reports(listed: Mapping[str, JobInfo], head_job: str | None) -> bool:
    """Whether the head named by ``ray_head`` can take a report now.

    Not when the same scheduler answer shows its job anything but RUNNING
    (cancelled, ending, pending again): its GCS is gone or going, the request
    would only wait out its timeout, and the nodes joined a cluster that no
    longer counts. A head the answer does not list is tried.
    """
    if not head_job:
        return False
    info = listed.get(head_job)
    return info is None or info.state is JobState.RUNNING


def nodes_to_report(job: str, states: Mapping[str, NodeState], head_job: str | None,
                    sent: Set[tuple[str, str]]) -> list[str]:
    """The Ray node ids of ``job`` to report to ``head_job``'s agent now.

    A node file names the Ray node its agent last joined (``node_id``) and
    the head it joined (``head_job``); only ids of the current head's cluster
    mean anything to its GCS. Ids already sent are left out; a malformed id
    is never sent.
    """
    if not head_job:
        return []
    ids = {state.node_id for state in states.values()
           if state.node_id and state.head_job == head_job and is_ray_node_id(state.node_id)}
    return sorted(i for i in ids if (job, i) not in sent)


class LostNodeReporter:
    """Observes every scheduler answer of one Session and reports lost nodes.

    Threads: ``observe`` runs on the caller's thread and only hands over the
    answer (under ``_cond``); the ``elastic-ray-lost-nodes`` thread owns
    ``sent``, ``settled``, ``_failures`` and ``_retry_at``.
    """

    def __init__(self, directory: SessionDir, control: Callable[[str], ControlClient],
                 request_timeout: float = REQUEST_TIMEOUT):
        self.dir = directory
        self.control = control
        self.request_timeout = request_timeout
        self.sent: set[tuple[str, str]] = set()
        self.settled: set[str] = set()
        self.reports: list[dict[str, Any]] = []   # what was sent and answered, for tests and status
        self._failures: dict[tuple[str, str], int] = {}
        self._retry_at = 0.0
        self._cond = threading.Condition()
        self._latest: dict[str, JobInfo] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def observe(self, listed: Mapping[str, JobInfo]) -> None:
        """Called with every scheduler answer; returns at once."""
        if all(info.state is JobState.RUNNING or job in self.settled for job, info in listed.items()):
            return
        with self._cond:
            if self._closed:
                return
            self._latest = dict(listed)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="elastic-ray-lost-nodes", daemon=True)
                self._thread.start()
            self._cond.notify()

    def close(self, timeout: float = 1.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._latest is None and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                listed, self._latest = self._latest, None
            wait = self._retry_at - time.time()
            if wait > 0:
                time.sleep(min(wait, RETRY_AFTER))
            try:
                self.check(listed)
            except Exception:   # never let a bug here stop the reports, nor reach the caller
                log.exception("event=lost_nodes_check_failed session=%s", self.dir.path)

    def check(self, listed: Mapping[str, JobInfo]) -> list[dict[str, Any]]:
        """One pass (synchronous): read, decide, send. Returns this pass's reports."""
        head = self.dir.read_ray_head()
        done: list[dict[str, Any]] = []
        if head and not head_takes_reports(listed, head):
            log.info("event=lost_nodes_waiting session=%s head=%s why='head job is %s'", self.dir.path.name, head,
                     listed[head].state.value)
            return done
        rec = self.dir.read_allocation()
        endpoint: str | None = None
        for job in jobs_to_check(rec, listed, head, self.settled):
            state = listed[job].state
            ids = nodes_to_report(job, self.dir.read_node_states(job), head, self.sent)
            if not ids:
                if state.is_final:
                    self.settled.add(job)   # an ended job's files change no more
                continue
            endpoint = endpoint or (head_control_endpoint(self.dir, head) if head else None)
            if endpoint is None:
                log.info("event=lost_nodes_waiting job=%s state=%s nodes=%d why='head not published'", job,
                         state.value, len(ids))
                return done
            for start in range(0, len(ids), MAX_MARK_DEAD_IDS):
                done.append(self._send(endpoint, head or "", job, state, ids[start:start + MAX_MARK_DEAD_IDS]))
        self.reports.extend(done)
        del self.reports[:-100]
        return done

    def _send(self, endpoint: str, head: str, job: str, state: JobState, ids: list[str]) -> dict[str, Any]:
        reason = f"slurm job {job} is {state.value}"
        started = time.time()
        report: dict[str, Any] = {"job": job, "state": state.value, "head": head, "node_ids": ids,
                                  "sent_at": started}
        try:
            with self.control(endpoint) as client:
                reply = client.request("mark_dead", {"node_ids": ids, "reason": reason}, timeout=self.request_timeout)
        except (ControlError, ValueError) as exc:
            reply = {"ok": False, "error": str(exc)[:300]}
        report.update(reply=reply, seconds=round(time.time() - started, 3))
        if reply.get("ok"):
            self.sent.update((job, i) for i in ids)
            log.info("event=lost_nodes_reported session=%s job=%s state=%s head=%s marked=%s already_dead=%d "
                     "seconds=%.2f", self.dir.path.name, job, state.value, head,
                     ",".join(reply.get("marked") or []) or "-", len(reply.get("already_dead") or []),
                     report["seconds"])
            return report
        self._retry_at = time.time() + RETRY_AFTER
        for i in ids:
            key = (job, i)
            self._failures[key] = self._failures.get(key, 0) + 1
            if self._failures[key] >= MAX_ATTEMPTS:
                self.sent.add(key)   # the GCS's own health check will get there
        log.warning("event=lost_nodes_not_reported session=%s job=%s state=%s head=%s error=%s", self.dir.path.name,
                    job, state.value, head, reply.get("error"))
        return report


__all__ = ["LostNodeReporter", "head_takes_reports", "jobs_to_check", "nodes_to_report"]
