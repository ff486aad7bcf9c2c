"""A Dagster job for the retried-run test, defined where Dagster can find it again.

The test runs the job's first run in a separate process and kills it, then
re-executes it from the test process against the same persistent instance,
as a user retrying a run from the UI would. Dagster rebuilds the job in each
process from its module path (``reconstructable``), so it lives here at
module level, not inside the test. (No ``from __future__ import
annotations``: Dagster reads the asset's config type from its annotation.)

The asset is the seed's failover loop around the committing Pipes payload;
the payload is started through ``dagster_retry_payload.py``, which first
writes the driver's pid so the test can end the killed run's driver.
"""

from pathlib import Path

import dagster

from elastic_ray.dagster import (
    ComputeResource,
    RayLauncher,
    SlurmAllocationEnded,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
)

PAYLOAD = str(Path(__file__).with_name("dagster_retry_payload.py"))
JOB_NAME = "retry_job"
# Log lines the test reads back from the run's event log.
HEAD_AT_OPEN = "head when the session was opened: "
FAILOVER = "launch failed over from head "


class RetryConfig(dagster.Config):
    """Where the payload commits its units, how many, and where drivers write their pids."""

    commits: str
    total: int
    pids: str


@dagster.asset
def retried(context: dagster.AssetExecutionContext, config: RetryConfig, compute: ComputeResource):
    # A retried run's head is healed when the session is opened (first line);
    # the loop is the one every asset that survives failovers has anyway.
    session = compute.get_run_allocation_session(context)
    context.log.info(f"{HEAD_AT_OPEN}{session.session.record().head_job}")
    while True:
        try:
            return compute.run(context=context, payload_path=PAYLOAD,
                               args=[config.pids, config.commits, str(config.total)]).get_results()
        except SlurmAllocationEnded as ended:
            context.log.info(f"{FAILOVER}{ended.job_id} ({ended.allocation_state})")
            session.replace_head(timeout=180)


def compute_resource() -> ComputeResource:
    """The CPU-head layout on the local scheduler: a head-only allocation in
    ``cpu``, the run's first worker allocation in ``gpu-a``. The session root
    comes from ``$ELASTIC_RAY_SESSION_ROOT``, which the test sets for both
    processes."""
    return ComputeResource(
        mode="local",
        slurm=SlurmResource(queue=SlurmQueueConfig(time_limit="30", mem="1G")),
        default_launcher=RayLauncher(object_store_memory=100_000_000),
        ray_head_allocation=SlurmRunAllocationConfig(partition="cpu", cpus_per_task=1, mem="1G", time_limit="30"),
        run_allocation=SlurmRunAllocationConfig(partition="gpu-a", cpus_per_task=2, mem="2G"),
    )


defs = dagster.Definitions(
    assets=[retried],
    jobs=[dagster.define_asset_job(JOB_NAME, selection=[retried], executor_def=dagster.in_process_executor)],
    resources={"compute": compute_resource()},
)


def define_retry_job() -> dagster.JobDefinition:
    """The job, for ``dagster.reconstructable`` (the in-process executor: the
    run's one process owns the session and tears it down at the run's end)."""
    return defs.resolve_job_def(JOB_NAME)
