"""A real head with its dashboard on publishes an address that answers.

Real agent, real Ray, on the local scheduler (nodes on 127.0.0.x, so the
published address is a loopback one). The session's teardown stops the
agents through the local scheduler (by PID), and each agent stops its own
Ray by its session's PIDs; the test waits until the jobs ended and the run's
temp dir is gone, also when an assertion failed.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import urllib.request

import pytest

from elastic_ray import SlurmRunAllocationConfig
from elastic_ray.agent.node.private_dirs import user_temp_root
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.scheduler.local import LocalScheduler
from elastic_ray.scheduler.local.cluster import LocalCluster
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

NO_SUPERVISOR = {"supervise": False} if "supervise" in inspect.signature(Session.create).parameters else {}
HTTP_TIMEOUT = 5.0


def _answers(address: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{address}/", timeout=HTTP_TIMEOUT) as reply:
            return reply.status
    except OSError:
        return None


def test_a_head_with_the_dashboard_on_publishes_an_address_that_answers(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    # KillWait 10 s as on the lab (Slurm's default is 30): on the emulation's 5 s, a head with the dashboard's
    # 20 processes, draining ENDING_GRACE (3 s) at the teardown, once had too little left to stop its Ray
    # under CI's load and was SIGKILLed with its temp dir (per-change red, 2026-12-02).
    scheduler = LocalScheduler(tmp_path / "local-scheduler", LocalCluster.default(kill_wait=10.0))
    session = Session.create(tmp_path / "s", scheduler=scheduler,
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"),
                             launcher=RayLauncher(object_store_memory=100_000_000, include_dashboard=True),
                             **NO_SUPERVISOR)
    try:
        session.wait_for_head(timeout=120)
        head_job = session.dir.read_ray_head()
        endpoint = session.dir.read_head_endpoint(head_job)
        assert endpoint is not None and endpoint.dashboard is not None
        host, _, port = endpoint.dashboard.rpartition(":")
        assert host == endpoint.address.rpartition(":")[0] and host.startswith("127.0.0.")
        assert int(port) == endpoint.ports["dashboard_port"]
        # head.json is written once the GCS answers; the dashboard's HTTP server may come a moment later.
        assert wait_until(lambda: _answers(endpoint.dashboard), 60, 0.5, "the dashboard to answer") == 200

        out = subprocess.run([sys.executable, "-m", "elastic_ray.cli", "session", "dashboard", str(session.path),
                              "--login", "login1", "--json"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["argv"] == ["ssh", "-N", "-L", f"8265:{host}:{port}", "login1"]
        assert doc["head_job"] == head_job
    finally:
        session.teardown()
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")
        temp = user_temp_root() / session.info.session_id[:8]
        wait_until(lambda: not temp.exists(), 30, 0.2, f"{temp} removed once the run's agents exited")
