"""The agent for real: real `ray start`, real agents, on the local scheduler.

These are component tests: everything above the Scheduler is the code that
runs on Slurm; the local scheduler stands in for the cluster so they run
anywhere. The same scenarios against real Slurm live in integration/.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.coordinator.session import Session
from elastic_ray.launcher import RayLauncher

from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

DRIVER = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps({"total": ray.cluster_resources(),
                  "nodes": [{k: n[k] for k in ("NodeID", "Alive", "Resources", "NodeManagerAddress")}
                            for n in ray.nodes() if n["Alive"]]}))
"""


def driver(address: str, code: str = DRIVER, timeout: float = 90) -> dict:
    env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def session_factory(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    made: list[Session] = []

    def make(**kwargs) -> Session:
        kwargs.setdefault("head", SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"))
        kwargs.setdefault("launcher", RayLauncher(object_store_memory=100_000_000))
        session = Session.create(tmp_path / f"s{len(made)}", scheduler="local", **kwargs)
        made.append(session)
        return session

    yield make
    for session in made:
        session.teardown()
        # The local scheduler's supervisors stop the agents, which stop Ray.
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")


def test_cpu_head_and_a_gpu_worker_allocation(session_factory):
    session = session_factory()
    address = session.wait_for_head(timeout=90)
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, gpus_per_node=2, cpus_per_task=2, mem="2G", time_limit="30",
        ray_resources={"accelerator:a40": 1}))
    nodes = session.wait_for_worker_allocation(worker, timeout=90)
    assert list(nodes) == ["gpua-1"]
    seen = driver(address)
    total = seen["total"]
    # The head advertises nothing; the worker has what Slurm granted.
    assert total["CPU"] == 2 and total["GPU"] == 2
    assert total["dagster_slurm_worker"] == 1 and total["accelerator:a40"] == 1
    head_nodes = [n for n in seen["nodes"] if not n["Resources"].get("CPU")]
    assert len(head_nodes) == 1 and "GPU" not in head_nodes[0]["Resources"]
    assert nodes["gpua-1"] in {n["NodeID"] for n in seen["nodes"]}
    state = session.remove_worker_allocation(worker, drain_timeout=30)
    assert state == "COMPLETED"
