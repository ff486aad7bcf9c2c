"""The effect shell around ONE local Ray node: start it, watch it, stop it.

A node is one ``ray start --block`` process started in a session of its own
(``start_new_session=True``). Everything Ray starts for the node (GCS,
raylet, log monitor, dashboard agent, runtime-env agent, task and actor
workers) stays in that session, so the session id names the whole node: the
agent finds and stops exactly its own processes, never another node's on the
same host (which ``ray stop`` would, by name, machine-wide). The own session
also keeps a signal aimed at the agent's process group (Ctrl-C on srun, a
``kill -- -PGID``) away from Ray: the agent decides how Ray stops.

Identity. PIDs wrap (``pid_max`` is 32768 here), so a process counts as a
member only if ``getsid(pid)`` is our session AND it was created no earlier
than the ``ray start`` process. While any member is alive the kernel keeps the
session id allocated, so no other process can take that number as its
session; once the session was seen empty it is sealed and never scanned
again, so a later, unrelated session that reuses the number is never
mistaken for ours; so is a session whose leader's pid now shows another
create time (an agent that re-attached after a restart). Signals go through ``psutil.Process`` objects, which
check the create time again right before sending.

This module never imports Ray: the agent's own process stays small.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from .port_window import random_port_window
from .ray_args import RayStartCommand

# psutil's create_time comes from the boot time plus clock ticks (1/100 s);
# allow for that rounding when comparing children with the parent.
_CTIME_SLACK = 0.05
# Variables of the agent's own environment that would change what `ray start`
# does behind the explicit command line.
_SCRUB_ENV = ("RAY_ADDRESS",)

RAYLET = "raylet"
GCS_SERVER = "gcs_server"
STARTED_MARKER = b"Ray runtime started."
# What the raylet writes to raylet.out (Ray 2.5x-2.60): the node id it chose,
# early ("main.cc:NNN: Setting node ID node_id=<56 hex>"), and, in the
# callback of its registration with the GCS, that it started
# ("node_manager.cc:NNN: Raylet of id, <56 hex> started."). Measured: the
# second line comes 0-2 ms after the GCS logged "Registering new node".
_RAYLET_NODE_ID = re.compile(rb"Setting node ID node_id=([0-9a-f]{56})\b")
_RAYLET_REGISTERED = re.compile(rb"Raylet of id, ([0-9a-f]{56}) started")
_RAYLET_LOG_HEAD = 256 * 1024
#: How long each non-raylet step of :meth:`RayNode.stop` waits after SIGTERM
#: before SIGKILL. Measured: helpers 0.6-0.7 s, GCS 0.02 s (or hung > 4 s on
#: a metrics flush), ``ray start`` 0.2-0.3 s once its children are gone.
HELPER_TERM_WAIT = 1.0


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The host's ephemeral port range; Linux's default when it cannot be read."""
    try:
        low, high = (int(v) for v in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "", *, tries: int = 64) -> int:
    """A TCP port that is free right now, outside the kernel's ephemeral range.

    The ``random`` strategy's ``free_port``: a random port of
    :func:`.port_window.random_port_window` that binds now (then closed), or
    the kernel's pick (``bind(0)``) when the host has no such window or
    ``tries`` draws all found taken ports. There is still a window between
    this call and Ray binding the port (another node's agent drawing the
    same one), so a start that fails on a taken port is retried by the
    supervisor with fresh ports.
    """
    window = random_port_window(ephemeral_range())
    if window is not None:
        for _ in range(tries):
            port = random.randint(*window)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


@dataclass
class StopReport:
    """What :meth:`RayNode.stop` did: how long it took, and what needed SIGKILL."""

    seconds: float
    killed: tuple[str, ...]
    exit_code: int | None
    phases: dict[str, float] = field(default_factory=dict)
    #: For each process that outlived its SIGTERM: its state and what it did with SIGTERM
    #: (``sleep[12] state=S sigterm=blocked``), read from /proc just before the SIGKILL.
    why_killed: tuple[str, ...] = ()


def sigterm_state(pid: int) -> str:
    """``state=<S> sigterm=<default|blocked|ignored|caught>`` of a process, from /proc ("" once it is gone)."""
    try:
        lines = open(f"/proc/{pid}/status", encoding="ascii", errors="replace").read().splitlines()
    except OSError:
        return ""
    fields = {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}
    bit = 1 << (signal.SIGTERM - 1)

    def has(key: str) -> bool:
        try:
            return bool(int(fields.get(key, "0"), 16) & bit)
        except ValueError:
            return False

    how = "blocked" if has("SigBlk") else "ignored" if has("SigIgn") else "caught" if has("SigCgt") else "default"
    return f"state={fields.get('State', '?').split()[0]} sigterm={how}"


