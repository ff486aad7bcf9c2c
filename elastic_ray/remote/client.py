"""A session driven from outside the cluster, over SSH only.

:class:`RemoteSession` has the methods of :class:`~elastic_ray.Session` that
a run uses (create/open, add/wait/remove worker allocations,
``worker_allocations``, ``replace_head``, ``run(...).wait()``, ``teardown``),
and hands out the same handle types (``WorkerAllocation``, ``Head``) and
raises the same exception types with the same attributes. Each method is
one remote command over the multiplexed SSH connection (:mod:`.ssh`,
:mod:`.wire`, :mod:`.server`); nothing but SSH crosses the boundary.

What it does not keep: any state. The session directory on the cluster is
the truth, and the cluster-side supervisor (:mod:`.supervisor`) watches the
head, so a client can be killed at any point and a new one ``open``\\ s the
session and carries on from what is there.
"""

from __future__ import annotations

import collections
import logging
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from .. import __version__, defaults
from ..config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from ..config.launcher import RayLauncher
from ..coordinator.drivers import RunResult
from ..coordinator.handles import Head, WorkerAllocation
from ..coordinator.scaling.store import as_policy
from ..config.autoscale import AutoscalePolicy
from ..errors import ConfigError
from ..history.summary import UsageSummary
from ..protocol.disk.records import AllocationRecord, SessionInfo
from ..scheduler.base import JobState
from . import wire
from .ssh import SSH_FAILED, SshConnection, SshError, SshTarget

log = logging.getLogger(__name__)

SERVER = ["-m", "elastic_ray.remote.server"]
STDERR_LINES = 200  # the end of ssh's and the cluster side's stderr kept for an error message
EXIT_GRACE = 10.0  # s for ssh to exit once the call answered
#: s a failed call waits for the end of ssh's stderr (bounded: a persisting master connection
#: that ssh forked keeps the pipe open, so the end may never come).
STDERR_GRACE = 2.0
CALL_MARGIN = 60.0  # s a call may take beyond the timeout it passes to the cluster side
USAGE_TIMEOUT = 120.0  # s for the cluster side to read a run's log and draw its page (a big run: seconds)


class RemoteCall:
    """One running remote command: request sent, events read as they come."""

    def __init__(self, conn: SshConnection, remote_python: str, op: str, args: Mapping[str, Any],
                 on_event: Callable[[dict[str, Any]], None] | None = None):
        self.conn, self.op, self.remote_python = conn, op, remote_python
        self.command = [remote_python, *SERVER]
        self.on_event = on_event
        self.proc = conn.popen(self.command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self._stderr: collections.deque[bytes] = collections.deque(maxlen=STDERR_LINES)
        self._stderr_reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_reader.start()
        self.outcome: dict[str, Any] | None = None
        self.done = threading.Event()
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(wire.request(op, args, __version__))
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # ssh already ended; read() says why
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        threading.Thread(target=self._keep_alive, daemon=True).start()

    def _keep_alive(self) -> None:
        """A byte every ``wire.KEEPALIVE`` s: the cluster side's proof that this client is still there."""
        while not self.done.wait(wire.KEEPALIVE):
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):
                return   # closed: the call ended or was cancelled

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                event = wire.decode(line)
                if event is None:
                    log.debug("remote noise: %r", line[:200])
                elif event["ev"] in ("result", "error"):
                    self.outcome = event
                    break   # the answer is in; nothing after it matters
                elif self.on_event is not None:
                    self.on_event(event)
        except wire.ProtocolError as exc:
            self.outcome = wire.error_event(exc)
        finally:
            self.done.set()

    def cancel(self) -> None:
        """Close our end: the cluster side stops a payload or abandons a wait."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass

    def result(self, timeout: float | None = None) -> Any:
        """The call's value, or its error raised as the same type."""
        if not self.done.wait(timeout):
            self.cancel()
            raise TimeoutError(f"{self.op} over ssh to {self.conn.target.host}: no answer in {timeout:g} s; "
                               f"stopped it")
        self.cancel()
        try:
            rc = self.proc.wait(EXIT_GRACE)
        except subprocess.TimeoutExpired:
            # Answered, but the channel stays open (something on the cluster
            # side kept its stdout): our own ssh client is not needed any more.
            self.proc.terminate()
            rc = self.proc.wait()
        if self.outcome is None:
            raise self._failure(rc)
        if self.outcome["ev"] == "error":
            exc = wire.rebuild_error(self.outcome)
            if isinstance(exc, wire.RemoteVersionMismatch) and not exc.remote_python:
                exc = wire.RemoteVersionMismatch(exc.client_version, exc.cluster_version,
                                                 f"{self.remote_python} on {self.conn.target.host}")
            raise exc
        return self.outcome.get("value")

    def _failure(self, rc: int) -> Exception:
        # ssh has exited, but its last words may still be on their way through the
        # stderr reader: without this wait a loaded machine lost them (CI, 2026-12-02:
        # a refused key reported as "no message").
        self._stderr_reader.join(STDERR_GRACE)
        stderr = b"".join(self._stderr).decode(errors="replace").strip()
        if rc == SSH_FAILED:
            return SshError(self.conn.target, self.command, rc, stderr)
        if rc == 127 or "No module named" in stderr:   # no such interpreter; no elastic-ray in it
            return wire.RemoteSetupError(
                f"the cluster side could not start {' '.join(self.command)!r} on {self.conn.target.host} "
                f"(exit {rc}): {stderr.splitlines()[-1] if stderr else 'no message'}; install elastic-ray "
                f"{__version__} there and point remote_python at that interpreter")
        return wire.ProtocolError(f"{self.op} on {self.conn.target.host} ended (exit {rc}) without an answer: "
                                  f"{stderr[-2000:] or 'no message'}")


