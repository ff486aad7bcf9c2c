"""A session's detached supervisor: the head watch that outlives its callers.

A client outside the cluster goes away: a laptop closes, a Dagster run
process is restarted. The head watch must not go with it, so in the SSH mode
it runs on the cluster side, in one detached process per session on the
host the client logs in to (``python -m elastic_ray.coordinator.detached_run
DIR``, the loop is in :mod:`.detached_run`): a ``Session.open(DIR, supervise=True)``, the same watch and election
a local caller gets. The first SSH call that creates or opens the session
starts it; it outlives every SSH connection (its own process session, no
terminal, output to ``logs/detached-supervisor.log``).

One per session: it holds ``remote/supervisor.lock`` for its whole life, so
a second start exits at once. Its PID file says on which host it runs, so
a caller on another login host never signals a stranger's process.

It ends
* at a teardown: :func:`stop_supervisor` (called by every teardown, see
  ``SessionJobs.teardown``) leaves ``remote/stop`` and signals it, and waits,
  so that it cannot take the cancelled head for a lost one and elect behind
  the teardown's back;
* once every job of the session has ended for :data:`IDLE_CHECKS` checks in
  a row;
* once no client has called for ``abandon_after`` seconds (``remote/last_call``,
  touched by every SSH call): an abandoned run is not supervised, and so not
  resubmitted, forever; its jobs end at their walltime, as they do when a
  local caller's process ends.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock, Timeout

from .. import defaults
from ..atomic import atomic_write_text
from ..polling import wait_for
from ..protocol.disk import paths

log = logging.getLogger(__name__)

CHECK_INTERVAL = 5.0  # s between looks at the stop marker
IDLE_INTERVAL = defaults.DETACHED_IDLE_INTERVAL  # s between looks at the jobs (the shared answer, no extra query)
IDLE_CHECKS = 3
STOP_WAIT = 60.0  # s a teardown waits for the supervisor to let go
ABANDON_AFTER = defaults.ABANDON_AFTER  # s without any client call before supervision ends (default)


def remote_dir(session: str | Path) -> Path:
    return paths.remote_dir(Path(session))


def touch_last_call(session: str | Path) -> None:
    """Note that a client called (the abandonment clock starts again)."""
    if remote_dir(session).is_dir():
        atomic_write_text(paths.last_call_file(Path(session)), f"{time.time():.3f}\n", durable=False)


def last_call_time(session: Path, default: float) -> float:
    try:
        return float(paths.last_call_file(Path(session)).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def _pid_file(session: str | Path) -> tuple[int, str] | None:
    try:
        pid, host = paths.supervisor_pid_file(Path(session)).read_text().split()[:2]
        return int(pid), host
    except (OSError, ValueError):
        return None


def running_pid(session: str | Path) -> int | None:
    """The supervisor's PID if one holds the lock (-1 while its PID file is
    not written yet, or when it runs on another host), else None."""
    if not remote_dir(session).is_dir():
        return None
    lock = FileLock(str(paths.supervisor_lock_file(Path(session))))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        found = _pid_file(session)
        return found[0] if found is not None and found[1] == socket.gethostname() else -1
    lock.release()
    return None


def ensure_supervisor(session: str | Path, interval: float = defaults.SUPERVISE_INTERVAL,
                      abandon_after: float = ABANDON_AFTER) -> int:
    """Start the session's supervisor unless one runs; returns its PID (-1: runs elsewhere)."""
    session = Path(session)
    remote_dir(session).mkdir(mode=0o700, exist_ok=True)
    pid = running_pid(session)
    if pid is not None:
        return pid
    paths.stop_marker(session).unlink(missing_ok=True)
    log_file = paths.detached_log(session)
    log_file.parent.mkdir(mode=0o700, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "elastic_ray.coordinator.detached_run", str(session),
                                 str(interval), str(abandon_after)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                close_fds=True)
    log.info("event=detached_supervisor_started session=%s pid=%s", session, proc.pid)
    return proc.pid


def stop_supervisor(session: str | Path, wait: float = STOP_WAIT) -> int | None:
    """Leave the stop marker, signal the supervisor (on this host only) and
    wait up to ``wait`` s for it to let go of the session; returns its PID.
    Nothing to do (and no file written) for a session that never had one."""
    if not remote_dir(session).is_dir():
        return None
    atomic_write_text(paths.stop_marker(Path(session)), f"{time.time()}\n")
    pid = running_pid(session)
    if pid is not None and pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    if pid is not None:   # elsewhere (-1) it sees the marker within CHECK_INTERVAL
        gone = wait_for(lambda: running_pid(session) is None, timeout=wait, interval=0.2, raising=False)
        if not gone:
            log.warning("event=detached_supervisor_slow_to_stop session=%s pid=%s", session, pid)
    return pid


def why_end(now: float, last_call: float, abandon_after: float, idle_checks: int) -> str | None:
    """Pure: why supervision ends at this look, or None to go on.

    ``idle_checks`` is how many looks in a row saw every job ended.
    """
    if now - last_call > abandon_after:
        return "abandoned"
    if idle_checks >= IDLE_CHECKS:
        return "all_jobs_ended"
    return None
