"""Real Dagster assets on real sessions: local scheduler, real agents, real Ray.

Each test materializes assets in-process with ``dagster.materialize``, so the
run's session is torn down when the run ends (checked at the end).
"""


import importlib.util
import threading
from pathlib import Path

import dagster
import pytest

import elastic_ray.demo.pipes_payload as pipes_payload_module
from elastic_ray.dagster import (
    ComputeResource,
    RayLauncher,
    SlurmAllocationEnded,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
    SlurmStepDrained,
    SlurmWorkerAllocationConfig,
)
from tests.dagster_helpers import all_jobs_final, session_root_fixture  # noqa: F401 - fixture "session_root"
from tests.helpers import committed_units, wait_until

pytestmark = [pytest.mark.dagster, pytest.mark.ray, pytest.mark.timeout(300)]

PAYLOAD = pipes_payload_module.__file__
LAUNCHER = RayLauncher(object_store_memory=100_000_000)
NO_STANDBY = RayLauncher(object_store_memory=100_000_000, standby_head=False)   # for tests not about failover


def cpu_head_compute(launcher: RayLauncher = LAUNCHER, **kwargs) -> ComputeResource:
    """The CPU-head layout: a small head allocation, compute in gpu-a."""
    return ComputeResource(
        mode="local",
        slurm=SlurmResource(queue=SlurmQueueConfig(time_limit="30", mem="1G")),
        default_launcher=launcher,
        ray_head_allocation=SlurmRunAllocationConfig(partition="cpu", cpus_per_task=1, mem="1G", time_limit="30"),
        run_allocation=SlurmRunAllocationConfig(partition="gpu-a", cpus_per_task=2, mem="2G"),
        **kwargs,
    )


def materialization_metadata(result: dagster.ExecuteInProcessResult, key: str) -> dict:
    events = result.asset_materializations_for_node(key)
    assert events, f"no materialization of {key}"
    return {k: v.value for k, v in events[-1].metadata.items()}


