"""Carrying out an election: the effects around :mod:`.election`'s decisions.

``Session.replace_head`` hands over to :class:`Failover`. It assesses the
head (one scheduler query plus the heartbeat), takes the session's one
election claim, lets the pure ``election.choose_head`` pick, and then acts:
asks a worker allocation's first node to host a head, or waits for a
published or newly submitted head allocation, then records the new head,
moves the ``ray_head`` pointer and nudges every agent to follow at once.

Its waits watch the fast path every poll (the heartbeat, ``head.json``,
the record) and the scheduler at the pace of :mod:`coordinator.allocations.pacing`, through the
session's shared answer; what it acts on (an election) it first asks the
scheduler afresh, and a head is handed out on a fresh answer.

It lives apart from ``session`` because it is the one part of the
coordinator that changes who the head is; the session's other methods only
add, observe and remove allocations. It is written against the narrow
:class:`~.ports.ElectingSession`, so it never reaches into the session's
private state.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace

from ...errors import SchedulerError
from ...polling import wait_for
from ...protocol.wire.channel import ControlError
from ...protocol.disk import event_log
from ...protocol.disk.events import EventKind, EventSource
from ...protocol.disk.records import AllocationRecord, HostedHeadState, NodeState
from ...scheduler.base import JobInfo
from . import election, nudges
from ..allocations import pacing
from .claims import renew_claim
from ..allocations.pacing import SchedulerLooks, SessionLooks
from ..ports import AgentAsker, ElectingSession

log = logging.getLogger("elastic_ray.coordinator")

POLL_INTERVAL = 0.5
# While another caller elects: how often the pointer is read for its switch (a small file).
POINTER_WATCH = 0.05
CONTROL_TIMEOUT = 3.0
# How long a newly elected or submitted head may take to answer before its
# silence counts as a failure.
HEAD_START_GRACE = 120.0


def first_node(states: Mapping[str, NodeState]) -> NodeState | None:
    """The agent of an allocation's first node that still runs (the one that hosts a head)."""
    return next((st for _, st in sorted(states.items())
                 if st.role == "worker" and st.node_index == 0 and st.control and not st.exited), None)


def ask_agent(session: AgentAsker, node: NodeState | None, job: str, kind: str,
              body: dict) -> dict | None:
    """Send one control request to ``node``'s agent: its reply, or None (logged
    as ``<kind>_unreachable``, ``_failed`` or ``_refused``) when there is no
    agent to ask, it does not answer, or it says no."""
    if node is None or node.control is None:
        log.warning("event=%s_unreachable session=%s job=%s", kind, session.job_name, job)
        return None
    try:
        with session.control(node.control) as client:
            reply = client.request(kind, body, timeout=CONTROL_TIMEOUT)
    except ControlError as exc:
        log.warning("event=%s_failed session=%s job=%s error=%s", kind, session.job_name, job, exc)
        return None
    if not reply.get("ok"):
        log.warning("event=%s_refused session=%s job=%s error=%s", kind, session.job_name, job, reply.get("error"))
        return None
    return reply


def refused_submission(exc: SchedulerError) -> bool:
    """The scheduler answered a submission with a refusal (sbatch: "Batch job submission
    failed: ..."), as opposed to not answering at all."""
    text = f"{exc} {exc.stderr}".lower()
    unreachable = ("unable to contact", "connect failure", "timed out", "connection refused")
    return exc.returncode not in (None, 0) and "submission failed" in text and not any(u in text for u in unreachable)


