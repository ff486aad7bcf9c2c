"""One local job's supervisor: slurmctld + slurmstepd for that job alone.

    python -m elastic_ray.scheduler.local.job <state_dir> <job_id> [--notify-fd N]

``LocalScheduler.submit`` starts it detached (own session, stdout/stderr to
the job's output file). It waits PENDING until the emulated cluster has room
(deciding under the state directory's lock), runs the node command once per
node, each in its own session so it can be signalled as a group, enforces
the walltime with the pre-walltime signal, TERM and KILL after KillWait, and
records the final state. Every decision is a pure function in
``record`` / ``cluster``; this module only carries them out.

It also becomes a child subreaper, so that processes the node commands
daemonize stay in its tree and die with the job, as proctrack/cgroup does on
Slurm. If this process itself is killed, any other user of the state
directory notices (pid + start time) and reports the job as ended.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime

import psutil

from ...errors import CorruptFileError, SchedulerError
from . import procs
from ..base import JobState
from .cluster import Placement, schedule
from .record import (
    BeginEnding,
    Event,
    Finish,
    JobRecord,
    Kill,
    ProcRef,
    RunView,
    SendWarning,
    Wait,
    apply_event,
    decide,
    exit_event,
    node_argv,
    node_environment,
    parse_signal_name,
    started,
    warning_time,
)
from .store import LocalStore

# Longest sleep without looking at the record: a cancel written by a process
# that died before it could signal us is still seen within this time.
MAX_TICK = 1.0


class Supervisor:
    """Carries one job from PENDING to its final state."""

    def __init__(self, store: LocalStore, job_id: str):
        self.store = store
        self.job_id = job_id
        self.cluster = store.cluster
        self.cancel_signalled = False
        self.children: dict[int, tuple[str, subprocess.Popen[bytes]]] = {}
        self.exit_codes: dict[str, int] = {}
        self.killed = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    # ------------------------------------------------------------ setup
    def register(self) -> JobRecord:
        """Write our pid + start time into the record, so others can check on us."""
        me = procs.ref_of(os.getpid())

        def change(record: JobRecord) -> JobRecord:
            if record.state.is_final:
                return record
            if (record.supervisor is not None and record.supervisor.pid != me.pid
                    and procs.is_alive(record.supervisor)):
                raise SchedulerError(f"job {self.job_id} already has a supervisor (pid {record.supervisor.pid})")
            return replace(record, supervisor=me)

        return self.store.update(self.job_id, change)

    def install_signal_handlers(self) -> None:
        """TERM/INT/HUP mean cancel (that is how ``cancel`` reaches us);
        CHLD and USR2 only wake the loop (a node exited; nodes were freed)."""
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)

        def on_cancel(signum: int, frame: object) -> None:
            self.cancel_signalled = True

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, on_cancel)
        for sig in (signal.SIGCHLD, signal.SIGUSR2):
            signal.signal(sig, lambda signum, frame: None)

    def sleep_until(self, until: float | None) -> None:
        """Sleep until ``until``, a signal, or MAX_TICK, whichever comes first."""
        timeout = MAX_TICK if until is None else min(MAX_TICK, max(0.0, until - time.time()))
        try:
            select.select([self._wake_r], [], [], timeout)
        except InterruptedError:
            pass
        try:
            while self._wake_r.recv(512):
                pass
        except (BlockingIOError, OSError):
            pass

    def log(self, event: str, record: JobRecord | None = None, **fields: object) -> None:
        base: dict[str, object] = {"job": self.job_id}
        if record is not None:
            base.update(name=record.name, state=record.state.value, node=",".join(record.nodes) or "-")
        base.update(fields)
        self.store.log(event, **base)

    # ------------------------------------------------------------ pending
    def wait_for_nodes(self) -> JobRecord | None:
        """PENDING until the cluster has room; the started record, or None if the job ended first."""
        last_reason = None
        while True:
            now = time.time()
            record = self._read_own()
            if record is None or record.state.is_final:
                return None
            if record.state is not JobState.PENDING:
                return record
            if self.cancel_signalled:
                record = self.store.update(self.job_id, lambda r: apply_event(r, Event.CANCEL, now))
                self.log("job.cancelled", record, reason="cancelled while pending")
                return None
            records, _ = self.store.scan()
            records = self.store.reap_lost(records, now)
            placed, reasons = self._plan(records)
            if self.job_id in placed:
                record = self._try_start(now)
                if record is not None:
                    return record
            elif reasons.get(self.job_id) != last_reason:
                last_reason = reasons.get(self.job_id)
                reason = last_reason or "Resources"
                self.store.update(self.job_id, lambda r: replace(r, reason=reason)
                                  if r.state is JobState.PENDING else r)
            self.sleep_until(now + self.cluster.sched_interval)

    def _plan(self, records: dict[str, JobRecord]) -> tuple[dict[str, Placement], dict[str, str]]:
        """The same plan every pending job's supervisor computes (see cluster.schedule)."""
        held = [h for r in records.values() if r.holds_resources for h in r.holdings]
        pending = [(r.job_id, r.request) for r in records.values() if r.state is JobState.PENDING]
        return schedule(self.cluster, held, pending)

    def _try_start(self, now: float) -> JobRecord | None:
        """Decide again under the lock (others may have started since) and claim the nodes."""
        with self.store.lock():
            records, _ = self.store.scan()
            record = records.get(self.job_id)
            if record is None or record.state is not JobState.PENDING:
                return None
            placed, _ = self._plan(records)
            placement = placed.get(self.job_id)
            if placement is None:
                return None
            record = started(record, placement, max(now, time.time()))
            self.store.write(record)
        self.log("job.start", record, partition=record.partition,
                 time_limit=record.time_limit if record.time_limit is not None else "UNLIMITED")
        return record

    # ------------------------------------------------------------ running
    def launch(self, record: JobRecord) -> bool:
        """Start one process per node; False if any could not be started."""
        argv = node_argv(record)
        base = dict(os.environ)
        refs: list[ProcRef] = []
        ok = True
        # If this supervisor is killed, its node processes die with it (the
        # reaper that notices the lost job also kills their groups).
        die_with_us = procs.die_with_parent(os.getpid())
        for index, holding in enumerate(record.holdings):
            env = node_environment(record, index, base, self.cluster.node(holding.node).address)
            try:
                proc = subprocess.Popen(argv, cwd=record.workdir, env=env, stdin=subprocess.DEVNULL,
                                        start_new_session=True, preexec_fn=die_with_us)
            except OSError as exc:
                print(f"local-scheduler: error: {holding.node}: cannot start {argv[0]!r}: {exc}", flush=True)
                self.exit_codes[holding.node] = 127
                self.log("node.launch_failed", record, node=holding.node, reason=str(exc))
                ok = False
                continue
            self.children[proc.pid] = (holding.node, proc)
            try:  # our unreaped child: its /proc entry (and start time) stays until we reap it
                refs.append(ProcRef(proc.pid, psutil.Process(proc.pid).create_time(), holding.node))
            except psutil.Error:
                pass
            # Recorded one by one, so a crash between two launches leaves no unrecorded node.
            recorded = tuple(refs)
            self.store.update(self.job_id, lambda r: replace(r, node_procs=recorded))
            self.log("node.start", record, node=holding.node, node_pid=proc.pid)
        return ok

    def reap(self) -> None:
        """Collect every exited child: node processes' statuses, and orphans we adopted."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.children:
                node, proc = self.children.pop(pid)
                code = os.waitstatus_to_exitcode(status)
                proc.returncode = code
                self.exit_codes[node] = code
                self.store.log("node.exit", job=self.job_id, node=node, node_pid=pid, exit_code=code)

    def supervise(self, record: JobRecord, launched: bool) -> None:
        """RUNNING -> (COMPLETING) -> final, one :func:`decide` step at a time."""
        if not launched:
            record = self._begin_ending(Event.LAUNCH_FAILED, time.time())
        while True:
            self.reap()
            now = time.time()
            fresh = self._read_own()
            if fresh is None or fresh.state.is_final:
                # Damaged, deleted, or ended by someone who thought we were dead:
                # the job must not keep running behind the record's back.
                self._kill_everything(signal.SIGKILL)
                self.log("job.abandoned", fresh, reason="record ended or unreadable while running")
                return
            record = fresh
            view = RunView(
                now=now,
                state=record.state,
                end_time=record.end_time if record.state is JobState.RUNNING else None,
                warning_at=warning_time(record.start_time or now, record.time_limit, record.warning_seconds),
                warning_sent=record.warning_sent_at is not None,
                cancel_requested=record.cancel_requested or self.cancel_signalled,
                teardown_since=record.teardown_since,
                kill_wait=self.cluster.kill_wait,
                killed=self.killed,
                nodes_alive=len(self.children),
            )
            action = decide(view)
            if isinstance(action, Finish):
                self._finish(now)
                return
            if isinstance(action, BeginEnding):
                self._begin_ending(action.event, now)
            elif isinstance(action, SendWarning):
                self._send_warning(record, now)
            elif isinstance(action, Kill):
                self._kill_everything(signal.SIGKILL)
                self.killed = True
                self.log("job.kill", record, reason=f"KillWait {self.cluster.kill_wait:g}s over")
            elif isinstance(action, Wait):
                self.sleep_until(action.until)

    def _send_warning(self, record: JobRecord, now: float) -> None:
        sig = parse_signal_name(record.warning_signal or "TERM")
        for ref in record.node_procs:
            procs.send_group(ref, sig)
        self.store.update(self.job_id, lambda r: replace(r, warning_sent_at=now))
        self.log("job.warning", record, signal=sig.name,
                 reason=f"{record.warning_seconds}s before the time limit")

    def _begin_ending(self, event: Event, now: float) -> JobRecord:
        record = self.store.update(self.job_id, lambda r: apply_event(r, event, now))
        why = {Event.CANCEL: "CANCELLED", Event.TIME_LIMIT: "CANCELLED DUE TO TIME LIMIT",
               Event.LAUNCH_FAILED: "FAILED (a node process could not start)"}[event]
        stamp = datetime.fromtimestamp(now).isoformat(timespec="seconds")
        first = record.nodes[0] if record.nodes else "-"
        # The line slurmstepd writes into the job's output, so people reading it find the same words.
        print(f"local-scheduler: error: *** JOB {self.job_id} ON {first} {why} AT {stamp} ***", flush=True)
        self._kill_everything(signal.SIGTERM)
        self.log("job.ending", record, ending_as=record.ending_as.value if record.ending_as else "-",
                 reason=event.value)
        return record

    def _kill_everything(self, sig: int) -> None:
        """Signal every node process group and every process of our tree.

        That is what Slurm does to a job that ends (proctrack/cgroup): the
        node commands and whatever they started, daemons included.
        """
        groups = set()
        for _, proc in list(self.children.values()):
            try:
                os.killpg(proc.pid, sig)  # our own unreaped children: the pid cannot be reused yet
                groups.add(proc.pid)
            except (ProcessLookupError, PermissionError):
                pass
        # Everything else in our tree, once: a process in a node's group already got it.
        others = []
        for proc in procs.descendants():
            try:
                if os.getpgid(proc.pid) not in groups:
                    others.append(proc)
            except (ProcessLookupError, PermissionError):
                pass
        procs.signal_all(others, sig)

    def _finish(self, now: float) -> None:
        """All node processes are gone: clear stragglers, record the final state, wake pending jobs."""
        strays = procs.descendants()
        if strays:
            procs.signal_all(strays, signal.SIGKILL)
            psutil.wait_procs(strays, timeout=2)
            self.reap()
        codes = dict(self.exit_codes)
        event = exit_event(codes)
        record = self.store.update(
            self.job_id, lambda r: replace(apply_event(r, event, now), exit_codes=codes))
        self.log("job.end", record, reason=record.reason,
                 exit_codes=",".join(f"{n}:{c}" for n, c in sorted(codes.items())) or "-")
        records, _ = self.store.scan()
        self.store.wake_pending(records)

    def _read_own(self) -> JobRecord | None:
        try:
            return self.store.read(self.job_id)
        except (FileNotFoundError, CorruptFileError, OSError) as exc:
            self.store.log("job.unreadable", job=self.job_id, reason=str(exc))
            return None

    # ------------------------------------------------------------ main
    def run(self) -> int:
        record = self.wait_for_nodes()
        if record is None or record.state is not JobState.RUNNING:
            return 0
        launched = self.launch(record)
        self.supervise(record, launched)
        return 0


def _notify(fd: int | None, message: str) -> None:
    if fd is None:
        return
    try:
        os.write(fd, (message + "\n").encode())
        os.close(fd)
    except OSError:
        pass  # the submitter gave up waiting; the record still tells the truth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m elastic_ray.scheduler.local.job",
                                     description="supervise one job of the local scheduler")
    parser.add_argument("state_dir")
    parser.add_argument("job_id")
    parser.add_argument("--notify-fd", type=int, default=None,
                        help="detach (fork, new session) and write 'ok <pid>' to this fd once registered")
    args = parser.parse_args(argv)
    notify_fd = args.notify_fd
    if notify_fd is not None:
        # Fork so the submitter can reap its child at once: the supervisor is
        # re-parented to init and never lingers as a zombie in a long-lived
        # submitter (a run's supervisor submits hundreds of allocations).
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
        os.chdir("/")
    try:
        store = LocalStore(args.state_dir)
        supervisor = Supervisor(store, args.job_id)
        # Before registering: a cancel may arrive the moment submit() returns.
        supervisor.install_signal_handlers()
        # Handled signals are default again in the job's processes after exec; blocked ones would stay blocked.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP))
        procs.become_subreaper()
        record = supervisor.register()
    except Exception as exc:  # noqa: BLE001 - reported to the submitter, which raises SchedulerError
        _notify(notify_fd, f"error {type(exc).__name__}: {exc}")
        return 1
    _notify(notify_fd, f"ok {os.getpid()}")
    supervisor.log("supervisor.start", record)
    if record.state.is_final:
        return 0
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
