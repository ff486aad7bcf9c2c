"""A Dagster run that scales by itself: ``ComputeResource(autoscale=...)`` given as run config.

Local scheduler, real agents, real Ray, real Dagster. The run's session has a CPU head and a
CPU first allocation; its payload (Pipes) asks for two GPU tasks, which nothing in the run can
hold. The policy, set when the step created the run's session, offers gpu-b: the step's own
process (it supervises the session) holds the lease, submits a gpu-b allocation, the tasks run
there and the payload reports where. The run's end tears everything down, as always, and
stops the scaling first.
"""

import uuid

import dagster
import pytest

from elastic_ray.dagster import ComputeResource, SlurmSessionResource
from elastic_ray.coordinator.scaling import store
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind
from tests.dagster_helpers import all_jobs_final, session_root_fixture  # noqa: F401 - fixture "session_root"
from tests.helpers import wait_until

pytestmark = [pytest.mark.dagster, pytest.mark.ray, pytest.mark.timeout(300)]

GPU_PAYLOAD = r'''
from dagster_pipes import open_dagster_pipes
import ray
with open_dagster_pipes() as pipes:
    ray.init(logging_level="ERROR", log_to_driver=False)
    where = ray.remote(num_gpus=1)(lambda: ray.get_runtime_context().get_node_id())
    nodes = sorted(set(ray.get([where.remote() for _ in range(2)], timeout=120)))
    pipes.report_asset_materialization(metadata={"gpu_nodes": ",".join(nodes)})
'''

CONFIG = {
    "mode": "local",
    "default_launcher": {"object_store_memory": 100_000_000, "standby_head": False},   # not about failover
    "ray_head_allocation": {"partition": "cpu", "cpus_per_task": 1, "mem": "1G", "time_limit": "30"},
    "run_allocation": {"partition": "cpu", "cpus_per_task": 1, "mem": "1G", "time_limit": "30"},
    "autoscale": {"pools": [{"config": {"partition": "gpu-b", "gpus_per_node": 2, "cpus_per_task": 2, "mem": "2G",
                                        "time_limit": "30"}}],
                  "demand_delay": 0.5},
}


def test_a_run_with_an_autoscale_policy_grows_onto_the_pool_its_payload_needs(session_root, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("ELASTIC_RAY_AUTOSCALE_INTERVAL", "1")
    payload = tmp_path / "gpu_payload.py"
    payload.write_text(GPU_PAYLOAD)
    seen = {}

    @dagster.asset
    def on_gpus(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        seen["path"] = session.path
        return compute.run(context=context, payload_path=str(payload), timeout=180).get_results()

    result = dagster.materialize([on_gpus], resources={"compute": ComputeResource.configure_at_launch()},
                                 run_config={"resources": {"compute": {"config": CONFIG}}})
    assert result.success
    events = event_log.read(seen["path"]).events
    policy = [e.reason for e in events if e.kind is EventKind.AUTOSCALE_POLICY]
    submits = [e for e in events if e.kind is EventKind.SCALER_DECISION and e.details.get("action") == "submit"]
    assert policy == ["set", "stopped by teardown"] and [e.details["partition"] for e in submits] == ["gpu-b"], submits
    meta = {k: v.value for k, v in result.asset_materializations_for_node("on_gpus")[-1].metadata.items()}
    joined = [e.details.get("ray_node_id") for e in events if e.kind is EventKind.NODE_JOINED and e.job == submits[0].job]
    assert meta["gpu_nodes"] in joined, (meta, joined)
    wait_until(lambda: all_jobs_final(session_root), timeout=60, message="run's jobs ended")


def test_a_session_resource_sets_its_policy_on_the_session_it_creates_and_on_a_re_execution(session_root):
    """SlurmSessionResource(autoscale=...): the policy is stored when the resource creates the run's
    session (no demand here, so nothing is submitted), and the run's end stops it with the rest. A
    re-execution (the same root run id: the same session, its head gone) gets a new head and the policy
    again."""
    seen = []

    @dagster.asset
    def scaled(context: dagster.AssetExecutionContext, session: SlurmSessionResource):
        run = session.get_run_allocation_session(context)
        seen.append((run.path, store.read_policy(run.path).policy))
        return 1

    resource = SlurmSessionResource(mode="local", partition="cpu", cpus_per_task=1, mem="1G", time_limit="30",
                                    ray_head_only=True, launcher={"object_store_memory": 100_000_000, "standby_head": False},
                                    autoscale=CONFIG["autoscale"])
    job = dagster.Definitions(assets=[scaled], resources={"session": resource}).resolve_implicit_global_asset_job_def()
    run_id = str(uuid.uuid4())
    assert job.execute_in_process(run_id=run_id).success
    path = seen[0][0]
    assert seen[0][1] == resource.autoscale.to_core()
    reasons = [e.reason for e in event_log.read(path).events if e.kind is EventKind.AUTOSCALE_POLICY]
    assert reasons == ["set", "stopped by teardown"] and store.read_policy(path).policy is None
    wait_until(lambda: all_jobs_final(session_root), timeout=60, message="run's jobs ended")

    assert job.execute_in_process(run_id=run_id).success     # a fresh instance: the same run id, as a retry's root
    assert seen[1] == (path, resource.autoscale.to_core())
    reasons = [e.reason for e in event_log.read(path).events if e.kind is EventKind.AUTOSCALE_POLICY]
    assert reasons == ["set", "stopped by teardown", "set", "stopped by teardown"]
    wait_until(lambda: all_jobs_final(session_root), timeout=60, message="run's jobs ended")
