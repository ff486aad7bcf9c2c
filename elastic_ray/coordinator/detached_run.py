"""The loop of a session's detached supervisor process (see :mod:`.detached`).

``python -m elastic_ray.coordinator.detached_run DIR INTERVAL ABANDON_AFTER``,
started by :func:`.detached.ensure_supervisor`. Apart from :mod:`.detached`
so that every teardown can stop the process without importing the session
(which imports the teardown).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from filelock import FileLock, Timeout

from .. import defaults, knobs
from ..atomic import atomic_write_text
from ..protocol.disk import paths
from .detached import ABANDON_AFTER, CHECK_INTERVAL, IDLE_INTERVAL, last_call_time, why_end

log = logging.getLogger("elastic_ray.coordinator.detached")


def _all_ended(session) -> bool:
    rec = session.record()
    jobs = session.query(max_age=IDLE_INTERVAL)
    ids = rec.recorded_jobs
    return bool(ids) and all(jobs.get(j) is None or jobs[j].state.is_final for j in ids)


def serve(path: Path, interval: float, abandon_after: float = ABANDON_AFTER) -> int:
    from .session import Session

    lock = FileLock(str(paths.supervisor_lock_file(path)))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return 0  # another supervisor has this session
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    atomic_write_text(paths.supervisor_pid_file(path), f"{os.getpid()} {socket.gethostname()}\n")
    session = Session.open(path, supervise=True, supervise_interval=interval)
    log.info("event=detached_supervisor_up session=%s pid=%s", session.job_name, os.getpid())
    idle_interval = knobs.DETACHED_IDLE_INTERVAL.value()   # default: IDLE_INTERVAL
    started, idle, next_idle_check, why = time.time(), 0, time.monotonic() + idle_interval, None
    try:
        while why is None and not stop.wait(min(CHECK_INTERVAL, idle_interval)):
            if paths.stop_marker(path).exists():
                break
            if time.monotonic() < next_idle_check:
                continue
            next_idle_check = time.monotonic() + idle_interval
            try:
                idle = idle + 1 if _all_ended(session) else 0
            except Exception as exc:  # noqa: BLE001 - a look only; the watch goes on
                log.warning("event=detached_supervisor_look_failed session=%s error=%s", session.job_name, exc)
            why = why_end(time.time(), last_call_time(path, started), abandon_after, idle)
    finally:
        session.close()
        paths.supervisor_pid_file(path).unlink(missing_ok=True)
        lock.release()
        log.info("event=detached_supervisor_down session=%s why=%s", session.job_name, why or "stopped")
    return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return serve(Path(argv[0]), float(argv[1]) if len(argv) > 1 else defaults.SUPERVISE_INTERVAL,
                 float(argv[2]) if len(argv) > 2 else ABANDON_AFTER)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
