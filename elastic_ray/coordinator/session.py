"""Session: the coordinator library a run programs against.

Any process of a run may hold a Session on the same directory at the same
time (the supervisor, every payload step, a CLI in another shell): all
shared state lives in the session directory, changed under its lock, and
Slurm is asked about all of the session's jobs in one query per poll.
A session's jobs are the ids it recorded, of the user who submitted them
(see :mod:`coordinator.allocations.ownership`); submitting, querying and cancelling go through
:class:`coordinator.allocations.jobs.SessionJobs`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import defaults, knobs
from ..config import (RayLauncher, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig, inherit_worker_config,
                      rejoin_timeout_warning, resolve_separate_head_config)
from ..errors import AllocationFailed, ConfigError, SlurmAllocationEnded
from ..config.scheduler_choice import scheduler_kind
from ..polling import wait_for
from ..protocol.wire.channel import ControlClient, ControlError
from ..protocol.disk import paths
from ..protocol.disk.records import (AgentState, AllocationRecord, NodeState, SessionInfo, WorkerIntent, WorkerRecord,
                                     check_job_name)
from ..protocol.disk.session_dir import SessionDir
from ..ray_auth import launcher_warnings
from ..scheduler.base import JobInfo, Scheduler, current_user, state_text
from ..scheduler.factory import make_scheduler
from .head import assessment, election, ready, standby
from .allocations import failures, removal, submit
from .head.claims import ClaimOutcome, election_claim
from .drivers import PayloadRun
from .head.failover import CONTROL_TIMEOUT, Failover
from .allocations.jobs import RecordAs, SessionJobs
from .allocations.lost_nodes import LostNodeReporter
from .allocations.pacing import SchedulerLooks
from .handles import Head, WorkerAllocation, log_tail
from .head.headwatch import HeadObservation, HeadWatch
from .head.supervise import HeadSupervisor
from .scaling import store as scaling_store, runner as scaling_runner

log = logging.getLogger("elastic_ray.coordinator")

POLL_INTERVAL = 0.5


class Session:
    """One run, seen from one process: its head, its worker allocations, its payload drivers.

    Make one with ``create`` (a new run: writes the session directory and
    submits the head) or ``open`` (an existing run, from any process: a
    restarted supervisor, a payload step, a shell). Every process that holds a
    ``Session`` on the same directory sees the same state, because nothing
    lives only in memory: the record is ``allocation.json``, changed under its
    compare-and-swap, and Slurm is asked about all the session's jobs in one
    query. With ``supervise`` (the default of ``create`` and ``open``) the
    process also watches the head and elects a new one when it is lost.
    ``close`` stops this process's watching; the jobs keep running until
    ``teardown``.
    """

    def __init__(self, directory: SessionDir, scheduler: Scheduler | None = None, *,
                 claim_period: float = election.DEFAULT_CLAIM_PERIOD, supervise: bool = False,
                 supervise_interval: float = defaults.SUPERVISE_INTERVAL,
                 on_allocation_ended: failures.OnAllocationEnded | None = None):
        self.dir = directory
        self.info: SessionInfo = directory.info()
        self.launcher = RayLauncher.from_dict(self.info.launcher)
        self.scheduler = scheduler or make_scheduler(self.info.scheduler["kind"],
                                                     state_dir=self.info.scheduler.get("state_dir"))
        self.jobs = SessionJobs(directory, self.scheduler, self.info)
        # Ray nodes of allocations that ended: reported to the head at once.
        self.lost_nodes = LostNodeReporter(directory, self.control)
        self.jobs.observers.append(self.lost_nodes.observe)
        self.claim_period = claim_period
        self._secret: bytes | None = None
        self._watch: HeadWatch | None = None
        self._head_started_at: dict[str, float] = {}
        self.supervisor: HeadSupervisor | None = None
        self.failure_watch = failures.FailureWatch(directory, self.info.job_name, resubmit=self._resubmit_worker,
                                                   claim=self.election_claim, on_ended=on_allocation_ended)
        if supervise:
            self.start_supervisor(supervise_interval)

    def start_supervisor(self, interval: float = defaults.SUPERVISE_INTERVAL) -> "HeadSupervisor":
        """Watch the head from this process: heartbeat loss is noticed within
        about 2 s, the scheduler is asked every ``interval`` s, and a lost head
        is replaced (one election across all processes)."""
        if self.supervisor is None:
            self.supervisor = HeadSupervisor(self, interval=interval, standby=standby.keeper(self, interval),
                                             autoscaler=scaling_runner.Autoscaler(self)).start()
        return self.supervisor

    def close(self) -> None:
        """Stop this process's supervision and listeners (jobs keep running)."""
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self.lost_nodes.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ create / open
    @classmethod
    def create(
        cls,
        path: str | Path,
        *,
        head: SlurmRunAllocationConfig,
        scheduler: str | Scheduler | None = None,
        launcher: RayLauncher | None = None,
        ray_head_only: bool = True,
        worker_allocation: SlurmWorkerAllocationConfig | None = None,
        job_name: str | None = None,
        local_state_dir: str | Path | None = None,
        claim_period: float = election.DEFAULT_CLAIM_PERIOD,
        supervise: bool = True,
        supervise_interval: float = defaults.SUPERVISE_INTERVAL,
        on_allocation_ended: failures.OnAllocationEnded | None = None,
    ) -> "Session":
        """Create the session directory and submit the head (and the first worker).

        Returns on submission; ``wait_for_head`` waits for the head to be ready.
        ``scheduler``: ``"slurm"``, ``"local"`` or a Scheduler; None takes
        $ELASTIC_RAY_SCHEDULER (see :mod:`..config.scheduler_choice`).
        """
        if not isinstance(head, SlurmRunAllocationConfig):
            raise ConfigError("head", head, "must be a SlurmRunAllocationConfig")
        if worker_allocation is not None and not isinstance(worker_allocation, SlurmWorkerAllocationConfig):
            raise ConfigError("worker_allocation", worker_allocation, "must be a SlurmWorkerAllocationConfig")
        launcher = launcher or RayLauncher()
        for event, text in launcher_warnings(launcher.auth_mode, launcher.redis_password):
            log.warning("event=%s %s", event, text)
        if ray_head_only:
            head = resolve_separate_head_config(head)
        elif not launcher.can_host_elected_head:
            # The default layout hosts the head next to the first allocation's
            # own Ray worker; with fixed ports the two would collide.
            raise ConfigError("launcher.port_strategy", launcher.port_strategy,
                              "the default layout (ray_head_only=False) hosts the head next to a Ray worker on "
                              "the run's first node, which needs 'random' or 'hash_jobid'; with 'fixed', use a "
                              "separate head allocation (ray_head_only=True)")
        path = Path(path).absolute()
        job_name = check_job_name(job_name or f"er-{uuid.uuid4().hex[:8]}")
        if isinstance(scheduler, Scheduler):
            sched_obj, kind = scheduler, scheduler.kind
            state_dir = getattr(scheduler, "state_dir", None)
        else:
            kind, sched_obj = scheduler_kind(scheduler), None
            state_dir = Path(local_state_dir).absolute() if local_state_dir else paths.local_scheduler_dir(path)
        sched_info: dict[str, Any] = {"kind": kind}
        if kind == "local":
            sched_info["state_dir"] = str(state_dir)
        info = SessionInfo(session_id=uuid.uuid4().hex, job_name=job_name, created_at=time.time(),
                           scheduler=sched_info, head=head.to_dict(), ray_head_only=ray_head_only,
                           worker_allocation=None if worker_allocation is None else worker_allocation.to_dict(),
                           launcher=launcher.to_dict(), agent_env=knobs.forwarded_agent_env(),
                           user=getattr(sched_obj, "user", "") or current_user())
        directory = SessionDir.create(path, info)
        session = cls(directory, sched_obj, claim_period=claim_period, on_allocation_ended=on_allocation_ended)
        session._submit_head()
        if worker_allocation is not None:
            session.add_worker_allocation(worker_allocation)
        if supervise:
            session.start_supervisor(supervise_interval)
        return session

    @classmethod
    def open(cls, path: str | Path, scheduler: Scheduler | None = None, *,
             claim_period: float = election.DEFAULT_CLAIM_PERIOD, supervise: bool = True,
             supervise_interval: float = defaults.SUPERVISE_INTERVAL,
             on_allocation_ended: failures.OnAllocationEnded | None = None) -> Session:
        """Open an existing session from any process (a restarted supervisor,
        a payload step, a CLI). With ``supervise`` it watches the head too."""
        return cls(SessionDir.open(path), scheduler, claim_period=claim_period, supervise=supervise,
                   supervise_interval=supervise_interval, on_allocation_ended=on_allocation_ended)

    @classmethod
    def from_config(cls, file: str | Path, /, **overrides: Any) -> "Session":
        """``create`` from a TOML session file (:mod:`..config.session_file`), then its
        ``[[workers]]``; keyword arguments win over the file (``path=`` the directory)."""
        from ..config.session_file import load_session_file
        return load_session_file(file).create(cls, **overrides)

    # ------------------------------------------------------------ views
    @property
    def path(self) -> Path:
        return self.dir.path

    @property
    def job_name(self) -> str:
        return self.info.job_name

    def record(self) -> AllocationRecord:
        return self.dir.read_allocation()

    def head_config(self) -> SlurmRunAllocationConfig:
        return SlurmRunAllocationConfig.from_dict(self.info.head)

    def query(self, extra: list[str] | None = None, max_age: float = 0.0) -> dict[str, JobInfo]:
        """Every job of the session (the recorded ids and ``extra``) in one scheduler call; a stray it
        shows is cancelled (:mod:`coordinator.allocations.ownership`), a worker allocation that ended
        unasked is recorded (:mod:`coordinator.allocations.failures`); ``max_age`` > 0 accepts the
        shared answer (:mod:`coordinator.allocations.answers`)."""
        rec = self.record()
        self.failure_watch.observe(rec, jobs := self.jobs.query(rec, extra or (), max_age))
        return jobs

    def allocation_failures(self, refresh: bool = True) -> list[failures.AllocationFailure]:
        """Worker allocations whose jobs ended without the session asking, as
        recorded by whichever process saw it first; ``refresh`` queries first."""
        if refresh:
            self.query()
        return failures.failures_of(self.record())

    def job_info(self, job_id: str, unreachable_ok: bool = False, max_age: float = 0.0) -> JobInfo | None:
        """One job's state, in one scheduler call (None if it was not reported); with ``unreachable_ok``
        a scheduler that does not answer is None too (see ``SessionJobs.known``); ``max_age`` as in ``query``."""
        return self.jobs.known(job_id, max_age) if unreachable_ok else self.jobs.listing([job_id], max_age).get(job_id)

    def head_pointer(self) -> str | None:
        """The job ``ray_head`` names now: the head every agent follows."""
        return self.dir.read_ray_head()

    @property
    def worker_allocations(self) -> list[WorkerAllocation]:
        """Live worker allocations (pending or running, not removed), from the shared record."""
        rec = self.record()
        return [WorkerAllocation(self, lw.job_id) for lw in election.live_workers(rec, self.query())
                if not rec.workers[lw.job_id].hosts_run_head]

    # ------------------------------------------------------------ head
    def _submit_head(self) -> str:
        job_id = self.submit_head_allocation(lambda r, job: replace(r, head_job=job))
        self.dir.write_ray_head(job_id)
        log.info("event=head_submitted session=%s job=%s layout=%s", self.job_name, job_id,
                 "separate head" if self.info.ray_head_only else "head on the first allocation")
        return job_id

    def submit_head_allocation(self, record_as: RecordAs | None = None) -> str:
        """Submit an allocation shaped like the session's first head; returns its job id.

        ``record_as(record, job_id)`` records the job's role (the head, a
        successor) in the same update that retires the submission's intent.

        With a separate head (``ray_head_only``) that is a head-only
        allocation whose Ray node advertises no CPUs or GPUs. In the default
        layout it is a worker allocation whose first node also hosts the
        head: its nodes offer their CPUs and GPUs to Ray like any worker's,
        and it is recorded as a worker allocation of the session. Neither the
        record's head nor the ``ray_head`` pointer moves here.
        """
        also = record_as or (lambda r, _job: r)
        if self.info.ray_head_only:
            head = self.head_config()
            spec = submit.head_spec(self.dir, self.job_name, head, self.launcher, self.info.agent_env)
            job_id = self.jobs.submit(spec, head, also)
        else:
            config = SlurmWorkerAllocationConfig.from_dict(self.info.head)
            spec_path = submit.write_worker_spec(self.dir, config, host_head=True)
            job_id = self.jobs.submit(
                submit.worker_spec(self.dir, self.job_name, config, self.launcher, spec_path, self.info.agent_env), config,
                lambda r, job: also(r.with_worker(WorkerRecord(job_id=job, config=config.to_dict(),
                                                               submitted_at=time.time(), hosts_run_head=True)), job),
                spec_path)
        self.note_head_started(job_id)
        return job_id

    def wait_for_head(self, timeout: float = defaults.HEAD_WAIT_TIMEOUT,
                      progress: Callable[[str], None] | None = None) -> str:
        """Wait until the current head has published its endpoint; returns its address (Slurm: ``SchedulerLooks``)."""
        head: str | None = None
        text, looks = "", SchedulerLooks(self.jobs.known)

        def address() -> str | None:
            nonlocal head, text
            head = self.dir.read_ray_head()
            if head is not None:
                endpoint = self.dir.read_head_endpoint(head)
                if endpoint is not None:
                    return endpoint.address
                info = looks.info(head)
                if info is not None and info.state.is_final:
                    raise AllocationFailed(f"head job {head} ended {info.state.value} before it was ready; "
                                           f"{log_tail(self.dir.path, head, 'head')}", state=info.state.value, job_id=head)
                text = f"head {head}: {state_text(info)}"
                if progress:
                    progress(text)
            return None

        return wait_for(address, timeout=timeout, interval=POLL_INTERVAL, error=lambda _: TimeoutError(
            f"no ready head within {timeout:.0f}s ({text or 'no head job named'}); "
            f"{log_tail(self.dir.path, head, 'head')}"))  # type: ignore[return-value]

    # ------------------------------------------------------------ workers
    def _parent_configs(self, rec: AllocationRecord) -> tuple[SlurmRunAllocationConfig | None, SlurmRunAllocationConfig]:
        return submit.first_worker_config(rec, self.info.worker_allocation), self.head_config()

    def add_worker_allocation(self, config: SlurmWorkerAllocationConfig, *,
                              resubmit_on_failure: int = 0) -> WorkerAllocation:
        """Submit a worker allocation; returns on submission, not on start.

        ``resubmit_on_failure=N`` keeps its capacity: a job that ends on its
        own (see :data:`coordinator.allocations.failures.RESUBMIT_ON`) is submitted again with the same
        config by one process of the run, N times at most; ``replaced_by`` on
        the handle names the replacement.
        """
        if not isinstance(config, SlurmWorkerAllocationConfig):
            raise ConfigError("config", config, "must be a SlurmWorkerAllocationConfig")
        failures.check_resubmit_count(resubmit_on_failure)
        first, head = self._parent_configs(self.record())
        resolved = inherit_worker_config(config, first, head)
        if (warning := rejoin_timeout_warning(resolved)) is not None:
            log.warning("event=short_rejoin_timeout session=%s %s", self.job_name, warning)
        job_id = self._submit_worker(resolved, resubmit_on_failure)
        log.info("event=worker_submitted session=%s job=%s partition=%s", self.job_name, job_id, resolved.partition)
        if self.supervisor is not None:   # this process's standby keeper looks again now, not at its next check
            self.supervisor.standby_soon()
        return WorkerAllocation(self, job_id)

    def _submit_worker(self, resolved: SlurmWorkerAllocationConfig, keep: int = 0, replaces: str | None = None) -> str:
        spec_path = submit.write_worker_spec(self.dir, resolved)
        return self.jobs.submit(
            submit.worker_spec(self.dir, self.job_name, resolved, self.launcher, spec_path, self.info.agent_env), resolved,
            lambda r, job: failures.record_worker(r, WorkerRecord(
                job_id=job, config=resolved.to_dict(), submitted_at=time.time(),
                resubmit_on_failure=keep, replaces=replaces)),
            spec_path)

    def _resubmit_worker(self, old: WorkerRecord) -> str:
        return self._submit_worker(SlurmWorkerAllocationConfig.from_dict(old.config),
                                   max(0, old.resubmit_on_failure - 1), old.job_id)

    def node_states(self, job_id: str) -> dict[str, NodeState]:
        """The agents' published states of one job, by node; a node whose file is unreadable is absent."""
        return self.dir.read_node_states(job_id)

    def wait_for_worker_allocation(self, handle: WorkerAllocation | str, timeout: float = defaults.WAIT_TIMEOUT,
                                   progress: Callable[[str], None] | None = None) -> dict[str, str]:
        """Block until every node of the allocation has joined; returns {node: Ray node id} (paced as ``wait_for_head``)."""
        job_id = handle.job_id if isinstance(handle, WorkerAllocation) else handle
        rec = self.record()
        if job_id not in rec.workers:
            raise ValueError(f"handle: job {job_id} is not a worker allocation of this session")
        wanted = SlurmWorkerAllocationConfig.from_dict(rec.workers[job_id].config).num_nodes or 1
        text, looks = "", SchedulerLooks(self.jobs.known)

        def all_joined() -> dict[str, str] | None:
            nonlocal text
            states = self.node_states(job_id)
            joined = {node: s.node_id for node, s in states.items()
                      if s.state is AgentState.JOINED and s.node_id}
            if len(joined) >= wanted:
                return dict(sorted(joined.items()))
            info = looks.info(job_id)
            if info is not None and info.state.is_final:
                self.failure_watch.observe(self.record(), {job_id: info})
                raise AllocationFailed(f"worker allocation {job_id} ended {info.state.value} with "
                                       f"{len(joined)}/{wanted} nodes joined; {log_tail(self.dir.path, job_id, 'worker')}",
                                       state=info.state.value, job_id=job_id)
            last, text = text, f"job {job_id}: {state_text(info)}, {len(joined)}/{wanted} nodes joined"
            if progress and text != last:
                progress(text)
            return None

        return wait_for(all_joined, timeout=timeout, interval=POLL_INTERVAL, error=lambda _: TimeoutError(
            f"worker allocation {job_id} not joined within {timeout:.0f}s ({text}); "
            f"{log_tail(self.dir.path, job_id, 'worker')}"))  # type: ignore[return-value]

    @property
    def secret(self) -> bytes:
        self._secret = self._secret or self.dir.secret()
        return self._secret

    # ------------------------------------------------------------ head health and elections
    def observe_head(self, wait: float = 0.0) -> HeadObservation:
        if self._watch is None:
            self._watch = HeadWatch(self.dir, self.secret, self.info.session_id)
        return self._watch.observe(wait)

    @property
    def head(self) -> Head | None:
        """The current head if it is healthy right now, else None."""
        obs = self.observe_head()
        return Head(obs.job, obs.address, self) if obs.alive and obs.job and obs.address else None

    def assess_head(self, rec: AllocationRecord, jobs: Mapping[str, JobInfo], obs: HeadObservation,
                    now: float) -> election.HeadAssessment:
        """Whether the head needs an election, from the record, one scheduler
        answer and a heartbeat observation (see :mod:`coordinator.head.assessment`)."""
        return assessment.assess(self.dir, rec, jobs, obs, now,
                                 submitted_at=self._head_started_at.get(rec.head_job or "", 0.0))

    def replace_head(self, timeout: float = defaults.WAIT_TIMEOUT,
                     progress: Callable[[str], None] | None = None) -> Head:
        """Return the healthy head, electing one first if the session has none.

        Any number of processes may call this at once: one wins the claim in
        allocation.json and elects; the others wait for the result and get
        the same head. A healthy head is returned unchanged (to move it, call
        ``request_drain()`` on it first).
        """
        job, address = Failover(self).replace_head(timeout, progress)
        return Head(job, address, self)

    def ready_head(self, timeout: float = defaults.WAIT_TIMEOUT, progress: Callable[[str], None] | None = None) -> Head:
        """The current head once it is healthy, never electing (see :mod:`coordinator.head.ready`)."""
        return ready.ready_head(self, timeout, progress)

    def head_is_lost(self) -> bool:
        """Whether the head must be replaced now (ended, stopped, draining, replaced)."""
        return ready.head_is_lost(self)

    def election_claim(self, claimant: str) -> AbstractContextManager[ClaimOutcome]:
        """Take the session's one election claim for a ``with`` block (see
        :func:`coordinator.head.claims.election_claim`), for this session's claim period."""
        return election_claim(self.dir, claimant, self.claim_period)

    def note_head_started(self, job_id: str) -> None:
        """Remember when this process submitted or elected head ``job_id``: its
        silence counts as a failure only after the start grace."""
        self._head_started_at[job_id] = time.time()

    def control(self, endpoint: str) -> ControlClient:
        """A control-channel client for one agent, keyed by this session's secret."""
        return ControlClient(endpoint, self.secret, self.info.session_id)

    def drain_job(self, job_id: str, drain_timeout: float, reason: str) -> int:
        deadline = time.time() + drain_timeout
        # (a head job is not in the workers map; its drain shows in its heartbeat)
        self.dir.update_allocation(lambda r: r.with_worker(replace(
            r.workers[job_id], state=WorkerIntent.DRAINING, drain_requested_at=time.time(), drain_deadline=deadline))
            if job_id in r.workers and r.workers[job_id].state == WorkerIntent.SUBMITTED else r)
        told = 0
        for node, state in self.node_states(job_id).items():
            endpoint = state.control
            if not endpoint or state.exited:
                continue
            try:
                with self.control(endpoint) as client:
                    client.request("drain", {"deadline": deadline, "reason": reason}, timeout=CONTROL_TIMEOUT)
                told += 1
            except ControlError as exc:
                log.warning("event=drain_not_delivered job=%s node=%s error=%s", job_id, node, exc)
        return told

    def remove_worker_allocation(self, handle: WorkerAllocation | str, drain_timeout: float = defaults.DRAIN_TIMEOUT,
                                 wait: bool = True, progress: Callable[[str], None] | None = None) -> JobState:
        """Drain a running allocation (cancel a pending one); returns the final Slurm state
        (a ``JobState``, a ``str`` enum: ``== "COMPLETED"`` works).

        With ``wait=False`` it returns at once (the drain goes on) with the
        state at that moment. The wait ends when the agents publish their
        end or the scheduler says the job ended (see :mod:`coordinator.allocations.removal`).
        """
        job_id = handle.job_id if isinstance(handle, WorkerAllocation) else handle
        return removal.remove_worker_allocation(self, job_id, drain_timeout, wait, progress)

    def autoscale(self, policy: Any) -> None:
        """Scale by itself with ``policy`` (None: stop, allocations stay); returns at once (:mod:`coordinator.scaling`)."""
        scaling_store.set_policy(self.path, policy)

    # ------------------------------------------------------------ payload drivers
    def ray_client_env(self) -> dict[str, str]:
        """What any Ray client of this run needs besides ``RAY_ADDRESS``: its auth settings (``ray_auth``)."""
        return self.dir.ray_auth_env(self.launcher.auth_mode)

    def run(self, argv: list[str], *, env: Mapping[str, str] | None = None, head: Head | None = None,
            stdout=None, stderr=None) -> "PayloadRun":
        """Start a payload driver next to the head, with RAY_ADDRESS set.

        ``head`` is the head the caller expects (as returned by
        ``replace_head``); if the session has moved on from it, the launch
        raises ``SlurmAllocationEnded`` with ``allocation_state="REPLACED"``.
        Without it, the current head is used if it is healthy.
        """
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv: must be a non-empty list of strings")
        pointer = self.dir.read_ray_head()
        if head is not None and pointer != head.job_id:
            raise SlurmAllocationEnded(f"head {head.job_id} was replaced by {pointer}", allocation_state="REPLACED",
                                       job_id=head.job_id)
        current = self.head
        if current is None or (head is not None and current.job_id != head.job_id):
            job = head.job_id if head else pointer
            info = self.job_info(job) if job else None
            state = "REPLACED" if job in self.record().predecessors else (info.state.value if info else "UNKNOWN")
            raise SlurmAllocationEnded(f"no healthy head to run on (head {job}: {state})",
                                       allocation_state=state, job_id=job)
        return PayloadRun(self, current, argv, env=env, stdout=stdout, stderr=stderr)

    # ------------------------------------------------------------ teardown
    def teardown(self, extra: list[str] | None = None, *, wait: bool = False, timeout: float = defaults.TEARDOWN_TIMEOUT,
                 progress: Callable[[str], None] | None = None) -> tuple[str, ...]:
        """Cancel every active job of the session; returns their ids.

        By the ids the session recorded (and jobs marked by its submissions),
        for its user only, never by job name. It never stops halfway: every
        problem is raised once at the end, as TeardownIncomplete, after every
        job it could learn of was tried (``SessionJobs.teardown``). With
        ``wait``, it returns once Slurm has let go of every one of them (none
        PENDING, RUNNING or COMPLETING), within ``timeout`` seconds.
        """
        self.close()
        return self.jobs.teardown(extra or (), wait=wait, timeout=timeout, progress=progress)
