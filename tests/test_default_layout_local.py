"""The seed's default head layout, for real on the local scheduler.

Without a separate head allocation, the run's first allocation hosts the Ray
head AND computes: its first node runs a head-only control plane next to its
own Ray worker (the same mechanism an elected worker allocation uses), so the
node's CPUs and GPUs are offered to Ray. Real agents, real Ray.
"""

from __future__ import annotations

import json
import sys

import pytest

from elastic_ray import SlurmRunAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.errors import ConfigError
from elastic_ray.protocol.disk.records import AgentState
from tests.helpers import wait_until

RUN = SlurmRunAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=2, gpus_per_node=2, mem="2G",
                               time_limit="30")

# A driver that reports what the cluster offers and where a CPU task ran.
PROBE = r"""
import json, os, socket, ray
ray.init(logging_level="ERROR", log_to_driver=False)
@ray.remote(num_cpus=1, num_gpus=1)
def where():
    return os.environ.get("SLURMD_NODENAME", socket.gethostname())
total = ray.cluster_resources()
print(json.dumps({"CPU": total.get("CPU", 0), "GPU": total.get("GPU", 0),
                  "worker": total.get("dagster_slurm_worker", 0), "ran_on": ray.get(where.remote(), timeout=60)}))
"""


def test_fixed_ports_cannot_host_the_head_next_to_a_worker(tmp_path):
    with pytest.raises(ConfigError) as refused:
        Session.create(tmp_path / "s", head=RUN, scheduler="local", ray_head_only=False,
                       launcher=RayLauncher(port_strategy="fixed"), supervise=False)
    assert refused.value.field == "launcher.port_strategy"
    assert not (tmp_path / "s").exists(), "a refused session must leave nothing behind"


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_first_allocation_hosts_the_head_and_computes(tmp_path, monkeypatch):
    """Full tier. On every change: the default layout's head computes
    (``test_dagster_assets::test_default_layout_head_computes``) and a run
    with no worker allocation fails over to a new allocation shaped like the
    first (``test_coordinator_local::test_without_workers_replace_head_submits_a_new_head_allocation``)."""
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    session = Session.create(tmp_path / "s", head=RUN, scheduler="local", ray_head_only=False,
                             launcher=RayLauncher(object_store_memory=100_000_000), supervise=False)
    try:
        session.wait_for_head(timeout=120)
        record = session.record()
        first = record.head_job
        assert first in record.workers and record.workers[first].hosts_run_head, \
            "the run's first allocation is recorded as a worker allocation that hosts the run's head"
        assert session.worker_allocations == [], "it is not an added worker allocation"
        wait_until(lambda: any(s.state is AgentState.JOINED and s.head_job == first
                               for s in session.node_states(first).values()),
                   timeout=90, message="the first allocation's worker did not join its own head")

        out = tmp_path / "probe.json"
        with out.open("w") as handle:
            session.run([sys.executable, "-c", PROBE], stdout=handle).wait(timeout=120)
        seen = json.loads(out.read_text().strip().splitlines()[-1])
        # The head's node offers the CPUs and GPUs it was granted, and the
        # dagster_slurm_worker resource, like any worker node.
        assert seen["CPU"] == 2 and seen["GPU"] == 2 and seen["worker"] == 1, seen
        node = next(iter(session.node_states(first)))
        assert seen["ran_on"] == node

        # No added worker allocation: the session does not elect on its own,
        # but replace_head() fails over to a new allocation shaped like the
        # first one, which again hosts the head and computes.
        session.scheduler.cancel(first)
        head = session.replace_head(timeout=180)
        assert head.job_id != first and head.job_id in session.record().workers
        assert first in session.record().predecessors
        wait_until(lambda: any(s.state is AgentState.JOINED and s.head_job == head.job_id
                               for s in session.node_states(head.job_id).values()),
                   timeout=90, message="the new allocation's worker did not join its own head")
        with out.open("w") as handle:
            session.run([sys.executable, "-c", PROBE], stdout=handle).wait(timeout=120)
        again = json.loads(out.read_text().strip().splitlines()[-1])
        assert again["CPU"] == 2 and again["GPU"] == 2, again
    finally:
        session.teardown()
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")
