"""Real Dagster runs on the real Slurm lab: ``dagster.materialize`` with
``ComputeResource(mode="slurm")``, real sbatch/srun/scancel, real agents, real Ray.

The same scenarios as tests/test_dagster_assets.py and test_dagster_sensor.py
run on the local scheduler; here they cross real partitions (head on ``cpu``,
workers on ``gpu-a`` and ``gpu-b``), real Slurm job states and per-node /tmp.
Session directories, payload scripts and commit files therefore live in the
lab's shared directory, which the host and every node see at the same path.

Every run is materialized in-process, so the run's end tears its session
down; the ``session_root`` fixture tears down whatever is left anyway (a test
that fails half-way must not leave jobs behind) and waits until ``squeue``
lists none of them.
"""

import json
import threading
import uuid
from pathlib import Path

import dagster
import pytest

import elastic_ray.demo.pipes_payload as pipes_payload_module
from elastic_ray.config import SlurmRunAllocationConfig as CoreRunAllocation
from elastic_ray.config import SlurmWorkerAllocationConfig as CoreWorkerAllocation
from elastic_ray.config.launcher import RayLauncher as CoreRayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.dagster import (
    ComputeResource,
    RayLauncher,
    SlurmAllocationEnded,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
    build_orphan_sensor,
)
from integration.slurm_helpers import end_session, squeue_ids
from tests.helpers import committed_units, wait_until

pytestmark = [pytest.mark.dagster, pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(300)]

PAYLOAD = pipes_payload_module.__file__
LAUNCHER = RayLauncher(object_store_memory=100_000_000)
# For the tests that are not about failover: no warm standby moving between the partitions' allocations.
NO_STANDBY = RayLauncher(object_store_memory=100_000_000, standby_head=False)
QUEUE = SlurmQueueConfig(time_limit="20", mem="1G")
CPU_HEAD = SlurmRunAllocationConfig(partition="cpu", cpus_per_task=1, mem="1G", time_limit="30")


# ------------------------------------------------------------------ fixtures and helpers

def teardown_all(root: Path) -> None:
    """Cancel the jobs of every session under ``root`` and wait until Slurm lists none."""
    for path in sorted(p for p in root.iterdir() if (p / "session.json").is_file()):
        session = Session.open(path, supervise=False)
        try:
            end_session(session, label=f"{path.name} ({session.job_name})")
        finally:
            session.close()


