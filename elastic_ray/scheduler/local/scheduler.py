"""The embedded local scheduler: Slurm's behaviour on one machine, without Slurm.

Each allocation is a group of local processes, one per emulated node, each
with the node's own 127.0.0.x address in ``ELASTIC_RAY_NODE_IP`` and the usual
Slurm environment. Pending, walltime with the pre-walltime signal, cancel,
job states and time left are emulated, so the code above the
:class:`~elastic_ray.scheduler.base.Scheduler` runs unchanged on a laptop or in
a test.

Many processes use it at once (a run's supervisor and every payload step
create their own ``LocalScheduler`` on the same state directory) and any of
them may crash, so all state is on disk (``store``) and every job has
its own detached supervisor process (``job``). This class is the thin
front: it validates, writes records, starts supervisors, and reads.

Where it differs from Slurm, on purpose or by simplification:

- Submission refuses at once what Slurm would fail later: a missing
  ``workdir`` or an output file that cannot be created (SchedulerError).
- QoS, account, reservation, constraint and ``time_min`` are ignored.
- Time limits are exact (Slurm rounds up to whole minutes and checks every
  30 s), so sub-minute limits such as ``"0:20"`` are honoured as 20 s.
- A job whose supervisor died is reported as NODE_FAIL if it was running
  (its "nodes" vanished) and FAILED if it was still pending.
- ``signal(batch=True)`` reaches only the first node's process (not its
  group): there is no batch shell; the first node's process stands in for it.
- Job records are kept until the state directory is removed (no MinJobAge).
- The state directory must be used from one host (pids are checked locally).
- Users are emulated: a job records the ``user`` of the scheduler that
  submitted it (default: this process's user), and queries and cancels act
  only on jobs of their user, as squeue and scancel with ``--user`` do. A
  test stands in for a second user with ``LocalScheduler(..., user="other")``.
"""

from __future__ import annotations

import collections
import math
import os
import select
import signal as _signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from ...errors import CorruptFileError, SchedulerError
from ...config.scheduler_choice import SchedulerKind
from ...config.slurm_values import parse_signal
from . import procs
from ..base import JobInfo, JobSpec, JobState, Scheduler, current_user
from .cluster import (
    LocalCluster,
    LocalNode,
    ResourceRequest,
    infeasible_reason,
    predict_start,
    request_from_allocation,
)
from .record import Event, JobRecord, apply_event, job_info, parse_signal_name
from .store import LocalStore

__all__ = ["LocalCluster", "LocalNode", "LocalScheduler", "resolve_output"]

# How long submit() waits for the new supervisor to register in the record.
SUPERVISOR_START_TIMEOUT = 30.0
# How long signal() waits for a just-started job's node processes to be recorded.
NODE_START_TIMEOUT = 5.0


