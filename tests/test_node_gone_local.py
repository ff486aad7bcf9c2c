"""A worker allocation that fails hard is DEAD in Ray as soon as the session sees it (issue 10).

Real agents, real Ray, the local scheduler. The worker's agent and raylet are
SIGKILLed together, so nothing unregisters the node; the GCS's own detector
is set slow on purpose here (about a minute), so only the session's report
(``coordinator.allocations.lost_nodes`` -> ``mark_dead`` -> the head agent's GCS probe)
can make the node DEAD within seconds. Both head layouts answer: a separate
head agent, and the first allocation hosting the head. The figures are
printed (run with ``-s``); no assert depends on them being small.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.agent.node import gcs
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.scheduler.base import JobState
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(400)]

HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G")
RUN = SlurmRunAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=1, mem="2G", time_limit="30")
WORKER = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=1, mem="2G", time_limit="30")


@pytest.fixture
def slow_detector(monkeypatch):
    """Agents as in the other component tests, and a GCS that would take ~60 s to notice by itself."""
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_HEALTH_CHECK_PERIOD_MS", "3000")
    monkeypatch.setenv("ELASTIC_AGENT_HEALTH_CHECK_FAILURE_THRESHOLD", "20")


def _kill_verified(pid: int | None, create_time: float | None = None) -> None:
    """SIGKILL one process we know by PID (and, for the agent, its start time)."""
    assert pid is not None
    proc = psutil.Process(pid)
    if create_time is not None:
        assert abs(proc.create_time() - create_time) < 1.0, "the PID was reused"
    os.kill(pid, signal.SIGKILL)


def _node(address: str, env: dict[str, str], node_id: str) -> gcs.NodeRecord | None:
    return next((n for n in gcs.list_nodes(address, timeout=15, env=env) if n.node_id == node_id), None)


def _lose_a_worker_and_watch_it_die(session: Session, address: str) -> None:
    worker = session.add_worker_allocation(WORKER)
    joined = session.wait_for_worker_allocation(worker, timeout=120)
    (node, node_id), = joined.items()
    env = session.ray_client_env()
    assert _node(address, env, node_id).state == "ALIVE"
    state = session.node_states(worker.job_id)[node]

    # Nothing may unregister: the agent is stopped first (it would restart a raylet that ended),
    # then the raylet is killed, then the agent. Killing the agent first raced on loaded cores: its
    # exit ended the job, and the scheduler killed the raylet before the test could (CI streak run 5).
    t_kill = time.monotonic()
    agent = psutil.Process(state.pid)
    assert abs(agent.create_time() - state.pid_create_time) < 1.0, "the PID was reused"
    os.kill(state.pid, signal.SIGSTOP)
    try:
        _kill_verified(state.raylet_pid)
    finally:
        os.kill(state.pid, signal.SIGKILL)

    # The session's path: a scheduler query shows the allocation ended.
    ended = wait_until(lambda: (lambda i: i if i is not None and i.state is not JobState.RUNNING else None)(
        session.query().get(worker.job_id)), timeout=60, message="the killed allocation did not end")
    t_seen = time.monotonic()
    report = wait_until(lambda: next((r for r in session.lost_nodes.reports if r["job"] == worker.job_id), None),
                        timeout=40, message="the session sent no mark_dead report")
    t_reported = time.monotonic()
    assert report["reply"].get("ok") is True, report
    assert report["node_ids"] == [node_id] and report["reply"]["marked"] == [node_id], report

    dead = wait_until(lambda: (lambda n: n if n is not None and n.state == "DEAD" else None)(
        _node(address, env, node_id)), timeout=20, message="the GCS still holds the node ALIVE")
    t_dead = time.monotonic()
    assert f"slurm job {worker.job_id} is {ended.state.value}" in (dead.death_message or ""), dead
    print(f"\nnode {node_id[:12]} of job {worker.job_id} ({ended.state.value}): job seen ended "
          f"{t_seen - t_kill:.2f} s after the kill; report answered {t_reported - t_seen:.2f} s later "
          f"(head agent probe {report['seconds']:.2f} s); GCS lists it DEAD {t_dead - t_kill:.2f} s after the kill "
          f"(the slowed detector alone: ~60 s)")

    # Once: another query sends nothing more about this node.
    session.query()
    time.sleep(1.0)
    assert sum(1 for r in session.lost_nodes.reports if r["job"] == worker.job_id) == 1


def _teardown(session: Session) -> None:
    session.teardown()
    wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
               message="session jobs did not end after teardown")


def test_a_killed_worker_is_dead_in_ray_right_after_the_session_sees_it(tmp_path, slow_detector):
    session = Session.create(tmp_path / "s", head=HEAD, scheduler="local", ray_head_only=True,
                             launcher=RayLauncher(object_store_memory=100_000_000), supervise=False)
    try:
        address = session.wait_for_head(timeout=120)
        _lose_a_worker_and_watch_it_die(session, address)
    finally:
        _teardown(session)


def test_a_hosted_head_marks_a_killed_worker_dead_too(tmp_path, slow_detector):
    session = Session.create(tmp_path / "s", head=RUN, scheduler="local", ray_head_only=False,
                             launcher=RayLauncher(object_store_memory=100_000_000), supervise=False)
    try:
        address = session.wait_for_head(timeout=120)
        assert session.record().workers[session.record().head_job].hosts_run_head
        _lose_a_worker_and_watch_it_die(session, address)
    finally:
        _teardown(session)