class Failover:
    """One caller's attempt to get a healthy head (see ``Session.replace_head``)."""

    def __init__(self, session: ElectingSession):
        self.session = session
        self.claimant = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._renewed_at = 0.0
        self.switched_to: str | None = None   # the head this caller's own election made

    def replace_head(self, timeout: float, progress: Callable[[str], None] | None) -> tuple[str, str]:
        """Return ``(job id, address)`` of a healthy head, electing one first if needed."""
        s = self.session
        claimant = self.claimant
        deadline = time.monotonic() + timeout
        elected = threading.Event()  # after an election, look again at once
        last = ""
        why = ""

        looks = SessionLooks(lambda max_age: s.query(max_age=max_age))
        started, looked = time.monotonic(), 0

        def found(job: str, address: str) -> tuple[str, str]:
            log.info("event=head_found session=%s head=%s looks=%d seconds=%.2f", s.job_name, job, looked,
                     time.monotonic() - started)
            return job, address

        def healthy_head() -> tuple[str, str] | None:
            nonlocal last, why, looked
            looked += 1
            if self.switched_to is not None and self.switched_to == s.record().head_job:
                # This caller just made it the head after seeing it ready (its
                # GCS open, its endpoint written), or saw another elector switch
                # to it while it waited (which switches only then too): hand it
                # out now rather than wait up to a heartbeat period (1 s) for its
                # first beat.
                endpoint = s.dir.read_head_endpoint(self.switched_to)
                if endpoint is not None:
                    return found(self.switched_to, endpoint.address)
            obs = s.observe_head(wait=0.3)
            rec = s.record()
            # The fast path: the heartbeat and the record, every poll. The
            # scheduler's answer is the session's shared one, at its pace;
            # a fresh one is asked for only before acting on it.
            jobs = looks.jobs(rec.head_job)
            assessment = s.assess_head(rec, jobs, obs, time.time())
            step = pacing.failover_step(assessment.condition, heartbeat_alive=obs.alive and obs.job == rec.head_job,
                                        may_ask=looks.may_ask(rec.head_job))
            fresh = step is pacing.FailoverStep.LOOK_NOW
            if fresh:
                jobs = looks.fresh(rec.head_job)
                assessment = s.assess_head(rec, jobs, obs, time.time())
            why = assessment.why
            if assessment.condition is election.HeadCondition.HEALTHY and obs.address and rec.head_job:
                return found(rec.head_job, obs.address)
            if assessment.condition.value != last and progress:
                progress(assessment.why)
                last = assessment.condition.value
            if assessment.needs_election:
                with s.election_claim(claimant) as claim:
                    if claim.held and claim.record.head_job != rec.head_job:
                        # Another elector finished between our look and our
                        # claim: what we judged is no longer the head. Judge
                        # the new one first (electing now would replace a
                        # head that was elected a moment ago).
                        log.info("event=election_skipped session=%s judged=%s now=%s", s.job_name,
                                 rec.head_job, claim.record.head_job)
                        elected.set()
                    elif claim.held:
                        # An election acts on the scheduler's word of now, never on a shared answer.
                        if not fresh:
                            jobs = looks.fresh(claim.record.head_job)
                        assessment = s.assess_head(claim.record, jobs, obs, time.time())
                        why = assessment.why
                        if assessment.needs_election:
                            self._renewed_at = time.monotonic()
                            self.elect(claim.record, jobs, progress, deadline)
                        elected.set()
                    else:
                        # Another elector holds the claim (the session's supervisor, say):
                        # watch the pointer closely, so that its new head is taken up
                        # within a pointer look of the switch, then look again at once.
                        switched = wait_for(lambda: (p := s.dir.read_ray_head()) != rec.head_job and p,
                                            timeout=POLL_INTERVAL, interval=POINTER_WATCH, raising=False)
                        if switched:
                            self.switched_to = switched
                        elected.set()
            return None

        return wait_for(healthy_head, timeout=timeout, interval=POLL_INTERVAL, wake=elected,  # type: ignore[return-value]
                        error=lambda _: TimeoutError(f"no healthy head within {timeout:.0f}s: {why}"))

    def elect(self, rec: AllocationRecord, jobs: Mapping[str, JobInfo],
              progress: Callable[[str], None] | None, deadline: float) -> None:
        s = self.session
        choice = election.choose_head(rec, jobs, can_host_on_worker=s.launcher.can_host_elected_head,
                                      now=time.time())
        log.info("event=election session=%s choice=%s why=%r", s.job_name, choice.kind.value, choice.why)
        event_log.emit(s.dir.path, EventKind.ELECTION_STARTED, EventSource.COORDINATOR, reason=choice.why,
                       previous=rec.head_job, choice=choice.kind.value)
        lost = jobs.get(rec.head_job) if rec.head_job else None
        if lost is not None and rec.head_job not in rec.workers and (lost.state.is_final or
                                                                     lost.state.value == "COMPLETING"):
            # A separate head allocation that ended (a worker allocation's end is recorded by .failures).
            event_log.emit(s.dir.path, EventKind.FAILED, EventSource.COORDINATOR, job=rec.head_job,
                           reason=lost.reason if lost.reason not in ("", "None") else lost.state.value,
                           state=lost.state.value, role="head")
        if progress:
            progress(f"electing: {choice.why}")
        if isinstance(choice, election.HostOnWorker):
            job = choice.job_id
            if not self.host_on_worker(job, deadline):
                s.dir.update_allocation(lambda r: election.record_head_failure(r, job))
                return
            self.switch_head(job, hosted_on_worker=True)
            return
        if isinstance(choice, election.UsePublishedSuccessor):
            job = choice.job_id
        else:
            try:
                job = self.submit_successor()
            except SchedulerError as exc:
                if not refused_submission(exc):
                    raise   # the scheduler did not answer (a timeout, a controller away): not a refusal
                # The last way on is closed: no head, no worker allocation to
                # host one, and the scheduler refuses a new one. Every caller
                # of replace_head() gets this at once, saying so, rather than
                # the bare sbatch error.
                was = f"head {rec.head_job} is {lost.state.value}" if lost is not None and rec.head_job \
                    else f"head {rec.head_job or '(none)'} is gone"
                log.error("event=election_failed session=%s previous=%s why=%r error=%s", s.job_name,
                          rec.head_job, choice.why, exc)
                why = f"{was}, {choice.why}, and the scheduler refused a new head allocation"
                event_log.emit(s.dir.path, EventKind.ELECTION_FAILED, EventSource.COORDINATOR, reason=why,
                               previous=rec.head_job or "", refusal=(exc.stderr or str(exc)).strip()[-300:])
                raise SchedulerError(f"no head can be had: {why}: {exc}", argv=exc.argv, returncode=exc.returncode,
                                     stderr=exc.stderr) from exc
        if self.wait_head_ready(job, deadline):
            # In the default layout a successor is a worker allocation whose
            # first node hosts the head (see Session.submit_head_allocation).
            self.switch_head(job, hosted_on_worker=job in s.record().workers)

    def submit_successor(self) -> str:
        """A new allocation shaped like the first head, published as the successor."""
        s = self.session
        # Recorded as the successor in the same update that records the job.
        job = s.submit_head_allocation(lambda r, submitted: replace(r, successor=submitted))
        log.info("event=successor_submitted session=%s job=%s", s.job_name, job)
        return job

    def wait_head_ready(self, job: str, deadline: float) -> bool:
        """Until the head of ``job`` published its endpoint (True) or its job ended (False).

        Its ``head.json`` is read every poll (the fast path); the scheduler is
        asked whether the job ended at the pace of :class:`coordinator.allocations.pacing.SchedulerLooks`
        (a successor waiting in the queue: after 2, 4, 8... up to 30 s).
        """
        s = self.session
        looks = SchedulerLooks(lambda job_id, max_age: s.job_info(job_id, unreachable_ok=True, max_age=max_age))

        def outcome() -> bool | None:
            self.keep_claim()
            if s.dir.read_head_endpoint(job) is not None:
                return True
            info = looks.info(job)
            if info is not None and info.state.is_final:
                return False
            return None

        return bool(wait_for(outcome, timeout=deadline - time.monotonic(), interval=POLL_INTERVAL,
                             done=lambda ready: ready is not None, raising=False))

    def keep_claim(self) -> None:
        """While we wait for a head, keep our election claim from expiring.

        A successor allocation may wait in the queue far longer than the claim
        period; if the claim lapsed meanwhile, the next process to find the
        head lost would take it and submit a second head allocation. Renewed
        every third of the period, so a slow write or two never lets it lapse.
        """
        s = self.session
        now = time.monotonic()
        if now - self._renewed_at < s.claim_period / 3:
            return
        self._renewed_at = now
        if not renew_claim(s.dir, self.claimant, s.claim_period):
            log.warning("event=claim_lost session=%s claimant=%s: another process holds the election claim",
                        s.job_name, self.claimant)

    def host_on_worker(self, job: str, deadline: float) -> bool:
        """Ask the first node of worker allocation ``job`` to host a head; wait until it is ready."""
        s = self.session
        states = s.node_states(job)
        first = first_node(states) or next((st for _, st in sorted(states.items()) if st.control and not st.exited),
                                           None)
        standby = first is not None and first.hosted_head is not None \
            and first.hosted_head.state is HostedHeadState.STANDBY
        if ask_agent(s, first, job, "host_head", {"head_job": job}) is None:
            return False
        if standby:
            event_log.emit(s.dir.path, EventKind.STANDBY_PROMOTED, EventSource.COORDINATOR, job=job)

        def outcome() -> bool | None:
            self.keep_claim()
            for state in s.node_states(job).values():
                if state.hosted_head is not None and state.hosted_head.state is HostedHeadState.FAILED:
                    return False
            if s.dir.read_head_endpoint(job) is not None:
                return True
            return None

        limit = min(deadline - time.monotonic(), HEAD_START_GRACE)
        # A cheap local read; every tenth of a second here is failover time.
        return bool(wait_for(outcome, timeout=limit, interval=0.1, done=lambda ready: ready is not None,
                             raising=False))

    def switch_head(self, job: str, *, hosted_on_worker: bool) -> None:
        """Make ``job`` the head: record, pointer, then a nudge to every agent."""
        s = self.session
        previous: list[str | None] = [None]

        def change(r: AllocationRecord) -> AllocationRecord:
            previous[0] = r.head_job
            return election.apply_new_head(r, job, hosted_on_worker=hosted_on_worker)

        s.dir.update_allocation(change)
        s.dir.write_ray_head(job)
        s.note_head_started(job)
        log.info("event=head_switched session=%s job=%s hosted_on_worker=%s", s.job_name, job, hosted_on_worker)
        for kind in (EventKind.ELECTION_WON, EventKind.HEAD_MOVED):
            event_log.emit(s.dir.path, kind, EventSource.COORDINATOR, job=job, previous=previous[0],
                           hosted_on_worker=hosted_on_worker)
        self.switched_to = job
        self.nudge_agents(job)

    def nudge_agents(self, job: str) -> threading.Thread:
        """Tell agents to read the pointer now instead of at their next poll
        (in the background, several at once: :mod:`.nudges`)."""
        s = self.session
        endpoints = [state.control for worker_job in s.record().workers
                     for state in s.node_states(worker_job).values() if state.control and not state.exited]
        return nudges.nudge(endpoints, job, s.control)
