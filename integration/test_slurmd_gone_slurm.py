"""Issue 10 on the real lab: slurmd is killed on a worker node; Slurm sets the
node DOWN and requeues the job; the agent there must notice that its job no
longer runs on that node and leave (LEFT, with Slurm's state in the reason,
its Ray node stopped), instead of serving work for a PENDING job until the
returning slurmd SIGKILLs it.

The agents look at their slurmd every 5 s here (``ELASTIC_AGENT_SLURMD_CHECK``);
the lab's SlurmdTimeout is 20 s, so the node goes DOWN 35-40 s after the
kill and the agent asks the scheduler from 20 s after it noticed.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import psutil
import pytest

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from integration import labctl
from integration.slurm_helpers import end_session
from tests.helpers import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(420)]

VICTIM = "gpub-1"   # the gpu-b partition's only node; the head runs on cpu


def log(message: str) -> None:
    print(f"[slurmd-gone {time.strftime('%H:%M:%S')}] {message}", flush=True)


@pytest.mark.slow
def test_agent_leaves_when_slurmd_dies_and_the_job_is_requeued(slurm_lab, monkeypatch):
    """Full tier (the fault matrix's node family: ``worker-slurmd-kill`` is
    full tier too). On every change the family's ``worker-network-cut``
    scenario takes a worker node away on the lab."""
    monkeypatch.setenv("ELASTIC_AGENT_SLURMD_CHECK", "5")
    work = slurm_lab.shared_dir(f"slurmd-gone/{uuid.uuid4().hex[:8]}")
    session = Session.create(work / "session", scheduler="slurm",
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="15", mem="2G"),
                             launcher=RayLauncher(object_store_memory=100_000_000), supervise=False)
    settings = labctl.settings_from_env()
    try:
        session.wait_for_head(timeout=120)
        worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-b", num_nodes=1, cpus_per_task=1, mem="1G", time_limit="15", gpus_per_node=0))
        job = worker.job_id

        def joined():
            state = next(iter(session.node_states(job).values()), None)
            return state if state is not None and state.state.value == "JOINED" else None

        before = wait_until(joined, 120, 0.5, f"worker {job} to join")
        assert before.node == VICTIM, before.node
        agent = psutil.Process(before.pid)
        raylet = before.raylet_pid
        slurmd = labctl.slurmd_pid(settings, VICTIM)
        assert slurmd is not None
        t_kill = time.time()
        os.kill(slurmd, signal.SIGKILL)
        log(f"killed slurmd {slurmd} on {VICTIM}; worker job {job} agent {agent.pid}")

        def requeued():
            info = session.scheduler.query(session.job_name, [job]).get(job)
            return info if info is not None and info.state.value == "PENDING" else None

        info = wait_until(requeued, 120, 2.0, f"Slurm to requeue job {job}")
        log(f"job {job} PENDING {time.time() - t_kill:.0f} s after the kill (reason {info.reason})")

        def left():
            state = next(iter(session.node_states(job).values()), None)
            return state if state is not None and state.state.value == "LEFT" else None

        after = wait_until(left, 120, 1.0, f"the agent of job {job} to leave")
        log(f"agent LEFT {after.since - t_kill:.0f} s after the kill: {after.reason}")
        assert f"job {job} is PENDING in Slurm" in after.reason
        wait_until(lambda: not agent.is_running() or agent.status() == psutil.STATUS_ZOMBIE, 60, 0.5,
                   "the agent process to exit")
        assert raylet is None or not psutil.pid_exists(raylet) or \
            psutil.Process(raylet).status() == psutil.STATUS_ZOMBIE
        agent_log = (session.path / "logs" / f"agent-{job}-{VICTIM}.log").read_text()
        assert "event=job_gone" in agent_log and "job_state=PENDING" in agent_log
    finally:
        labctl.up(len(labctl.nodes()))   # restarts the dead slurmd; ReturnToService=1 brings the node back
        end_session(session, timeout=120)
