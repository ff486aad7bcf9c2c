"""The autoscaler for real on the local scheduler: real agents, real Ray, real demand.

A separate head (no CPUs, no GPUs) and no worker: a driver asks for two tasks of
``{"GPU": 1}``. The policy offers a CPU pool and a GPU pool; the autoscaler, run by
this process's supervisor under the lease, must submit to the GPU pool only, the
tasks must run there, and once the allocation sat idle for ``idle_timeout`` it must
be drained and end COMPLETED. Every step is read back from the event log.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

from click.testing import CliRunner

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.cli import main
from elastic_ray.autoscale import AutoscalePolicy, Pool
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.scaling import store
from elastic_ray.coordinator.session import Session
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind
from elastic_ray.scheduler.base import JobState
from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G")
CPU_POOL = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=2, mem="2G", time_limit="30")
GPU_POOL = SlurmWorkerAllocationConfig(partition="gpu-b", num_nodes=1, gpus_per_node=2, cpus_per_task=2, mem="2G",
                                       time_limit="30")

DRIVER = r'''
import socket
import ray
ray.init(logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1)
def where():
    return ray.get_runtime_context().get_node_id()

print(sorted(set(ray.get([where.remote() for _ in range(2)], timeout=120))))
'''


def _decisions(session: Session, action: str) -> list:
    return [e for e in event_log.read(session.path).events
            if e.kind is EventKind.SCALER_DECISION and e.details.get("action") == action]


def test_pending_gpu_tasks_grow_the_run_on_the_pool_that_fits_then_idle_drains_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("ELASTIC_RAY_AUTOSCALE_INTERVAL", "1")
    session = Session.create(tmp_path / "s", scheduler="local", head=HEAD, supervise=True,
                             launcher=RayLauncher(object_store_memory=100_000_000))
    try:
        session.wait_for_head(timeout=90)
        t0 = time.monotonic()
        session.autoscale(AutoscalePolicy(pools=[Pool(CPU_POOL, max_allocations=2), Pool(GPU_POOL)],
                                          idle_timeout=3, demand_delay=0.5, backlog=1))
        with (tmp_path / "driver.out").open("w") as out, (tmp_path / "driver.err").open("w") as err:
            result = session.run([sys.executable, "-c", DRIVER], stdout=out, stderr=err).wait(timeout=150)
        assert result.returncode == 0, (tmp_path / "driver.err").read_text()[-2000:]
        t_ran = time.monotonic() - t0

        submits = _decisions(session, "submit")
        assert [(e.details["partition"], e.details["pool"]) for e in submits] == [("gpu-b", 1)], submits
        job = submits[0].job
        assert "2 x {CPU: 1, GPU: 1}" in submits[0].reason and "gpu-b" in submits[0].reason, submits[0].reason
        # The tasks ran on the node of that allocation: the one Ray node the driver printed is its node.
        ran_on = eval((tmp_path / "driver.out").read_text().strip().splitlines()[-1])
        assert ran_on == [s.node_id for s in session.node_states(job).values()]

        # No demand now: idle_timeout later it is drained through its agents and ends COMPLETED.
        wait_until(lambda: _decisions(session, "drain"), timeout=30, message="the idle allocation was not drained")
        drain = _decisions(session, "drain")[0]
        assert drain.job == job and "idle" in drain.reason
        final = wait_until(lambda: (i := session.job_info(job)) is not None and i.state.is_final and i, timeout=60,
                           message="the drained allocation did not end")
        assert final.state is JobState.COMPLETED
        t_done = time.monotonic() - t0
        lease_events = [e for e in event_log.read(session.path).events if e.kind is EventKind.AUTOSCALE_LEASE]
        assert lease_events and lease_events[0].reason == "taken"
        state = store.read_state(session.path)
        assert state is not None and state.jobs[job].ending and not state.error
        assert len(_decisions(session, "submit")) == 1, "nothing more was submitted"
        # `session status --json` shows the autoscaler: on, run by this process, the job it drained.
        shown = json.loads(CliRunner().invoke(main, ["session", "status", "--json", str(session.path)]).stdout)
        scale = shown["autoscale"]
        assert scale["on"] and scale["holder"].split(":")[1] == str(os.getpid()) and scale["jobs"][job]["ending"]
        assert [r["action"] for r in scale["recent"]] == ["submit", "drain"]
        table = CliRunner().invoke(main, ["session", "status", str(session.path)]).stdout
        assert "autoscaler: on (2 pools: cpu, gpu-b)" in table and "idle" in table, table
        print(f"\npolicy set -> tasks done {t_ran:.1f} s; -> allocation COMPLETED {t_done:.1f} s")
    finally:
        session.teardown()
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")