class RemoteRun:
    """A payload driver started over SSH; ``wait`` is the same as a local run's."""

    def __init__(self, session: "RemoteSession", args: dict[str, Any], stdout: IO[str] | None,
                 stderr: IO[str] | None, on_pipes: Callable[[str], None] | None = None):
        self.session = session
        self._streams = {1: stdout, 2: stderr}
        self._on_pipes = on_pipes
        self.started = threading.Event()
        self.head_job: str | None = None
        self.driver_pid: int | None = None  # on the cluster side, once started
        self.call = RemoteCall(session.conn, session.remote_python, "run", args, self._event)

    def _event(self, event: dict[str, Any]) -> None:
        kind = event["ev"]
        if kind == "out":
            stream = self._streams.get(event.get("fd")) or (sys.stdout if event.get("fd") == 1 else sys.stderr)
            stream.write(event.get("data", ""))
            stream.flush()
        elif kind == "pipes" and self._on_pipes is not None:
            self._on_pipes(event.get("line", ""))
        elif kind == "started":
            self.head_job = event.get("head_job")
            self.driver_pid = event.get("pid")
            self.started.set()

    def wait(self, timeout: float | None = None) -> RunResult:
        try:
            value = self.call.result(timeout)
        except TimeoutError:
            raise TimeoutError(f"driver still running after {timeout:.0f}s; stopped it") from None
        return RunResult(int(value["returncode"]), str(value["head_job"]), float(value["seconds"]))

    def stop(self) -> None:
        """Stop the driver on the cluster (it ends with the call)."""
        self.call.cancel()


