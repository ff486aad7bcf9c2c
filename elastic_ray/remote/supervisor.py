"""The cluster-side supervisor of a session driven over SSH.

A client outside the cluster goes away: a laptop closes, a Dagster run
process is restarted. The head watch must not go with it, so in the SSH mode
it runs here, in one detached process per session on the host the client
logs in to (``python -m elastic_ray.remote.supervisor DIR``): a
``Session.open(DIR, supervise=True)``, the same watch and election a local
caller gets. It is started by the first call that creates or opens the
session and outlives every SSH connection (its own process session, no
terminal, output to ``logs/remote-supervisor.log``).

One per session: it holds ``remote/supervisor.lock`` for its whole life, so
a second start exits at once. It ends when ``teardown`` leaves
``remote/stop`` (and sends SIGTERM to the PID it recorded), or by itself once
every job of the session has ended for :data:`IDLE_CHECKS` checks in a row,
so a run abandoned without a teardown leaves no daemon behind.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from filelock import FileLock, Timeout

from ..atomic import atomic_write_text
from ..polling import wait_for

log = logging.getLogger(__name__)

CHECK_INTERVAL = 5.0  # s between looks at the stop marker
IDLE_INTERVAL = 60.0  # s between looks at the jobs (the shared scheduler answer, no extra query)
IDLE_CHECKS = 3
STOP_WAIT = 60.0  # s a teardown waits for the supervisor to let go


def remote_dir(session: str | Path) -> Path:
    return Path(session) / "remote"


def running_pid(session: str | Path) -> int | None:
    """The supervisor's PID if one holds the lock, else None."""
    lock = FileLock(str(remote_dir(session) / "supervisor.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        try:
            return int((remote_dir(session) / "supervisor.pid").read_text().strip())
        except (OSError, ValueError):
            return -1  # held, PID not written yet
    lock.release()
    return None


def ensure_supervisor(session: str | Path, interval: float = 30.0) -> int:
    """Start the session's supervisor unless one runs; returns its PID."""
    session = Path(session)
    remote_dir(session).mkdir(mode=0o700, exist_ok=True)
    pid = running_pid(session)
    if pid is not None:
        return pid
    try:
        (remote_dir(session) / "stop").unlink()
    except FileNotFoundError:
        pass
    logs = session / "logs"
    logs.mkdir(mode=0o700, exist_ok=True)
    with open(logs / "remote-supervisor.log", "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "elastic_ray.remote.supervisor", str(session), str(interval)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                close_fds=True)
    log.info("event=remote_supervisor_started session=%s pid=%s", session, proc.pid)
    return proc.pid


def stop_supervisor(session: str | Path, wait: float = STOP_WAIT) -> int | None:
    """Leave the stop marker, signal the recorded supervisor and wait up to
    ``wait`` s for it to let go of the session; returns its PID.

    A teardown calls this first: a supervisor still watching would take the
    cancelled head for a lost one and elect (submit) a new head behind it.
    """
    remote_dir(session).mkdir(mode=0o700, exist_ok=True)
    atomic_write_text(remote_dir(session) / "stop", f"{time.time()}\n")
    pid = running_pid(session)
    if pid is not None and pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    if pid is not None:
        gone = wait_for(lambda: running_pid(session) is None, timeout=wait, interval=0.2, raising=False)
        if not gone:
            log.warning("event=remote_supervisor_slow_to_stop session=%s pid=%s", session, pid)
    return pid


def _all_ended(session) -> bool:
    rec = session.record()
    jobs = session.query(max_age=IDLE_INTERVAL)
    ids = rec.recorded_jobs()
    return bool(ids) and all(jobs.get(j) is None or jobs[j].state.is_final for j in ids)


def serve(path: Path, interval: float) -> int:
    from ..coordinator.session import Session

    lock = FileLock(str(remote_dir(path) / "supervisor.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return 0  # another supervisor has this session
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    atomic_write_text(remote_dir(path) / "supervisor.pid", f"{os.getpid()}\n")
    session = Session.open(path, supervise=True, supervise_interval=interval)
    log.info("event=remote_supervisor_up session=%s pid=%s", session.job_name, os.getpid())
    idle, next_idle_check = 0, time.monotonic() + IDLE_INTERVAL
    try:
        while not stop.wait(CHECK_INTERVAL):
            if (remote_dir(path) / "stop").exists():
                break
            if time.monotonic() >= next_idle_check:
                next_idle_check = time.monotonic() + IDLE_INTERVAL
                try:
                    idle = idle + 1 if _all_ended(session) else 0
                except Exception as exc:  # noqa: BLE001 - a look only; the watch goes on
                    log.warning("event=remote_supervisor_look_failed session=%s error=%s", session.job_name, exc)
                if idle >= IDLE_CHECKS:
                    log.info("event=remote_supervisor_idle session=%s", session.job_name)
                    break
    finally:
        session.close()
        try:
            (remote_dir(path) / "supervisor.pid").unlink()
        except FileNotFoundError:
            pass
        lock.release()
        log.info("event=remote_supervisor_down session=%s", session.job_name)
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return serve(Path(argv[0]), float(argv[1]) if len(argv) > 1 else 30.0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