class RayNode:
    """One local Ray node (a ``ray start --block`` process and its session)."""

    def __init__(self, pid: int, create_time: float, *, popen: subprocess.Popen | None = None,
                 log_path: str | None = None, command: RayStartCommand | None = None):
        self.pid = pid
        self.sid = pid            # the session leader's pid is the session id
        self.create_time = create_time
        self.log_path = log_path
        self.command = command
        self._popen = popen
        self._sealed = False
        self._exit_code: int | None = None
        self._log_offset = 0

    # ------------------------------------------------------------ starting

    @classmethod
    def start(cls, cmd: RayStartCommand, log_path: str | os.PathLike[str], *,
              base_env: Mapping[str, str] | None = None) -> "RayNode":
        """Start ``cmd`` in a new session; stdout and stderr go to ``log_path``.

        The process inherits ``base_env`` (default: the agent's environment)
        with ``cmd.env`` on top.
        """
        env = dict(os.environ if base_env is None else base_env)
        for key in (*_SCRUB_ENV, *cmd.unset_env):
            env.pop(key, None)
        env.update(cmd.env)
        Path(cmd.temp_dir).mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab", buffering=0)
        log_offset = log.tell()
        before = time.time()
        try:
            popen = subprocess.Popen(cmd.argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
        finally:
            log.close()
        try:
            create_time = psutil.Process(popen.pid).create_time()
        except psutil.NoSuchProcess:      # exited already; still a zombie we own, but be safe
            create_time = before
        node = cls(popen.pid, create_time, popen=popen, log_path=str(log_path), command=cmd)
        node._log_offset = log_offset
        return node

    @classmethod
    def attach(cls, pid: int, create_time: float) -> "RayNode":
        """A node started earlier (by a previous agent process), known by pid + create time.

        Used to clean up after an agent restart. If the ``ray start`` process
        is gone its members can still be found as long as one lives.
        """
        return cls(pid, create_time)

    # ------------------------------------------------------------ watching

    def members(self) -> list[psutil.Process]:
        """Live (non-zombie) processes of this node's session, ``ray start`` included."""
        if self._sealed:
            return []
        try:
            leader_ctime = psutil.Process(self.sid).create_time()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            leader_ctime = None
        except psutil.AccessDenied:     # pragma: no cover - not for our own processes
            leader_ctime = self.create_time
        if leader_ctime is not None and abs(leader_ctime - self.create_time) > _CTIME_SLACK:
            # Our pid number now belongs to another process: every member of
            # ours is gone (the kernel does not reuse a live session's id).
            self._sealed = True
            return []
        found = []
        for pid in psutil.pids():
            try:
                if os.getsid(pid) != self.sid:
                    continue
                proc = psutil.Process(pid)
                if proc.create_time() + _CTIME_SLACK < self.create_time:
                    continue
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
            except (ProcessLookupError, PermissionError, psutil.NoSuchProcess, psutil.AccessDenied,
                    psutil.ZombieProcess):
                continue
            found.append(proc)
        if not found and self.poll_exit() is not None:
            self._sealed = True
        elif not found and self._popen is None and not psutil.pid_exists(self.pid):
            self._sealed = True
        return found

    def _by_name(self, name: str) -> psutil.Process | None:
        for proc in self.members():
            if _name(proc) == name:
                return proc
        return None

    def raylet_pid(self) -> int | None:
        proc = self._by_name(RAYLET)
        return proc.pid if proc else None

    def gcs_pid(self) -> int | None:
        proc = self._by_name(GCS_SERVER)
        return proc.pid if proc else None

    def raylet_alive(self) -> bool:
        return self.raylet_pid() is not None

    def launcher_alive(self) -> bool:
        """Is the ``ray start --block`` process itself still running?

        After a drain the raylet exits 0 and ``ray start`` keeps running (0 is
        an "expected" exit to it), so this alone does not mean the node lives.
        """
        if self._popen is not None:
            return self.poll_exit() is None
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.create_time) <= _CTIME_SLACK \
                and proc.status() != psutil.STATUS_ZOMBIE
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return False

    def poll_exit(self) -> int | None:
        """Exit code of ``ray start`` (negative: killed by that signal), or None while it runs."""
        if self._popen is None:
            return self._exit_code
        code = self._popen.poll()
        if code is not None:
            self._exit_code = code
        return code

    def session_dir(self) -> Path | None:
        """``<temp_dir>/session_latest`` resolved, once Ray created it."""
        if self.command is None:
            return None
        link = Path(self.command.temp_dir) / "session_latest"
        try:
            return link.resolve(strict=True)
        except OSError:
            return None

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The end of the ``ray start`` output (for error reports)."""
        if not self.log_path:
            return ""
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                size = fh.tell()
                fh.seek(max(0, size - max_bytes))
                return fh.read().decode(errors="replace")
        except OSError:
            return ""

    def startup_finished(self) -> bool:
        """Has ``ray start`` printed "Ray runtime started." (in this run's part of the log)?

        The GCS lists a node ALIVE as soon as its raylet registers, which can
        be seconds before ``ray start`` finishes its own start-up; only after
        this line does ``ray start`` sit in its ``--block`` loop, where it
        watches its children and handles SIGTERM.
        """
        if not self.log_path:
            return False
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self._log_offset)
                return STARTED_MARKER in fh.read()
        except OSError:
            return False

    def _raylet_log(self) -> bytes:
        session = self.session_dir()
        if session is None:
            return b""
        try:
            with open(session / "logs" / "raylet.out", "rb") as fh:
                return fh.read(_RAYLET_LOG_HEAD)
        except OSError:
            return b""

    def registered_node_id(self) -> str | None:
        """The node id under which this node's raylet registered with the GCS
        (it says so in ``raylet.out``), or None before that.

        That is the moment the GCS lists the node ALIVE, learned without a
        GCS round trip (a probe process costs about a second of CPU). The
        temp dir is this node's own and never reused, so the file cannot be
        an earlier incarnation's. ``ray start`` may still be in its start-up
        then (see :meth:`startup_finished`); :meth:`stop` copes with that.
        """
        match = _RAYLET_REGISTERED.search(self._raylet_log())
        return match.group(1).decode() if match else None

    def logged_node_id(self) -> str | None:
        """The node id this node's raylet chose (logged before it registers), or None.

        Together with :meth:`startup_finished` it also tells that the node
        joined: ``ray start`` prints its start-up line only after the GCS
        listed the node under that id.
        """
        match = _RAYLET_NODE_ID.search(self._raylet_log())
        return match.group(1).decode() if match else None

    def wait_raylet(self, timeout: float, poll: float = 0.1) -> int | None:
        """Wait until this node's raylet runs; None if ``ray start`` ended or time ran out.

        A running raylet is not yet an ALIVE node: the GCS is the judge of
        that (``gcs.own_node_id``).
        """
        deadline = time.monotonic() + timeout
        while True:
            pid = self.raylet_pid()
            if pid is not None:
                return pid
            if not self.launcher_alive() or time.monotonic() >= deadline:
                return None
            time.sleep(poll)

    # ------------------------------------------------------------ stopping

    def _signal(self, procs: list[psutil.Process], sig: int) -> None:
        for proc in procs:
            try:
                proc.send_signal(sig)     # psutil re-checks pid + create time first
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass

    def _wait_gone(self, procs: list[psutil.Process], deadline: float) -> list[psutil.Process]:
        """Wait until ``procs`` exit or ``deadline``; reap ``ray start`` meanwhile."""
        while True:
            self.poll_exit()          # reaps our child so it does not linger as a zombie
            alive = []
            for proc in procs:
                try:
                    if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                        alive.append(proc)
                except (psutil.NoSuchProcess, psutil.ZombieProcess):
                    pass
            if not alive or time.monotonic() >= deadline:
                return alive
            time.sleep(0.02)

    def stop(self, grace: float = 5.0) -> StopReport:
        """Stop the node in Ray's own order, scoped to this session.

        Each step sends SIGTERM, waits a bounded time and SIGKILLs what of
        that step is left before the next step starts, so the order holds
        even when a process ignores SIGTERM:

        1. The raylet: it unregisters from the GCS (the node is DEAD at once,
           "expected termination", and a drained node's tasks are retried
           without counting against their retries); its workers die with it.
           It gets the largest share of ``grace``.
        2. Every other member except the GCS and ``ray start``: the log
           monitor, the agents, the head's dashboard, monitor and client
           server (up to :data:`HELPER_TERM_WAIT`).
        3. The GCS, so the others could still report to it. It gets
           :data:`HELPER_TERM_WAIT` too: on SIGTERM it flushes metrics to the
           metrics agent, which step 2 already stopped, and was measured to
           hang on that for over 4 s. It holds nothing worth waiting for (no
           external Redis; with one, every write is already stored).
        4. ``ray start`` last, because its children share its fate (Ray sets
           a parent-death SIGKILL on them), so ending it early would kill the
           GCS out of order. It may need SIGKILL: while it is still starting
           up (the GCS may already list the node ALIVE) its main thread sits
           in a C++ retry loop and does not run its SIGTERM handler for up to
           30 s; after the GCS is gone, its exit handlers can wait on it.
           With its children gone it has nothing left to clean up.

        Sending SIGTERM to all at once was measured to leave the raylet and
        the GCS running for 8-60 s. A node whose raylet already exited
        (drained: ``ray start`` and its log monitor stay behind) simply skips
        step 1. Anything found after the four steps (a process spawned in
        between) is SIGKILLed too.
        """
        started = time.monotonic()
        deadline = started + max(grace, 0.0)
        members = self.members()
        launcher = [p for p in members if p.pid == self.pid]
        raylets = [p for p in members if _name(p) == RAYLET and p.pid != self.pid]
        gcs = [p for p in members if _name(p) == GCS_SERVER and p.pid != self.pid]
        others = [p for p in members if p not in launcher and p not in raylets and p not in gcs]
        phases = [("raylet", raylets), ("others", others), ("gcs_server", gcs), ("ray start", launcher)]
        timings: dict[str, float] = {}
        forced: list[str] = []
        why: list[str] = []
        for index, (label, group) in enumerate(phases):
            if not group:
                continue
            phase_start = time.monotonic()
            self._signal(group, signal.SIGTERM)
            remaining = max(deadline - time.monotonic(), 0.0)
            later = len(phases) - index - 1
            if label == "raylet":
                # All but what the later steps may need, and at least half.
                wait = max(remaining - later * HELPER_TERM_WAIT, remaining / 2)
            else:
                wait = min(HELPER_TERM_WAIT, remaining / (later + 1))
            left = self._wait_gone(group, time.monotonic() + wait)
            if left:
                forced.extend(f"{_name(p) or label}[{p.pid}]" for p in left)
                why.extend(f"{_name(p) or label}[{p.pid}] {sigterm_state(p.pid)}" for p in left)
                self._signal(left, signal.SIGKILL)
                self._wait_gone(left, time.monotonic() + 2.0)
            timings[label] = time.monotonic() - phase_start
        killed = tuple(forced) + self._kill_until_empty(time.monotonic())
        return StopReport(seconds=time.monotonic() - started, killed=killed, exit_code=self.poll_exit(),
                          phases=timings, why_killed=tuple(why))

    def kill(self) -> StopReport:
        """SIGKILL the whole node at once: for a node whose head is gone (a drain
        or an orderly stop would only wait on a dead GCS)."""
        started = time.monotonic()
        killed = self._kill_until_empty(started)
        return StopReport(seconds=time.monotonic() - started, killed=killed, exit_code=self.poll_exit())

    def _kill_until_empty(self, after: float, rounds: int = 50) -> tuple[str, ...]:
        """Wait until ``after`` for members to end; then SIGKILL survivors until none is left.

        Several rounds, because a member may spawn a process between the scan
        and the signal (a raylet starting a worker).
        """
        killed: list[str] = []
        for _ in range(rounds):
            members = self.members()
            if not members:
                break
            if time.monotonic() < after:
                members = self._wait_gone(members, after)
                if not members:
                    continue
            killed.extend(f"{_name(p) or '?'}[{p.pid}]" for p in members)
            self._signal(members, signal.SIGKILL)
            self._wait_gone(members, time.monotonic() + 2.0)
        else:
            raise RuntimeError(f"session {self.sid} still has processes after {rounds} SIGKILL rounds")
        self._reap()
        return tuple(killed)

    def _reap(self) -> None:
        if self._popen is not None:
            try:
                self._exit_code = self._popen.wait(timeout=5)
            except subprocess.TimeoutExpired:   # pragma: no cover - not after an empty session
                pass

    def __repr__(self) -> str:
        return f"RayNode(pid={self.pid}, sid={self.sid}, exit={self.poll_exit()})"
