"""A small Dagster project on an elastic Ray cluster, on the embedded local scheduler.

Two assets share one run-scoped session: ``squares`` runs a Pipes payload on
the run's CPU head while a worker allocation computes; ``grown_squares``
adds a second worker allocation and waits for its CPUs from inside the
payload before it runs wider. Switch ``mode`` to "slurm" (and describe the
site's queue with SlurmResource) to run the same assets on Slurm.
"""

from pathlib import Path

import dagster as dg

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

PAYLOAD = str(Path(__file__).with_name("payload.py"))


@dg.asset
def squares(context: dg.AssetExecutionContext, compute: ComputeResource):
    session = compute.get_run_allocation_session(context)
    while True:
        try:
            return compute.run(context=context, payload_path=PAYLOAD, args=["8"]).get_results()
        except SlurmAllocationEnded:
            session.replace_head(timeout=600)


@dg.asset(deps=[squares])
def grown_squares(context: dg.AssetExecutionContext, compute: ComputeResource):
    session = compute.get_run_allocation_session(context)
    session.add_worker_allocation(SlurmWorkerAllocationConfig(partition="gpu-b", cpus_per_task=1))
    return compute.run(context=context, payload_path=PAYLOAD, args=["16", "--wait-cpus", "3"]).get_results()


compute = ComputeResource(
    mode="local",
    slurm=SlurmResource(queue=SlurmQueueConfig(time_limit="30", mem="1G")),
    default_launcher=RayLauncher(object_store_memory=100_000_000),
    ray_head_allocation=SlurmRunAllocationConfig(partition="cpu", cpus_per_task=1, mem="1G", time_limit="60"),
    run_allocation=SlurmRunAllocationConfig(partition="gpu-a", cpus_per_task=2, mem="2G"),
)

defs = dg.Definitions(
    assets=[squares, grown_squares],
    resources={"compute": compute},
    sensors=[build_orphan_sensor()],
    # One process runs the whole run, so the session ends with the run.
    executor=dg.in_process_executor,
)
