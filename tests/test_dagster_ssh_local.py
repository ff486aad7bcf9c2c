"""The Dagster resources in SSH mode on the local scheduler: a real sshd, real
agents, real Ray, a real materialization.

``SlurmSessionResource`` here (``ComputeResource`` with a head failover runs
on the lab in integration/test_remote_slurm.py). The Dagster process talks to
the session only over SSH; the payload file is uploaded next to the session,
its Pipes messages come back over the same call, and what the run held is
computed on the cluster side (the timeline page drawn there).
"""

import importlib.util
import os
import signal
import time
from pathlib import Path

import dagster
import pytest

from elastic_ray.coordinator.session import Session
from elastic_ray.dagster import (
    RayLauncher,
    SlurmResource,
    SlurmSessionResource,
    SlurmWorkerAllocationConfig,
    SSHConnectionResource,
)
from elastic_ray.remote import RemoteSession
from elastic_ray.coordinator.detached import running_pid
from tests.helpers import wait_until
from tests.remote_helpers import REMOTE_PYTHON, target_of

pytestmark = [pytest.mark.dagster, pytest.mark.ray, pytest.mark.timeout(300)]

PROBE = r'''
import sys
import ray
from dagster_pipes import open_dagster_pipes

with open_dagster_pipes() as pipes:
    ray.init(logging_level="ERROR", log_to_driver=False)
    pipes.log.info("probe: connected")
    print("probe stdout line")
    hosts = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    pipes.report_asset_materialization(metadata={"nodes": len(hosts), "argv": " ".join(sys.argv[1:]),
                                                 "cpus": ray.cluster_resources().get("CPU", 0)})
'''


def stop_everything(base) -> None:
    for marker in base.rglob("session.json") if base.is_dir() else []:
        path = marker.parent
        pid = running_pid(path)
        if pid and pid > 0:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            wait_until(lambda: running_pid(path) is None, timeout=60, message="supervisor stopped")
        session = Session.open(path, supervise=False)
        session.teardown()
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message=f"jobs of {path.name} ended")


def test_session_resource_over_ssh_materializes_with_pipes(sshd, tmp_path):
    base = tmp_path / "remote-base"
    probe = tmp_path / "local-probe.py"   # on the Dagster side; uploaded by run()
    probe.write_text(PROBE)
    t = target_of(sshd)
    seen: dict = {}

    @dagster.asset
    def probed(context: dagster.AssetExecutionContext, cluster: SlurmSessionResource):
        run_session = cluster.get_run_allocation_session(context)
        assert isinstance(run_session.session, RemoteSession)
        seen["path"] = str(run_session.path)
        worker = cluster.add_worker_allocation(SlurmWorkerAllocationConfig(partition="gpu-a", cpus_per_task=2))
        cluster.wait_for_worker_allocation(worker, timeout=120)
        seen["workers"] = [w.job_id for w in cluster.worker_allocations]
        seen["worker"] = worker.job_id
        return cluster.run(context, str(probe), args=["a", "b"]).get_results()

    cluster = SlurmSessionResource(
        mode="local", partition="cpu", time_limit="30", mem="2G", cpus_per_task=1, ray_head_only=True,
        launcher=RayLauncher(object_store_memory=100_000_000, standby_head=False),   # not about failover
        slurm=SlurmResource(ssh=SSHConnectionResource(host=t.host, port=t.port, user=t.user, key_path=t.key_path,
                                                      options=list(t.options), config_file=t.config_file),
                            remote_base=str(base), remote_python=REMOTE_PYTHON))
    try:
        began = time.time()
        result = dagster.materialize([probed], resources={"cluster": cluster})
        wall = time.time() - began
        assert result.success
        meta = {k: v.value for k, v in result.asset_materializations_for_node("probed")[-1].metadata.items()}
        assert meta["nodes"] == 2 and meta["cpus"] == 2 and meta["argv"] == "a b"
        assert meta["elastic_ray/ssh_host"] == t.host
        # What the run held, computed on the cluster side from its event log: two nodes
        # (the head's, the worker's), each held at least while the driver ran and at most
        # for the materialization's wall time (the figures are rounded to 1e-4 h).
        assert "elastic_ray/usage_error" not in meta, meta["elastic_ray/usage_error"]
        held_at_least = 2 * meta["elastic_ray/driver_seconds"] / 3600
        assert 0 < meta["elastic_ray/node_hours"] and \
            held_at_least - 1e-4 <= meta["elastic_ray/node_hours"] <= 2 * wall / 3600 + 1e-4, (meta, wall)
        assert meta["elastic_ray/gpu_hours_held"] == 0 and "elastic_ray/gpu_hours_idle" not in meta
        assert meta["elastic_ray/head_moves"] == 0     # the story moved no head
        timeline = meta["elastic_ray/timeline"]
        if importlib.util.find_spec("matplotlib") is not None:    # the cluster side (this venv) has the extra
            host, _, page = timeline.partition(":")
            assert host == t.host and page == os.path.join(seen["path"], "timeline.html"), timeline
            assert "<svg" in Path(page).read_text(), "the page was drawn on the cluster side"
            assert meta["elastic_ray/timeline_fetch"].endswith(f"{t.host}:{page} ."), meta
        else:
            assert timeline == f"on {t.host}: elastic-ray session timeline {seen['path']} --output run.html"
        print("\nmaterialization metadata:", {k: v for k, v in meta.items() if k.startswith("elastic_ray/")})
        assert seen["workers"] == [seen["worker"]]
        assert seen["path"].startswith(str(base / "sessions"))
        assert list((base / "sessions").glob("*/payloads/*-local-probe.py")), "the payload was uploaded"
        # The run ended in this process: its session was torn down over SSH, supervisor included.
        path = base / "sessions" / os.path.basename(seen["path"])
        wait_until(lambda: running_pid(path) is None, timeout=60, message="supervisor ended with the run")
        inside = Session.open(path, supervise=False)
        wait_until(lambda: all(i.state.is_final for i in inside.query().values()), timeout=60,
                   message="the run's jobs ended")
    finally:
        stop_everything(base)