class RemoteSession:
    """A run on a Slurm cluster, driven from outside it over SSH."""

    def __init__(self, conn: SshConnection, path: str, remote_python: str, described: Mapping[str, Any]):
        """Made by :meth:`create`, :meth:`open` or :meth:`open_or_create`, not directly."""
        self.conn, self.remote_python = conn, remote_python
        self._path = path
        self.info = SessionInfo.from_dict(described["info"])
        self.supervisor_pid = described.get("supervisor_pid")
        self.launcher = RayLauncher.from_dict(self.info.launcher)

    # ------------------------------------------------------------ create / open
    @staticmethod
    def _connection(ssh: SshTarget | SshConnection) -> SshConnection:
        if isinstance(ssh, SshConnection):
            return ssh
        if isinstance(ssh, SshTarget):
            return SshConnection(ssh)
        raise ConfigError("ssh", ssh, "must be an SshTarget (host, user, port, key_path, ...) or an SshConnection")

    @staticmethod
    def _remote_path(path: str | Path) -> str:
        text = str(path)
        if not text.startswith("/"):
            raise ConfigError("path", text, "must be an absolute path on the cluster side")
        return text

    @classmethod
    def create(cls, path: str | Path, *, ssh: SshTarget | SshConnection, head: SlurmRunAllocationConfig,
               remote_python: str = "python3", scheduler: str = "slurm", launcher: RayLauncher | None = None,
               ray_head_only: bool = True, worker_allocation: SlurmWorkerAllocationConfig | None = None,
               job_name: str | None = None, supervise_interval: float = defaults.SUPERVISE_INTERVAL,
               abandon_after: float = defaults.ABANDON_AFTER) -> "RemoteSession":
        """Create the session on the cluster side and submit its head (as ``Session.create``).

        ``path`` is a directory on the cluster's shared filesystem;
        ``remote_python`` the cluster side's interpreter with elastic-ray
        installed. ``scheduler`` is ``"slurm"`` unless told otherwise (the
        SSH mode reaches a cluster by definition). The configs are checked
        here first, so a bad field fails before any SSH traffic. The
        session's detached supervisor starts with it and watches the head
        every ``supervise_interval`` s; it stops supervising once no client
        has called for ``abandon_after`` s (default a day).
        """
        conn, remote = cls._connection(ssh), cls._remote_path(path)
        args = cls._create_args(remote, head, scheduler=scheduler, launcher=launcher, ray_head_only=ray_head_only,
                                worker_allocation=worker_allocation, job_name=job_name,
                                supervise_interval=supervise_interval, abandon_after=abandon_after)
        described = RemoteCall(conn, remote_python, "create", args).result()
        return cls(conn, remote, remote_python, described)

    @staticmethod
    def _create_args(remote: str, head: SlurmRunAllocationConfig, *, scheduler: str = "slurm",
                     launcher: RayLauncher | None = None, ray_head_only: bool = True,
                     worker_allocation: SlurmWorkerAllocationConfig | None = None, job_name: str | None = None,
                     supervise_interval: float = defaults.SUPERVISE_INTERVAL,
                     abandon_after: float = defaults.ABANDON_AFTER) -> dict[str, Any]:
        """Pure: the arguments of a create, checked here before any SSH traffic."""
        if not isinstance(head, SlurmRunAllocationConfig):
            raise ConfigError("head", head, "must be a SlurmRunAllocationConfig")
        if worker_allocation is not None and not isinstance(worker_allocation, SlurmWorkerAllocationConfig):
            raise ConfigError("worker_allocation", worker_allocation, "must be a SlurmWorkerAllocationConfig")
        if launcher is not None and not isinstance(launcher, RayLauncher):
            raise ConfigError("launcher", launcher, "must be a RayLauncher")
        for name, value in (("supervise_interval", supervise_interval), ("abandon_after", abandon_after)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(name, value, "must be a number of seconds above 0")
        return {"path": remote, "head": head.to_dict(), "scheduler": scheduler,
                "launcher": None if launcher is None else launcher.to_dict(), "ray_head_only": ray_head_only,
                "worker_allocation": None if worker_allocation is None else worker_allocation.to_dict(),
                "job_name": job_name, "supervise_interval": supervise_interval, "abandon_after": abandon_after}

    @classmethod
    def open_or_create(cls, path: str | Path, *, ssh: SshTarget | SshConnection, head: SlurmRunAllocationConfig,
                       remote_python: str = "python3", **create: Any) -> tuple["RemoteSession", bool]:
        """The session at ``path``, created unless it exists (one creator among
        concurrent callers, under a lock on the cluster side); returns it and
        whether this call created it. ``create`` takes ``create``'s keywords."""
        conn, remote = cls._connection(ssh), cls._remote_path(path)
        args = cls._create_args(remote, head, **create)
        described = RemoteCall(conn, remote_python, "open_or_create", args).result()
        return cls(conn, remote, remote_python, described), bool(described.get("created"))

    @classmethod
    def open(cls, path: str | Path, *, ssh: SshTarget | SshConnection, remote_python: str = "python3",
             supervise_interval: float = defaults.SUPERVISE_INTERVAL,
             abandon_after: float = defaults.ABANDON_AFTER) -> "RemoteSession":
        """Open an existing session (a reconnecting client): it sees the
        current state, and restarts the detached supervisor if that is gone."""
        conn, remote = cls._connection(ssh), cls._remote_path(path)
        described = RemoteCall(conn, remote_python, "open", {"path": remote, "supervise_interval": supervise_interval,
                                                             "abandon_after": abandon_after}).result()
        return cls(conn, remote, remote_python, described)

    def _call(self, op: str, progress: Callable[[str], None] | None = None, **args: Any) -> Any:
        def on_event(event: dict[str, Any]) -> None:
            if event["ev"] == "progress" and progress is not None:
                progress(str(event.get("message", "")))

        # A wait's own timeout is the cluster side's; the client allows a margin beyond it.
        wait = args.get("timeout")
        call = RemoteCall(self.conn, self.remote_python, op, {"path": self._path, **args}, on_event)
        return call.result(None if wait is None else float(wait) + CALL_MARGIN)

    def close(self) -> None:
        """End the SSH master connection (the session and its supervisor keep running)."""
        self.conn.close()

    def __enter__(self) -> "RemoteSession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ views
    @property
    def path(self) -> str:
        """The session directory, on the cluster side."""
        return self._path

    @property
    def job_name(self) -> str:
        """The Slurm job name of every job of the session."""
        return self.info.job_name

    def record(self) -> AllocationRecord:
        """The session's shared record (allocation.json), read on the cluster side."""
        return AllocationRecord.from_dict(self._call("record"))

    @property
    def head(self) -> Head | None:
        """The current head if it is healthy, else None."""
        value = self._call("head")
        return None if value is None else Head(value["job_id"], value["address"], self)

    def head_config(self) -> SlurmRunAllocationConfig:
        """The head allocation's config as the session recorded it."""
        return SlurmRunAllocationConfig.from_dict(self.info.head)

    @property
    def worker_allocations(self) -> list[WorkerAllocation]:
        """Live worker allocations (pending or running, not removed)."""
        return [WorkerAllocation(self, job) for job in self._call("worker_allocations")]

    def usage(self, timeout: float = USAGE_TIMEOUT) -> UsageSummary:
        """What the run held so far (node- and GPU-hours, head moves), computed on the cluster
        side from the session's event log; its timeline page is drawn there too when the
        ``timeline`` extra is installed there (``timeline`` is then its path on the cluster).
        An older cluster side that does not know the call answers :class:`ProtocolError`."""
        return wire.usage_answer(self._call("usage", timeout=timeout))

    def hello(self) -> dict[str, Any]:
        """The cluster side's version and interpreter (a version mismatch raises)."""
        return self._call("hello")

    # ------------------------------------------------------------ changes
    def wait_for_head(self, timeout: float = defaults.HEAD_WAIT_TIMEOUT,
                      progress: Callable[[str], None] | None = None) -> str:
        """Wait until the head published its endpoint; returns its address. ``progress`` gets the waits' news."""
        return self._call("wait_for_head", progress, timeout=timeout)

    def add_worker_allocation(self, config: SlurmWorkerAllocationConfig | None = None) -> WorkerAllocation:
        """Submit a worker allocation (unset fields inherit the first one's); returns on submission."""
        if config is not None and not isinstance(config, SlurmWorkerAllocationConfig):
            raise ConfigError("config", config, "must be a SlurmWorkerAllocationConfig")
        job = self._call("add_worker", config=None if config is None else config.to_dict())
        return WorkerAllocation(self, job)

    def autoscale(self, policy: AutoscalePolicy | Mapping[str, Any] | None) -> None:
        """Scale the run by itself with ``policy`` (None: stop; allocations stay), as ``Session.autoscale``;
        the cluster side's detached supervisor runs it. Checked here first: a refused policy makes no call."""
        checked = as_policy(policy)
        self._call("autoscale", policy=None if checked is None else checked.to_dict())

    def wait_for_worker_allocation(self, handle: WorkerAllocation | str, timeout: float = defaults.WAIT_TIMEOUT,
                                   progress: Callable[[str], None] | None = None) -> dict[str, str]:
        """Wait until every node of the allocation joined; returns {node: Ray node id}."""
        return self._call("wait_worker", progress, timeout=timeout, job_id=_job(handle))

    def remove_worker_allocation(self, handle: WorkerAllocation | str, drain_timeout: float = defaults.DRAIN_TIMEOUT,
                                 wait: bool = True, progress: Callable[[str], None] | None = None) -> JobState:
        """Drain a running allocation (cancel a pending one); returns its final Slurm state."""
        return JobState(self._call("remove_worker", progress, job_id=_job(handle), drain_timeout=drain_timeout,
                                   wait=wait))

    def drain_job(self, job_id: str, drain_timeout: float, reason: str) -> int:
        """Ask every node of a job to drain (what ``request_drain`` of a handle calls); returns how many agents took it."""
        return self._call("drain_job", job_id=job_id, drain_timeout=drain_timeout, reason=reason)

    def ready_head(self, timeout: float = defaults.WAIT_TIMEOUT,
                   progress: Callable[[str], None] | None = None) -> Head:
        """The current head once healthy; waits while it is queued or starting, never elects."""
        value = self._call("ready_head", progress, timeout=timeout)
        return Head(value["job_id"], value["address"], self)

    def head_is_lost(self) -> bool:
        """Whether the head must be replaced now (ended, stopped, draining, replaced)."""
        return bool(self._call("head_is_lost"))

    def replace_head(self, timeout: float = defaults.WAIT_TIMEOUT,
                     progress: Callable[[str], None] | None = None) -> Head:
        value = self._call("replace_head", progress, timeout=timeout)
        return Head(value["job_id"], value["address"], self)

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, head: Head | None = None,
            stdout: IO[str] | None = None, stderr: IO[str] | None = None, pipes_path: str | None = None,
            on_pipes: Callable[[str], None] | None = None) -> RemoteRun:
        """Start a payload driver next to the head; its output streams back here.

        ``argv`` runs on the cluster side (paths there). Closing this process
        stops the driver; the session goes on.
        """
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv: must be a non-empty list of strings")
        bad = [k for k, v in (env or {}).items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise ValueError(f"env[{bad[0]!r}]: names and values must be strings")
        args: dict[str, Any] = {"path": self._path, "argv": list(argv), "env": dict(env or {}),
                                "head": None if head is None else {"job_id": head.job_id, "address": head.address},
                                "pipes_path": pipes_path}
        return RemoteRun(self, args, stdout, stderr, on_pipes)

    def put_file(self, remote_path: str, data: bytes, mode: int = 0o600) -> str:
        """Write ``data`` to ``remote_path`` on the cluster side (atomically); returns the path."""
        import base64

        return self._call("put_file", target=self._remote_path(remote_path),
                          data=base64.b64encode(data).decode(), mode=mode)

    def teardown(self, extra: Sequence[str] | None = None, *, wait: bool = False,
                 timeout: float = defaults.TEARDOWN_TIMEOUT,
                 progress: Callable[[str], None] | None = None) -> tuple[str, ...]:
        """Stop the cluster-side supervisor and cancel every job of the session;
        returns their ids (with ``wait``, once Slurm has let go of them all, as
        ``Session.teardown``). Closes the SSH connection after (as ``Session.teardown``
        ends its supervision); a later call opens it again."""
        try:
            return tuple(self._call("teardown", progress, extra=list(extra or ()), wait=wait, timeout=timeout))
        finally:
            self.close()


def _job(handle: WorkerAllocation | str) -> str:
    return handle.job_id if isinstance(handle, WorkerAllocation) else str(handle)