@pytest.fixture(name="session_root")
def session_root_fixture(slurm_lab, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    root = slurm_lab.shared_dir(f"dagster/{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("ELASTIC_RAY_SESSION_ROOT", str(root))
    try:
        yield root
    finally:
        teardown_all(root)


def cpu_head_compute(launcher: RayLauncher = LAUNCHER, **run_allocation) -> ComputeResource:
    """The seed's CPU-head layout: a small head on ``cpu``, the run's first
    worker allocation on ``gpu-a``."""
    return ComputeResource(
        mode="slurm",
        slurm=SlurmResource(queue=QUEUE),
        default_launcher=launcher,
        ray_head_allocation=CPU_HEAD,
        run_allocation=SlurmRunAllocationConfig(partition="gpu-a", **run_allocation),
    )


def materialization_metadata(result: dagster.ExecuteInProcessResult, key: str) -> dict:
    events = result.asset_materializations_for_node(key)
    assert events, f"no materialization of {key}"
    return {k: v.value for k, v in events[-1].metadata.items()}


def run_jobs_gone(root: Path) -> bool:
    """Whether Slurm lists no job of any session under ``root`` (the run's end tore them down)."""
    names = [json.loads((p / "session.json").read_text())["job_name"]
             for p in root.iterdir() if (p / "session.json").is_file()]
    return bool(names) and not any(squeue_ids(name) for name in names)


# ------------------------------------------------------------------ 1. CPU head, workers from two partitions

PLACEMENT_PROBE = r'''
import json, os, socket
import ray
from dagster_pipes import open_dagster_pipes


def node_name():
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


with open_dagster_pipes() as pipes:
    ray.init(logging_level="ERROR", log_to_driver=False)

    @ray.remote(num_cpus=1, resources={"accelerator:h100": 1})
    class OnH100:
        def where(self):
            return node_name()

    @ray.remote(num_gpus=2)
    def on_two_gpus():
        return node_name()

    h100 = OnH100.remote()
    nodes = {n["NodeManagerHostname"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    pipes.report_asset_materialization(metadata={
        "driver_node": node_name(),
        "h100_actor_node": ray.get(h100.where.remote(), timeout=120),
        "two_gpu_task_node": ray.get(on_two_gpus.remote(), timeout=120),
        "nodes": json.dumps(nodes),
    })
'''


def test_cpu_head_with_workers_from_two_gpu_partitions(session_root):
    probe = session_root / "placement_probe.py"
    probe.write_text(PLACEMENT_PROBE)
    seen: dict = {}

    @dagster.asset
    def placed(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        (a40,) = session.worker_allocations  # run_allocation: the run's first worker allocation
        h100 = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-b", gpus_per_node=1, cpus_per_task=1, ray_resources={"accelerator:h100": 1}))
        seen["a40_nodes"] = list(session.wait_for_worker_allocation(a40, timeout=180))
        seen["h100_nodes"] = list(session.wait_for_worker_allocation(h100, timeout=180))
        seen["h100_config"] = h100.config
        seen["head_job"] = session.session.record().head_job
        return compute.run(context=context, payload_path=str(probe)).get_results()

    compute = cpu_head_compute(NO_STANDBY, gpus_per_node=2, cpus_per_task=2)
    result = dagster.materialize([placed], resources={"compute": compute})
    assert result.success
    assert seen["a40_nodes"] == ["gpua-1"] and seen["h100_nodes"] == ["gpub-1"]
    # The queue rule on the added worker: its own partition, GPUs and label;
    # the first worker's walltime and memory (the queue's) as resolved.
    config = seen["h100_config"]
    assert config.partition == "gpu-b" and config.gpus_per_node == 1 and config.time_limit == "20"
    assert config.mem == "1G" and dict(config.ray_resources) == {"accelerator:h100": 1}

    meta = materialization_metadata(result, "placed")
    assert meta["h100_actor_node"] == "gpub-1", "the custom resource lives on gpu-b's node only"
    assert meta["two_gpu_task_node"] == "gpua-1", "only gpu-a's allocation has two GPUs"
    assert meta["driver_node"] in ("cpu-1", "cpu-2"), "the driver runs in the CPU head allocation"
    assert meta["elastic_ray/head_job"] == seen["head_job"]
    nodes = json.loads(meta["nodes"])
    assert set(nodes) == {meta["driver_node"], "gpua-1", "gpub-1"}, nodes
    assert not nodes[meta["driver_node"]].get("CPU") and not nodes[meta["driver_node"]].get("GPU"), \
        "the head's Ray node advertises no CPUs or GPUs"
    assert nodes["gpua-1"]["GPU"] == 2 and nodes["gpub-1"]["GPU"] == 1
    assert nodes["gpub-1"]["accelerator:h100"] == 1 and "accelerator:h100" not in nodes["gpua-1"]
    assert nodes["gpua-1"].get("dagster_slurm_worker") and nodes["gpub-1"].get("dagster_slurm_worker")
    wait_until(lambda: run_jobs_gone(session_root), timeout=90, message="the run's end cancelled its jobs")


# ------------------------------------------------------------------ 2. a worker allocation removed mid-asset

# Phase 1 runs on both workers while the asset removes one of them; the
# payload then waits until the removed node has left Ray and carries on with
# phase 2 on the remaining node, in the same driver and the same Ray cluster.
SHRINK_PAYLOAD = r'''
import sys, time
import ray
from dagster_pipes import open_dagster_pipes
from elastic_ray.demo.payload import commit_units
from elastic_ray.ray import wait_for_stable_ray_resources

commits, first, total, cpus_left = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
with open_dagster_pipes() as pipes:
    ray.init(logging_level="ERROR", log_to_driver=False)
    wait_for_stable_ray_resources({"CPU": cpus_left + 1}, stable_polls=2, poll_interval_seconds=0.5,
                                  timeout_seconds=120, resource_provider=ray.cluster_resources)
    phase1 = commit_units(commits, first, pipes.log.info)
    deadline = time.monotonic() + 150
    while ray.cluster_resources().get("CPU", 0) > cpus_left:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the removed worker did not leave: {ray.cluster_resources()}")
        time.sleep(0.5)
    phase2 = commit_units(commits, total, pipes.log.info)
    pipes.report_asset_materialization(metadata={
        "phase1_nodes": phase1["nodes"], "phase2_nodes": phase2["nodes"],
        "committed_after_removal": phase2["committed_now"],
        "cpus_after": float(ray.cluster_resources().get("CPU", 0)),
    })
'''


def test_worker_allocation_removed_mid_asset(session_root):
    payload = session_root / "shrink_payload.py"
    payload.write_text(SHRINK_PAYLOAD)
    commits = session_root / "commits.txt"
    first, total = 12, 20
    removal: dict = {}

    def remove_when_busy(session, handle) -> None:
        try:
            wait_until(lambda: len(committed_units(commits)) >= 4, timeout=180, message="payload progress")
            removal["at_commits"] = len(committed_units(commits))
            removal["state"] = session.remove_worker_allocation(handle, drain_timeout=60)
        except BaseException as exc:  # noqa: BLE001 - reported by the asset
            removal["error"] = exc

    @dagster.asset
    def shrunk(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        extra = session.add_worker_allocation(SlurmWorkerAllocationConfig(partition="gpu-b", cpus_per_task=2))
        removal["job"] = extra.job_id
        remover = threading.Thread(target=remove_when_busy, args=(session, extra), daemon=True)
        remover.start()
        results = compute.run(context=context, payload_path=str(payload),
                              args=[str(commits), str(first), str(total), "2"]).get_results()
        remover.join(timeout=120)
        assert "error" not in removal, removal
        removal["workers_after"] = [w.job_id for w in session.worker_allocations]
        return results

    result = dagster.materialize([shrunk], resources={"compute": cpu_head_compute(NO_STANDBY, cpus_per_task=2)})
    assert result.success
    assert removal["state"] == "COMPLETED", removal
    assert removal["job"] not in removal["workers_after"]
    meta = materialization_metadata(result, "shrunk")
    print(f"\nremoval started at {removal['at_commits']}/{total} commits; phase 2 committed "
          f"{meta['committed_after_removal']} on {meta['phase2_nodes']} node(s)")
    assert meta["phase1_nodes"] == 2, "both workers computed before the removal"
    assert meta["phase2_nodes"] == 1 and meta["cpus_after"] == 2, "the rest ran on the remaining worker"
    assert meta["committed_after_removal"] == total - first
    assert sorted(committed_units(commits)) == list(range(total)), "every unit committed exactly once"
    wait_until(lambda: run_jobs_gone(session_root), timeout=90, message="the run's end cancelled its jobs")


# ------------------------------------------------------------------ 3. the head cancelled mid-asset

def test_head_cancelled_mid_asset_seed_loop(session_root):
    commits = session_root / "commits.txt"
    total = 40
    cancelled: dict = {}

    def cancel_head_mid_run(session) -> None:
        try:
            wait_until(lambda: len(committed_units(commits)) >= 4, timeout=180, message="payload progress")
            cancelled["head"] = session.session.record().head_job
            cancelled["at_commits"] = len(committed_units(commits))
            session.session.scheduler.cancel(cancelled["head"])
        except BaseException as exc:  # noqa: BLE001 - asserted below
            cancelled["error"] = exc

    @dagster.asset
    def robust(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        cancelled["worker"] = session.worker_allocations[0].job_id
        threading.Thread(target=cancel_head_mid_run, args=(session,), daemon=True).start()
        # The seed's loop, unchanged.
        while True:
            try:
                return compute.run(
                    context=context, payload_path=PAYLOAD, args=[str(commits), str(total)]
                ).get_results()
            except SlurmAllocationEnded:
                # Waits for the election; committed work is skipped on relaunch.
                session.replace_head(timeout=3600)

    result = dagster.materialize([robust], resources={"compute": cpu_head_compute(cpus_per_task=2)})
    assert result.success
    assert "error" not in cancelled, cancelled
    meta = materialization_metadata(result, "robust")
    print(f"\nhead {cancelled['head']} cancelled at {cancelled['at_commits']}/{total} commits; the relaunch on "
          f"{meta['elastic_ray/head_job']} found {meta['already_committed']} committed")
    assert meta["elastic_ray/head_job"] != cancelled["head"], "the last launch ran on a new head"
    assert meta["elastic_ray/head_job"] == cancelled["worker"], "the running worker allocation was elected"
    assert meta["already_committed"] >= cancelled["at_commits"] >= 4
    assert meta["already_committed"] + meta["committed_now"] == total
    # What the run held, on the materialization: one head move, node-hours of a head and a worker.
    assert meta["elastic_ray/head_moves"] == 1 and meta["elastic_ray/node_hours"] > 0
    print("materialization metadata:", {k: v for k, v in meta.items() if k.startswith("elastic_ray/")})
    assert sorted(committed_units(commits)) == list(range(total)), "every unit committed exactly once"
    wait_until(lambda: run_jobs_gone(session_root), timeout=90, message="the run's end cancelled its jobs")


# ------------------------------------------------------------------ 4. the orphan sensor on Slurm

@dagster.asset
def trivial():
    return 1


def ended_run(instance: dagster.DagsterInstance) -> str:
    result = dagster.materialize([trivial], instance=instance)
    assert result.success
    return result.run_id


def states(session: Session) -> dict[str, str]:
    return {job: info.state.value for job, info in session.query().items()}


def test_orphan_sensor_on_slurm(session_root):
    instance = dagster.DagsterInstance.ephemeral()
    head = CoreRunAllocation(partition="cpu", cpus_per_task=1, mem="1G", time_limit="30")
    launcher = CoreRayLauncher(object_store_memory=100_000_000)
    dead_run, waiting_run = ended_run(instance), ended_run(instance)

    # A run that ended and left its head running (its process died).
    dead = Session.create(session_root / dead_run, head=head, scheduler="slurm", launcher=launcher,
                          supervise=False)
    # A run whose head ended while its worker allocation runs, waiting for a new head.
    waiting = Session.create(session_root / waiting_run, head=head, scheduler="slurm", launcher=launcher,
                             supervise=False)
    worker = waiting.add_worker_allocation(CoreWorkerAllocation(partition="gpu-b", cpus_per_task=1, mem="1G",
                                                                time_limit="20"))
    try:
        waiting_head = waiting.record().head_job
        wait_until(lambda: states(waiting).get(worker.job_id) == "RUNNING", timeout=60,
                   message="the waiting run's worker allocation runs")
        waiting.scheduler.cancel(waiting_head)
        wait_until(lambda: states(waiting) == {waiting_head: "CANCELLED", worker.job_id: "RUNNING"}, timeout=60,
                   message="head cancelled and worker running")
        wait_until(lambda: squeue_ids(dead.job_name), timeout=30, message="the dead run's head is listed")

        sensor = build_orphan_sensor(session_root=str(session_root))
        reason = sensor(dagster.build_sensor_context(instance=instance))
        assert isinstance(reason, dagster.SkipReason)
        assert "tore down 1 session" in reason.skip_message and dead_run in reason.skip_message
        assert "spared 1" in reason.skip_message and waiting_run in reason.skip_message

        wait_until(lambda: not squeue_ids(dead.job_name), timeout=60,
                   message="squeue still lists the dead run's jobs")
        assert squeue_ids(waiting.job_name) == [worker.job_id], "only the waiting worker allocation is left"
        assert states(waiting)[worker.job_id] == "RUNNING", "the waiting worker allocation was spared"
        # A torn-down session is not looked at again; the waiting one still is.
        again = sensor(dagster.build_sensor_context(instance=instance))
        assert "checked 1" in again.skip_message and "spared 1" in again.skip_message, again.skip_message
    finally:
        dead.close()
        waiting.close()
