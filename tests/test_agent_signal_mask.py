"""An agent started with SIGTERM blocked and ignored (both pass through fork and exec) still drains on it,
and its `ray start` (the stand-in: no Ray) stops on its own SIGTERM, with no SIGKILL."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir
from tests.helpers import wait_until

STANDIN = Path(__file__).resolve().parent.parent / "bench" / "standin"
# The parent a careless launcher could be: SIGTERM blocked and ignored, then exec the agent.
HOSTILE_PARENT = (
    "import os, signal, sys\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "os.execv(sys.executable, [sys.executable, '-m', 'elastic_ray.agent', *sys.argv[1:]])\n")


@pytest.mark.timeout(120)
def test_an_agent_started_with_sigterm_blocked_and_ignored_still_drains_on_it(tmp_path):
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name=f"er-mask-{uuid.uuid4().hex[:6]}", created_at=time.time(),
                       head={"partition": "cpu", "time_limit": "10"},
                       scheduler={"kind": "local", "state_dir": str(tmp_path / "local-scheduler")},
                       launcher=RayLauncher().to_dict())
    session = SessionDir.create(tmp_path / "session", info)
    env = dict(os.environ, ELASTIC_RAY_RAY_EXECUTABLE=str(STANDIN / "ray"),
               ELASTIC_RAY_GCS_PROBE=f"{sys.executable} {STANDIN / 'gcs_probe.py'}",
               ELASTIC_AGENT_RUNTIME_DIR=str(tmp_path / "runtime"), ELASTIC_AGENT_SLURMD_CHECK="0")
    proc = subprocess.Popen([sys.executable, "-c", HOSTILE_PARENT, "run", "--session", str(session.path),
                             "--job", "5", "--role", "head", "--node", "n-1", "--node-ip", "127.0.0.2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    spawned: list[psutil.Process] = []
    try:
        wait_until(lambda: session.read_head_endpoint("5"), 60, 0.2, "the head's endpoint")
        spawned = psutil.Process(proc.pid).children(recursive=True)    # its `ray start` (a session of its own)
        status = Path(f"/proc/{proc.pid}/status").read_text()
        blocked = int(re.search(r"^SigBlk:\s*([0-9a-f]+)", status, re.M).group(1), 16)
        assert not blocked & (1 << (signal.SIGTERM - 1)), "the agent took SIGTERM back"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert time.monotonic() - started < 30
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        for child in spawned:             # by PID, whatever happened above
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
    log = (session.log_dir / "agent-5-n-1.log").read_text()
    stopped = [line for line in log.splitlines() if "event=ray_stopped" in line]
    assert stopped and all("killed=-" in line for line in stopped), stopped   # SIGTERM alone stopped `ray start`
    assert not [p for p in psutil.process_iter(["pid"]) if _in_session(p, proc.pid)]


def _in_session(proc: psutil.Process, sid: int) -> bool:
    try:
        return os.getsid(proc.pid) == sid
    except OSError:
        return False
