"""The coordinator for real on the local scheduler: real agents, real Ray.

The same code runs against Slurm in integration/test_coordinator_slurm.py;
here the scheduler is the local emulation so the scenario runs anywhere.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from elastic_ray import SlurmAllocationEnded, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.coordinator.session import Session
from elastic_ray.launcher import RayLauncher
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

# Commits each unit of work to a file after Ray computed it; a relaunch skips
# committed units. A unit is committed by one append of one short line.
DRIVER = r'''
import os, sys, time, ray
path, total = sys.argv[1], int(sys.argv[2])
ray.init(logging_level="ERROR", log_to_driver=False)
done = set(open(path).read().split()) if os.path.exists(path) else set()

@ray.remote(num_cpus=1, max_retries=3)
def work(i):
    time.sleep(0.25)
    return i

for i in range(total):
    if str(i) in done:
        continue
    value = ray.get(work.remote(i))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{value}\n".encode())
    os.fsync(fd)
    os.close(fd)
print("driver finished", flush=True)
'''


@pytest.fixture
def session(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    s = Session.create(tmp_path / "session", scheduler="local",
                       head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"),
                       launcher=RayLauncher(object_store_memory=100_000_000))
    yield s
    s.teardown()
    wait_until(lambda: all(i.state.is_final for i in s.query().values()), timeout=60,
               message="session jobs did not end after teardown")


def committed(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def test_failover_loop_commits_every_unit_exactly_once(session, tmp_path):
    session.wait_for_head(timeout=90)
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="2G", time_limit="30"))
    session.wait_for_worker_allocation(worker, timeout=90)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    commits = tmp_path / "commits.txt"
    total = 30
    argv = [sys.executable, str(driver), str(commits), str(total)]

    first_head = session.record().head_job
    run = session.run(argv)
    wait_until(lambda: len(committed(commits)) >= 5, timeout=90, message="driver made no progress")
    session.scheduler.cancel(first_head)
    t_lost = time.monotonic()
    with pytest.raises(SlurmAllocationEnded) as ended:
        run.wait(timeout=60)
    assert ended.value.allocation_state in ("CANCELLED", "COMPLETING", "REPLACED")

    head = session.replace_head(timeout=120)
    t_elected = time.monotonic()
    # The worker allocation hosts the head now: no new allocation was queued.
    assert head.job_id == worker.job_id
    assert first_head in session.record().predecessors
    wait_until(lambda: any(s.get("state") == "JOINED" and s.get("head_job") == head.job_id
                           for s in session.node_states(worker.job_id).values()),
               timeout=90, message="the worker did not rejoin the new head")
    t_rejoined = time.monotonic()
    print(f"\nhead lost -> replace_head returned {t_elected - t_lost:.1f}s; "
          f"-> worker rejoined {t_rejoined - t_lost:.1f}s")

    result = session.run(argv, head=head).wait(timeout=180)
    assert result.returncode == 0
    units = committed(commits)
    assert sorted(units) == list(range(total)), "every unit committed exactly once"


def test_launch_against_a_replaced_head_raises_replaced(session):
    session.wait_for_head(timeout=90)
    head = session.replace_head(timeout=30)  # healthy: returned unchanged
    assert head.job_id == session.record().head_job
    session.dir.write_ray_head(str(int(head.job_id) + 1000))  # the session moved on
    with pytest.raises(SlurmAllocationEnded) as ended:
        session.run([sys.executable, "-c", "pass"], head=head)
    assert ended.value.allocation_state == "REPLACED"
    session.dir.write_ray_head(head.job_id)
