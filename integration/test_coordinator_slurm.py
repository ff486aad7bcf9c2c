"""The coordinator on the real Slurm lab: real sbatch/squeue/scancel/srun,
real agents, real Ray.

Session directories live on the shared filesystem (the lab's nodes have
private /tmp). Every test tears its session down and waits until Slurm
lists none of its jobs as active.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from elastic_ray import (
    Session,
    SlurmAllocationEnded,
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
)
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk.records import AgentState
from integration.slurm_helpers import end_session
from tests.helpers import committed_units as committed, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G", cpus_per_task=1)


@pytest.fixture
def make_session(slurm_lab, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    base = REPO / ".lab" / "test-work" / "coordinator"
    base.mkdir(parents=True, exist_ok=True)
    made: list[Session] = []

    def make(**kwargs) -> Session:
        kwargs.setdefault("head", HEAD)
        kwargs.setdefault("launcher", RayLauncher(object_store_memory=100_000_000))
        kwargs.setdefault("supervise", False)
        session = Session.create(base / uuid.uuid4().hex[:8], scheduler="slurm", **kwargs)
        made.append(session)
        return session

    yield make
    for session in made:
        end_session(session)


def test_add_wait_and_remove_worker_allocations(make_session):
    session = make_session()
    session.wait_for_head(timeout=120)
    a40 = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, gpus_per_node=2, cpus_per_task=2, mem="1G", time_limit="20",
        ray_resources={"accelerator:a40": 1}))
    h100 = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-b", num_nodes=1, gpus_per_node=1, cpus_per_task=1, mem="1G", time_limit="20"))
    assert list(session.wait_for_worker_allocation(a40, timeout=180)) == ["gpua-1"]
    assert list(session.wait_for_worker_allocation(h100, timeout=180)) == ["gpub-1"]

    # A fresh process (a restarted supervisor) finds the live workers from the shared record.
    code = ("import sys, json; from elastic_ray import Session;"
            "s = Session.open(sys.argv[1], supervise=False);"
            "print(json.dumps([w.job_id for w in s.worker_allocations]))")
    out = subprocess.run([sys.executable, "-c", code, str(session.path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(out.stdout)) == sorted([a40.job_id, h100.job_id])

    # Pending: every GPU of gpu-a while a40 holds two of them. Removing cancels it.
    pending = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, gpus_per_node=4, cpus_per_task=1, mem="1G", time_limit="20"))
    wait_until(lambda: session.query([pending.job_id])[pending.job_id].state.value == "PENDING", timeout=30,
               message="the big allocation did not pend")
    assert session.remove_worker_allocation(pending, drain_timeout=30) == "CANCELLED"

    t0 = time.monotonic()
    assert session.remove_worker_allocation(h100, drain_timeout=60) == "COMPLETED"
    print(f"\nremove idle worker (drain, wait=True): {time.monotonic() - t0:.1f}s")

    state = session.remove_worker_allocation(a40, drain_timeout=60, wait=False)
    assert state == "RUNNING"
    wait_until(lambda: session.query([a40.job_id])[a40.job_id].state.value == "COMPLETED", timeout=90,
               message="the background drain did not complete")
    assert session.worker_allocations == []


# The payload shipped with the demo: it commits each unit to a file once Ray
# computed it, and a relaunch skips what was committed.
PAYLOAD = [sys.executable, "-m", "elastic_ray.demo.payload"]


@pytest.mark.slow
def test_failover_loop_on_slurm(make_session):
    """Full tier only. The seed's loop: run, head lost, SlurmAllocationEnded, replace_head, run again.
    On every change integration/test_dagster_slurm.py::test_head_cancelled_mid_asset_seed_loop runs
    the same loop on the lab word for word (its head cancelled mid-asset), and the fault matrix's
    per-change scenarios (elector-killed) start with a cancelled head too."""
    session = make_session()
    session.wait_for_head(timeout=120)
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="1G", time_limit="20"))
    session.wait_for_worker_allocation(worker, timeout=180)
    commits = session.path / "commits.txt"
    total = 30
    argv = PAYLOAD + [str(commits), str(total)]

    old_head = session.record().head_job
    run = session.run(argv)
    wait_until(lambda: len(committed(commits)) >= 5, timeout=120, message="the driver made no progress")
    subprocess.run(["scancel", old_head], check=True, timeout=30)
    t_lost = time.monotonic()
    with pytest.raises(SlurmAllocationEnded) as ended:
        run.wait(timeout=120)
    assert ended.value.allocation_state in ("CANCELLED", "COMPLETING", "REPLACED")

    head = session.replace_head(timeout=240)
    t_elected = time.monotonic()
    assert head.job_id == worker.job_id, "a running worker allocation is elected, not a queued new head"
    wait_until(lambda: any(s.state is AgentState.JOINED and s.head_job == head.job_id
                           for s in session.node_states(worker.job_id).values()),
               timeout=120, message="the worker did not rejoin the new head")
    t_rejoined = time.monotonic()
    print(f"\nSlurm: head cancelled -> replace_head returned {t_elected - t_lost:.1f}s, "
          f"-> all workers rejoined {t_rejoined - t_lost:.1f}s")

    # A launch against the old head is refused as REPLACED.
    from elastic_ray.coordinator.session import Head

    with pytest.raises(SlurmAllocationEnded) as replaced:
        session.run(argv, head=Head(old_head, "0.0.0.0:1"))
    assert replaced.value.allocation_state == "REPLACED"

    result = session.run(argv, head=head).wait(timeout=300)
    assert result.returncode == 0
    assert sorted(committed(commits)) == list(range(total)), "every unit committed exactly once"
    # The worker allocation kept its Slurm job (and node) throughout.
    assert session.query([worker.job_id])[worker.job_id].state.value == "RUNNING"