def test_cpu_head_pipes_metadata_and_waiting_for_an_added_worker(session_root, tmp_path):
    commits = tmp_path / "commits.txt"
    seen: dict = {}

    @dagster.asset
    def grown(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        # The asset grows the cluster; the payload waits until the CPUs joined.
        extra = session.add_worker_allocation(SlurmWorkerAllocationConfig(partition="gpu-b", cpus_per_task=1))
        seen["extra"] = extra.config
        seen["first"] = session.worker_allocations[0].config
        return compute.run(context=context, payload_path=PAYLOAD,
                           args=[str(commits), "6", "--wait-cpus", "3"]).get_results()

    result = dagster.materialize([grown], resources={"compute": cpu_head_compute(NO_STANDBY)})
    assert result.success
    meta = materialization_metadata(result, "grown")
    assert meta["committed_now"] == 6 and meta["already_committed"] == 0
    assert meta["cpus_seen"] >= 3, meta          # the added worker's CPU joined (2 + 1)
    assert meta["elastic_ray/head_job"]          # our own metadata rides along
    # ...with what the run held so far (a CPU head and CPU workers: node-hours, no GPU-hours).
    assert 0 < meta["elastic_ray/node_hours"] < 1 and meta["elastic_ray/gpu_hours_held"] == 0
    assert meta["elastic_ray/head_moves"] == 0 and "elastic_ray/gpu_hours_idle" not in meta
    # With the timeline extra the page was drawn into the session directory; without it, the command.
    if importlib.util.find_spec("matplotlib") is not None:
        assert meta["elastic_ray/timeline"].endswith("/timeline.html")
        assert "<svg" in Path(meta["elastic_ray/timeline"]).read_text()
    else:
        assert meta["elastic_ray/timeline"].startswith("elastic-ray session timeline ")
    print("\nmaterialization metadata:", {k: v for k, v in meta.items() if k.startswith("elastic_ray/")})
    assert sorted(committed_units(commits)) == list(range(6))
    # The queue rule: the first worker took the queue's walltime; the added one
    # inherits the first as resolved (walltime, memory) but keeps its own CPUs.
    assert seen["first"].time_limit == "30" and seen["first"].mem == "2G"
    assert seen["extra"].partition == "gpu-b" and seen["extra"].cpus_per_task == 1
    assert seen["extra"].time_limit == "30" and seen["extra"].mem == "2G"
    # In-process execution: the run's end tore its session down.
    wait_until(lambda: all_jobs_final(session_root), timeout=60, message="run's jobs ended")


@pytest.mark.slow
def test_seed_failover_loop_commits_every_unit_once(session_root, tmp_path):
    """Full tier only: on every change integration/test_dagster_slurm.py runs the seed's loop in an asset on the lab."""
    commits = tmp_path / "commits.txt"
    total = 24
    failovers: list[str] = []

    def cancel_head_mid_run(session) -> None:
        wait_until(lambda: len(committed_units(commits)) >= 4, timeout=120, message="payload progress")
        session.session.scheduler.cancel(session.session.record().head_job)

    @dagster.asset
    def robust(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        threading.Thread(target=cancel_head_mid_run, args=(session,), daemon=True).start()
        while True:
            try:
                return compute.run(context=context, payload_path=PAYLOAD,
                                   args=[str(commits), str(total)]).get_results()
            except SlurmAllocationEnded as ended:
                failovers.append(ended.allocation_state)
                session.replace_head(timeout=180)

    result = dagster.materialize([robust], resources={"compute": cpu_head_compute()})
    assert result.success
    assert failovers and failovers[0] in ("CANCELLED", "COMPLETING", "REPLACED", "JOB_ENDED"), failovers
    units = committed_units(commits)
    assert sorted(units) == list(range(total)), "every unit committed exactly once"
    meta = materialization_metadata(result, "robust")
    assert meta["already_committed"] >= 4 and meta["already_committed"] + meta["committed_now"] == total
    assert meta["elastic_ray/head_moves"] == len(failovers)      # the metadata counts the head's moves
    wait_until(lambda: all_jobs_final(session_root), timeout=60, message="run's jobs ended")


def test_head_drain_surfaces_as_step_drained_and_the_asset_relaunches(session_root, tmp_path):
    """request_drain() on the head while a payload runs: the asset sees
    SlurmStepDrained, replace_head() hands the head over to the running
    worker allocation, and the relaunch finishes the remaining units. The
    asset runs the seed's one loop (``except SlurmAllocationEnded``): a
    drain must not need a loop of its own."""
    commits = tmp_path / "commits.txt"
    # Long enough that the drain (asked after 4 commits) lands mid-run: the
    # payload commits about 3 units a second on the two nodes, and stopping
    # the driver can take a beat or two after the request; with 16 units a
    # CI run saw the payload finish first (all 16 committed, then the drain).
    total = 40
    drained: list[dict] = []
    asked: dict = {}

    def drain_head_mid_run(session) -> None:
        wait_until(lambda: len(committed_units(commits)) >= 4, timeout=120, message="payload progress")
        head = wait_until(lambda: session.head, timeout=30, message="a healthy head to drain")
        asked["head"] = head.job_id
        asked["told"] = head.request_drain(drain_timeout=120)

    @dagster.asset
    def drained_asset(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        asked["session"] = session.session
        threading.Thread(target=drain_head_mid_run, args=(session,), daemon=True).start()
        while True:
            try:
                return compute.run(context=context, payload_path=PAYLOAD,
                                   args=[str(commits), str(total)]).get_results()
            except SlurmAllocationEnded as exc:
                drained.append({"error": exc, "committed": len(committed_units(commits))})
                drained[-1]["new_head"] = session.replace_head(timeout=180).job_id

    result = dagster.materialize([drained_asset], resources={"compute": cpu_head_compute()})
    assert result.success
    assert asked.get("told") == 1, asked              # the head's one agent took the drain
    [event] = drained                                  # one drain, seen once, as SlurmStepDrained
    assert isinstance(event["error"], SlurmStepDrained), event
    assert event["error"].job_id == asked["head"] and event["error"].allocation_state == "DRAINING", event
    assert 4 <= event["committed"] < total, event      # it stopped mid-run
    meta = materialization_metadata(result, "drained_asset")
    worker = meta["elastic_ray/head_job"]
    # The hand-over went to the running worker allocation, not a new head.
    assert event["new_head"] == worker != asked["head"], (event, worker)
    session = asked["session"]
    assert worker in session.record().workers
    assert sorted(session.scheduler.query(session.job_name), key=int) == sorted([asked["head"], worker], key=int)
    assert sorted(committed_units(commits)) == list(range(total)), "every unit committed exactly once"
    assert meta["already_committed"] + meta["committed_now"] == total and meta["already_committed"] >= 4, meta
    wait_until(lambda: all_jobs_final(session_root), timeout=60, message="run's jobs ended")


CPU_PROBE = r'''
from dagster_pipes import open_dagster_pipes
import ray
from elastic_ray.ray import wait_for_stable_ray_resources
with open_dagster_pipes() as pipes:
    ray.init(logging_level="ERROR", log_to_driver=False)
    seen = wait_for_stable_ray_resources({"CPU": 2}, poll_interval_seconds=0.5, timeout_seconds=30)
    cpus = ray.get(ray.remote(num_cpus=1)(lambda: 1).remote())
    # The head's control plane and the node's worker are two Ray nodes on one host.
    hosts = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    pipes.report_asset_materialization(metadata={"cpus": seen["CPU"], "nodes": len(hosts)})
'''


def test_default_layout_head_computes(session_root, tmp_path):
    """Without ray_head_allocation the run's first allocation hosts the head
    AND offers its CPUs to Ray tasks, all on one host."""
    probe = tmp_path / "probe.py"
    probe.write_text(CPU_PROBE)

    @dagster.asset
    def on_the_head(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        assert not session.session.info.ray_head_only and not session.worker_allocations
        return compute.run(context=context, payload_path=str(probe)).get_results()

    compute = ComputeResource(mode="local", default_launcher=LAUNCHER,
                              run_allocation=SlurmRunAllocationConfig(partition="cpu", cpus_per_task=2, mem="2G",
                                                                      time_limit="30"))
    result = dagster.materialize([on_the_head], resources={"compute": compute})
    assert result.success
    meta = materialization_metadata(result, "on_the_head")
    assert meta["cpus"] >= 2 and meta["nodes"] == 1
    wait_until(lambda: all_jobs_final(session_root), timeout=60, message="run's jobs ended")
