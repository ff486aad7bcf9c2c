"""The orphan sensor against a real Dagster instance, real runs and real local sessions."""

import dagster
import pytest

from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.dagster import build_orphan_sensor
from tests.dagster_helpers import session_root_fixture  # noqa: F401 - fixture "session_root"
from tests.helpers import wait_until

pytestmark = [pytest.mark.dagster, pytest.mark.ray, pytest.mark.timeout(240)]

HEAD = SlurmRunAllocationConfig(partition="cpu", cpus_per_task=1, mem="1G", time_limit="30")


@dagster.asset
def trivial():
    return 1


def ended_run(instance) -> str:
    result = dagster.materialize([trivial], instance=instance)
    assert result.success
    return result.run_id


def states(session: Session) -> dict[str, str]:
    return {job: info.state.value for job, info in session.query().items()}


def test_orphan_sensor_ends_a_dead_runs_jobs_and_spares_a_waiting_one(session_root):
    instance = dagster.DagsterInstance.ephemeral()
    launcher = RayLauncher(object_store_memory=100_000_000)
    dead_run, waiting_run = ended_run(instance), ended_run(instance)

    # The dead run left its head running.
    dead = Session.create(session_root / dead_run, head=HEAD, scheduler="local", launcher=launcher, supervise=False)
    # The other run's head ended while its worker allocation runs, waiting for a new head.
    waiting = Session.create(session_root / waiting_run, head=HEAD, scheduler="local", launcher=launcher,
                             supervise=False)
    worker = waiting.add_worker_allocation(SlurmWorkerAllocationConfig(partition="gpu-b", cpus_per_task=1))
    waiting.scheduler.cancel(waiting.record().head_job)
    wait_until(lambda: states(waiting) == {waiting.record().head_job: "CANCELLED", worker.job_id: "RUNNING"},
               timeout=60, message="head cancelled and worker running")
    wait_until(lambda: all(s in ("RUNNING", "PENDING") for s in states(dead).values()), timeout=30,
               message="the dead run's head is live")

    sensor = build_orphan_sensor(session_root=str(session_root))
    reason = sensor(dagster.build_sensor_context(instance=instance))
    assert isinstance(reason, dagster.SkipReason)
    assert dead_run in reason.skip_message and "tore down 1 session" in reason.skip_message
    assert "spared 1" in reason.skip_message and waiting_run in reason.skip_message

    wait_until(lambda: all(s in ("CANCELLED", "COMPLETED") for s in states(dead).values()), timeout=60,
               message="the dead run's jobs ended")
    assert states(waiting)[worker.job_id] == "RUNNING", "the waiting worker allocation was spared"
    # Once done, a torn-down session is not looked at again.
    again = sensor(dagster.build_sensor_context(instance=instance))
    assert "checked 1" in again.skip_message, again.skip_message