def resolve_output(pattern: str, job_id: str, job_name: str, workdir: Path) -> Path:
    """sbatch's output name: ``%j`` job id, ``%x`` job name, ``%%`` a percent sign;
    relative to the working directory."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "%" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append({"j": job_id, "x": job_name, "%": "%"}.get(nxt, "%" + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    path = Path("".join(out))
    return path if path.is_absolute() else workdir / path


class LocalScheduler(Scheduler):
    """Emulated Slurm on the local machine; state in ``state_dir``.

    ``cluster`` describes the emulated nodes; it is stored in the state
    directory on first use, and every later user must pass the same one or
    None. ``calls`` counts calls per operation (``calls["query"]`` is the
    number of directory scans queries made), so tests can check that a
    session asks about all its jobs in one call.
    """

    kind = SchedulerKind.LOCAL

    def __init__(self, state_dir: str | os.PathLike[str], cluster: LocalCluster | None = None, *,
                 user: str | None = None):
        self.store = LocalStore(state_dir, cluster)
        self.user = user or current_user()
        self.calls: collections.Counter[str] = collections.Counter()
        self._reported_damage: set[tuple[str, str]] = set()

    @property
    def state_dir(self) -> Path:
        return self.store.root

    @property
    def cluster(self) -> LocalCluster:
        return self.store.cluster

    # ------------------------------------------------------------ submit
    def submit(self, spec: JobSpec) -> str:
        self.calls["submit"] += 1
        request = self._feasible_request(spec)
        alloc = spec.allocation
        warning = parse_signal(alloc.signal_before_timeout) if alloc.signal_before_timeout else None
        workdir = Path(spec.workdir).expanduser().resolve()
        if not workdir.is_dir():
            raise SchedulerError(f"workdir {workdir} is not a directory")
        with self.store.lock():
            job_id = self.store.next_job_id()
            output = resolve_output(spec.output, job_id, spec.job_name, workdir)
            try:
                # sbatch's default --open-mode=truncate; O_APPEND so every node's lines land whole.
                out_fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
            except OSError as exc:
                raise SchedulerError(f"cannot open the output file {output}: {exc}") from None
            record = JobRecord(
                job_id=job_id, name=spec.job_name, role=spec.role, submit_time=time.time(),
                request=request, node_argv=spec.node_argv, workdir=str(workdir), output=str(output),
                env=spec.env, pre_start_commands=spec.pre_start_commands,
                time_limit=alloc.time_limit_seconds(),
                warning_signal=warning.name if warning else None,
                warning_seconds=warning.seconds if warning else None,
                reason="None", user=self.user, comment=spec.comment,
            )
            try:
                self.store.write(record)
            except BaseException:
                os.close(out_fd)
                raise
        self.store.log("job.submit", job=job_id, name=spec.job_name, state="PENDING", node="-",
                       role=spec.role, partition=",".join(request.partitions) or self.cluster.default_partition,
                       nodes=request.num_nodes, cpus=request.cpus, gpus=request.gpus)
        try:
            self._start_supervisor(job_id, out_fd)
        except SchedulerError as exc:
            reason = str(exc)
            self.store.update(job_id, lambda r: apply_event(r, Event.LAUNCH_FAILED, time.time(), reason)
                              if r.supervisor is None else r)
            self.store.log("job.launch_failed", job=job_id, name=spec.job_name, state="FAILED", reason=reason)
            raise
        return job_id

    def _feasible_request(self, spec: JobSpec) -> ResourceRequest:
        request = request_from_allocation(spec.allocation)
        reason = infeasible_reason(request, self.cluster)
        if reason is not None:
            raise SchedulerError(f"local scheduler: {reason}", argv=("local", "submit"), returncode=1,
                                 stderr=reason)
        return request

    def _start_supervisor(self, job_id: str, out_fd: int) -> None:
        """Start the job's supervisor detached and wait until it is registered.

        When this returns, the record names a live supervisor, so no other
        process can mistake the new job for an abandoned one.
        """
        read_fd, write_fd = os.pipe()
        argv = [sys.executable, "-m", "elastic_ray.scheduler.local.job", str(self.state_dir), job_id,
                "--notify-fd", str(write_fd)]
        try:
            launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out_fd, stderr=out_fd,
                                        pass_fds=(write_fd,), start_new_session=True, cwd="/")
        except OSError as exc:
            os.close(read_fd)
            raise SchedulerError(f"cannot start the job supervisor: {exc}", argv=tuple(argv)) from None
        finally:
            os.close(write_fd)
            os.close(out_fd)
        try:
            answer = _read_line(read_fd, SUPERVISOR_START_TIMEOUT)
        finally:
            os.close(read_fd)
            try:
                launcher.wait(timeout=SUPERVISOR_START_TIMEOUT)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait()
        if not answer.startswith("ok "):
            raise SchedulerError(f"the supervisor of job {job_id} did not start: {answer or 'no answer'}",
                                 argv=tuple(argv))

    # ------------------------------------------------------------ query
    def query(self, job_name: str, job_ids: Iterable[str] = (), *, user: str | None = None) -> dict[str, JobInfo]:
        self.calls["query"] += 1
        wanted = [str(j) for j in job_ids]
        owner = user or self.user
        now = time.time()
        records, damaged = self.store.scan()
        records = self.store.reap_lost(records, now)
        # By name only the user's own jobs (squeue --name --user); an id asked
        # for by number is answered whoever owns it, like scontrol does.
        out = {job_id: job_info(r, now) for job_id, r in records.items()
               if (r.name == job_name and _owned(r, owner)) or job_id in wanted}
        for job_id in wanted:
            if job_id in out:
                continue
            if job_id in damaged:
                reason = f"record damaged: {damaged[job_id]}"
                if (job_id, reason) not in self._reported_damage:
                    self._reported_damage.add((job_id, reason))
                    self.store.log("query.damaged_record", job=job_id, state=JobState.ENDED_UNKNOWN.value,
                                   node="-", reason=damaged[job_id])
            else:
                reason = "no record of this job"
            out[job_id] = JobInfo(job_id=job_id, name="", state=JobState.ENDED_UNKNOWN, reason=reason)
        return out

    # ------------------------------------------------------------ cancel
    def cancel(self, job_id: str) -> None:
        self.calls["cancel"] += 1
        self._cancel(str(job_id))

    def cancel_jobs(self, job_ids: Iterable[str], *, user: str | None = None) -> None:
        """Like ``scancel --user=U ID...``: a listed job of another user is skipped."""
        self.calls["cancel_jobs"] += 1
        owner = user or self.user
        records, _ = self.store.scan()
        for job_id in dict.fromkeys(str(j) for j in job_ids):
            record = records.get(job_id)
            if record is not None and not _owned(record, owner):
                self.store.log("job.cancel_skipped", job=job_id, name=record.name, node="-",
                               reason=f"owned by {record.user}, not {owner}")
                continue
            self._cancel(job_id)

    def cancel_by_name(self, job_name: str, *, user: str | None = None) -> None:
        self.calls["cancel_by_name"] += 1
        owner = user or self.user
        records, _ = self.store.scan()
        for record in records.values():
            if record.name == job_name and _owned(record, owner) and record.state.is_active:
                self._cancel(record.job_id)

    def _cancel(self, job_id: str) -> None:
        """Pending: CANCELLED at once. Running: the supervisor is asked (record
        flag + SIGTERM) and TERMs, then KILLs, the node processes. Ended,
        unknown or damaged: nothing to do (logged)."""
        now = time.time()
        try:
            with self.store.lock():
                record = self.store.read(job_id)
                if record.state.is_final:
                    return
                if not self.store.supervisor_alive(record, now):
                    new = None
                elif record.state is JobState.PENDING:
                    new = apply_event(record, Event.CANCEL, now)
                else:
                    new = replace(record, cancel_requested=True)
                if new is not None:
                    self.store.write(new)
        except (FileNotFoundError, CorruptFileError) as exc:
            self.store.log("job.cancel_ignored", job=job_id, node="-", reason=str(exc))
            return
        if new is None:
            self.store.reap_lost({job_id: record}, now)
            return
        self.store.log("job.cancel", job=job_id, name=new.name, state=new.state.value,
                       node=",".join(new.nodes) or "-")
        if new.supervisor is not None:
            procs.send(new.supervisor, _signal.SIGTERM)

    # ------------------------------------------------------------ signal
    def signal(self, job_id: str, signal_name: str, *, batch: bool = False) -> None:
        """Deliver ``signal_name`` to every node process's group (a Slurm step
        signal), or with ``batch`` to the first node's process alone."""
        self.calls["signal"] += 1
        try:
            sig = parse_signal_name(signal_name)
        except ValueError as exc:
            raise SchedulerError(f"signal {signal_name!r}: {exc}") from None
        job_id = str(job_id)
        deadline = time.time() + NODE_START_TIMEOUT
        while True:
            record = self._read_for_signal(job_id)
            if record.state is not JobState.RUNNING:
                raise SchedulerError(f"job {job_id} is {record.state.value}, not running: "
                                     "nothing to signal")
            if record.node_procs or time.time() > deadline:
                break
            time.sleep(0.05)  # started a moment ago; its node processes are being recorded
        targets = record.node_procs[:1] if batch else record.node_procs
        sent = [ref.node for ref in targets
                if (procs.send(ref, sig) if batch else procs.send_group(ref, sig))]
        self.store.log("job.signal", job=job_id, name=record.name, state=record.state.value,
                       node=",".join(sent) or "-", signal=sig.name, batch=batch)

    def _read_for_signal(self, job_id: str) -> JobRecord:
        try:
            record = self.store.read(job_id)
        except FileNotFoundError:
            raise SchedulerError(f"job {job_id}: Invalid job id specified") from None
        except CorruptFileError as exc:
            raise SchedulerError(f"job {job_id}: {exc}") from None
        return self.store.reap_lost({job_id: record}, time.time())[job_id]

    # ------------------------------------------------------------ test-only
    def test_only(self, spec: JobSpec) -> float:
        """Predicted start: now if the request fits the free nodes, else the
        earliest planned end of running jobs after which it fits (pending jobs
        are not counted; ``math.inf`` if only unlimited jobs could free room)."""
        self.calls["test_only"] += 1
        request = self._feasible_request(spec)
        now = time.time()
        records, _ = self.store.scan()
        records = self.store.reap_lost(records, now)
        running = []
        for record in records.values():
            if not record.holds_resources:
                continue
            if record.state is JobState.COMPLETING:
                end: float | None = (record.teardown_since or now) + self.cluster.kill_wait
            else:
                end = record.end_time
            running.append((end, record.holdings))
        start = predict_start(request, self.cluster, running, now)
        return start if math.isinf(start) else max(now, start)


def _owned(record: JobRecord, user: str) -> bool:
    """A record from before users were recorded (no user) counts as anyone's."""
    return not record.user or record.user == user


def _read_line(fd: int, timeout: float) -> str:
    """The first line written to ``fd`` ('' on EOF or timeout)."""
    deadline = time.time() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.time()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode("utf-8", "replace").split("\n", 1)[0].strip()
