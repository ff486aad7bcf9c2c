"""The autoscaler for real on the local scheduler: real agents, real Ray, real demand.

A separate head (no CPUs, no GPUs) and no worker; gpu-a is held by another job (a
``sleep`` of another name, 30 minutes). A driver asks for two tasks of ``{"GPU": 1}``.

* The policy offers a CPU pool, gpu-a and gpu-b, in that order: the autoscaler, run by
  this process's supervisor under the lease, must submit to gpu-b (the CPU pool cannot
  hold a GPU task; gpu-a can, but the scheduler's ``test_only`` says it starts in
  half an hour), the tasks must run there, and once the allocation sat idle for
  ``idle_timeout`` it must be drained and end COMPLETED.
* With gpu-a alone, the submission queues; the driver goes away (its tasks with it),
  and ``cancel_delay`` later the queued job is cancelled.

Every step is read back from the event log and ``session status``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import time

import psutil
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
from elastic_ray.scheduler.base import JobSpec, JobState
from tests.helpers import stays, wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G")
CPU_POOL = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=2, mem="2G", time_limit="30")
GPU_A = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, gpus_per_node=1, cpus_per_task=2, mem="2G",
                                    time_limit="30")
GPU_B = SlurmWorkerAllocationConfig(partition="gpu-b", num_nodes=1, gpus_per_node=2, cpus_per_task=2, mem="2G",
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


@pytest.fixture
def session(tmp_path, monkeypatch, request):
    """A session on the local scheduler, supervised by this process, with gpu-a held by another job.
    The autoscaler's turn comes every second, or every ``request.param`` seconds (indirect)."""
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("ELASTIC_RAY_AUTOSCALE_INTERVAL", str(getattr(request, "param", 1)))
    monkeypatch.setenv("ELASTIC_RAY_AUTOSCALE_DEMAND_POLL", "0.5")
    # No warm standby: nothing here is about failover, and its start would compete with the timed drains.
    made = Session.create(tmp_path / "s", scheduler="local", head=HEAD, supervise=True,
                          launcher=RayLauncher(object_store_memory=100_000_000, standby_head=False))
    other = made.scheduler.submit(JobSpec(
        job_name="someone-else", role="worker", node_argv=("sleep", "1800"), workdir=tmp_path,
        allocation=SlurmRunAllocationConfig(partition="gpu-a", gpus_per_node=4, cpus_per_task=1, mem="1G",
                                            time_limit="30"), output=str(tmp_path / "other-%j.out")))
    try:
        yield made
    finally:
        made.scheduler.cancel(other)
        made.teardown()
        wait_until(lambda: all(i.state.is_final for i in made.query().values())
                   and made.scheduler.query("someone-else", [other])[other].state.is_final, timeout=60,
                   message="the jobs did not end after teardown")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _decisions(session: Session, action: str) -> list:
    return [e for e in event_log.read(session.path).events
            if e.kind is EventKind.SCALER_DECISION and e.details.get("action") == action]


@pytest.mark.parametrize("session", [300], indirect=True)
def test_pending_gpu_tasks_grow_the_pool_that_starts_first_then_idle_drains_it(session, tmp_path):
    """A turn only every 300 s here: the policy being set, the demand showing, its ``demand_delay`` and
    the node's ``idle_timeout`` running out, and the policy stopping must each be acted on at once (the
    quick look every 0.5 s, the decision's ``wake_at``), never a turn later."""
    session.wait_for_head(timeout=90)
    t0 = time.monotonic()
    set_at = time.time()
    session.autoscale(AutoscalePolicy(pools=[Pool(CPU_POOL, max_allocations=2), Pool(GPU_A), Pool(GPU_B)],
                                      idle_timeout=3, demand_delay=0.5, backlog=1))
    with (tmp_path / "driver.out").open("w") as out, (tmp_path / "driver.err").open("w") as err:
        result = session.run([sys.executable, "-c", DRIVER], stdout=out, stderr=err).wait(timeout=150)
    assert result.returncode == 0, (tmp_path / "driver.err").read_text()[-2000:]
    t_ran = time.monotonic() - t0

    submits = _decisions(session, "submit")
    assert [(e.details["partition"], e.details["pool"]) for e in submits] == [("gpu-b", 2)], submits
    job = submits[0].job
    assert submits[0].at - set_at < 30, "the policy and the demand were acted on at once, not a turn later"
    assert submits[0].reason.startswith("2 x {CPU: 1, GPU: 1} pending"), submits[0].reason
    reason = submits[0].reason
    assert "gpu-b starts now" in reason and re.search(r"gpu-a in ~(29|30) min", reason), reason
    assert reason.endswith("submitted gpu-b"), reason
    # The tasks ran on the node of that allocation: the one Ray node the driver printed is its node.
    ran_on = ast.literal_eval((tmp_path / "driver.out").read_text().strip().splitlines()[-1])
    assert ran_on == [s.node_id for s in session.node_states(job).values()]

    # No demand now: idle_timeout later it is drained through its agents and ends COMPLETED.
    done_at = time.time()
    wait_until(lambda: _decisions(session, "drain"), timeout=60, message="the idle allocation was not drained")
    drain = _decisions(session, "drain")[0]
    assert drain.job == job and "idle" in drain.reason
    assert drain.at - done_at < 3 + 20, "drained when idle_timeout ran out (wake_at), not a turn later"
    final = wait_until(lambda: (i := session.job_info(job)) is not None and i.state.is_final and i, timeout=60,
                       message="the drained allocation did not end")
    assert final.state is JobState.COMPLETED
    t_done = time.monotonic() - t0
    lease_events = [e for e in event_log.read(session.path).events if e.kind is EventKind.AUTOSCALE_LEASE]
    # Taken once and kept: renewed on time with no turn due for minutes (a lapse would show a second "taken").
    assert [e.reason for e in lease_events] == ["taken"], lease_events
    state = store.read_state(session.path)
    assert state is not None and not state.error
    assert job not in state.jobs or state.jobs[job].ending, "marked ending, and forgotten once it ended"
    assert len(_decisions(session, "submit")) == 1, "nothing more was submitted"
    # `session status --json` shows the autoscaler: on, run by this process, the job it drained.
    shown = json.loads(CliRunner().invoke(main, ["session", "status", "--json", str(session.path)]).stdout)
    scale = shown["autoscale"]
    assert scale["on"] and scale["holder"].split(":")[1] == str(os.getpid())
    assert [r["action"] for r in scale["recent"]] == ["submit", "drain"]
    table = CliRunner().invoke(main, ["session", "status", str(session.path)]).stdout
    assert "autoscaler: on (3 pools: cpu, gpu-a, gpu-b)" in table and "idle" in table, table
    # One probe process served every turn; stopping the policy gives the lease back and ends it.
    scaler = session.supervisor.autoscaler
    probe = scaler.demand.pid
    assert scaler.demand.starts == 1 and probe is not None and psutil.pid_exists(probe)
    session.autoscale(None)
    wait_until(lambda: not scaler.held and not _running(probe), timeout=30,
               message="the lease was kept or the probe left running after the policy stopped")
    print(f"\npolicy set -> tasks done {t_ran:.1f} s; -> allocation COMPLETED {t_done:.1f} s")


def test_a_pool_the_scheduler_refuses_is_held_back_and_status_says_why(session):
    """A pool on a partition that does not exist: the local scheduler refuses its submission at once, as
    sbatch does. The refusal is one event; the runner holds the pool back (SUBMIT_RETRY, a minute) rather
    than submitting again every turn, and the status shows the scheduler's words while it waits."""
    session.wait_for_head(timeout=90)
    nowhere = SlurmWorkerAllocationConfig(partition="nowhere", num_nodes=1, cpus_per_task=1, mem="1G",
                                          time_limit="30")
    before = session.scheduler.calls["submit"]
    session.autoscale(AutoscalePolicy(pools=[Pool(nowhere)], min_allocations=1))
    refused = wait_until(lambda: _decisions(session, "submit_failed"), timeout=60, message="no refusal recorded")
    assert refused[0].reason.startswith("submit to nowhere refused: "), refused[0].reason
    assert "invalid partition name specified: nowhere" in refused[0].reason
    assert refused[0].reason.endswith("that pool is held back 60 s")
    held = wait_until(lambda: "held back" in ((s := store.read_state(session.path)) and s.error or "") and s,
                      timeout=30, message="the next turn did not say the pool is held back")
    assert held.error.startswith("submit to nowhere held back ") and "invalid partition name" in held.error
    # Every turn (1 s) still decides to submit for min_allocations; none of them reaches the scheduler.
    stays(lambda: session.scheduler.calls["submit"] == before + 1, 3.0,
          message="the refused pool was submitted to again within its minute")
    assert len(_decisions(session, "submit_failed")) == 1 and not _decisions(session, "submit")
    shown = json.loads(CliRunner().invoke(main, ["session", "status", "--json", str(session.path)]).stdout)
    assert "held back" in shown["autoscale"]["error"] and "nowhere" in shown["autoscale"]["error"]
    session.autoscale(None)


LEAVER = r'''
import time
import ray
ray.init(logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1)
def never():
    return 1

waiting = [never.remote() for _ in range(2)]
marker, deadline = __import__("pathlib").Path(__import__("sys").argv[1]), time.time() + 120
while not marker.exists() and time.time() < deadline:   # the test says when the submission was made
    time.sleep(0.2)
# then leave: Ray drops the driver's pending tasks
'''


def test_a_queued_submission_no_longer_needed_is_cancelled(session, tmp_path):
    session.wait_for_head(timeout=90)
    session.autoscale(AutoscalePolicy(pools=[Pool(GPU_A)], demand_delay=0.5, cancel_delay=1))
    t0 = time.monotonic()
    marker = tmp_path / "leave"
    with (tmp_path / "driver.err").open("w") as err:
        run = session.run([sys.executable, "-c", LEAVER, str(marker)], stderr=err)
        submitted = wait_until(lambda: _decisions(session, "submit"), timeout=60,
                               message="nothing was submitted for the pending tasks")
        job = submitted[0].job
        # While the tasks still wait: gpu-a is held, the submission waits in the queue. (Asked after
        # the driver's exit this raced: a driver slow to exit had dropped its tasks over 1 s before,
        # and the cancel had come; CI streak run 7.)
        assert session.job_info(job).state is JobState.PENDING, "gpu-a is held: the submission waits in the queue"
        marker.touch()
        assert run.wait(timeout=60).returncode == 0
    assert submitted[0].details["partition"] == "gpu-a" and re.search(r"gpu-a in ~(29|30) min", submitted[0].reason)
    cancel = wait_until(lambda: _decisions(session, "cancel"), timeout=60, message="the queued job was not cancelled")
    assert cancel[0].job == job and "not needed for" in cancel[0].reason
    final = wait_until(lambda: (i := session.job_info(job)) is not None and i.state.is_final and i, timeout=30,
                       message="the cancelled job did not end")
    assert final.state is JobState.CANCELLED and len(_decisions(session, "submit")) == 1
    print(f"\npolicy set -> queued job cancelled {time.monotonic() - t0:.1f} s")


REQUEST = r'''
import sys
import ray
from ray.autoscaler.sdk import request_resources
ray.init(logging_level="ERROR", log_to_driver=False)
request_resources(bundles=[{"CPU": 1}] * int(sys.argv[1]))   # kept by Ray until the next call, driver gone or not
'''


def test_request_resources_grows_the_run_with_no_task_and_clearing_it_shrinks_it(session, tmp_path):
    session.wait_for_head(timeout=90)
    session.autoscale(AutoscalePolicy(pools=[Pool(CPU_POOL, max_allocations=2)], idle_timeout=2, demand_delay=0.5))
    t0 = time.monotonic()
    assert session.run([sys.executable, "-c", REQUEST, "2"]).wait(timeout=60).returncode == 0
    submitted = wait_until(lambda: _decisions(session, "submit"), timeout=60, message="nothing was submitted")
    assert "2 x requested {CPU: 1}" in submitted[0].reason, submitted[0].reason
    job = submitted[0].job
    session.wait_for_worker_allocation(job, timeout=60)
    # Idle, but request_resources still wants its CPUs: kept past idle_timeout, nothing more submitted.
    stays(lambda: not _decisions(session, "drain") and len(_decisions(session, "submit")) == 1, 4.0,
          message="an allocation request_resources needs was drained, or a second one submitted")
    assert session.run([sys.executable, "-c", REQUEST, "0"]).wait(timeout=60).returncode == 0
    drain = wait_until(lambda: _decisions(session, "drain"), timeout=60, message="nothing was drained after the clear")
    assert drain[0].job == job
    final = wait_until(lambda: (i := session.job_info(job)) is not None and i.state.is_final and i, timeout=60,
                       message="the drained allocation did not end")
    assert final.state is JobState.COMPLETED
    print(f"\nrequest -> allocation up, cleared -> COMPLETED {time.monotonic() - t0:.1f} s")


@pytest.mark.slow
def test_scaling_goes_on_after_the_head_moves(session, tmp_path):
    """The head moves onto the autoscaler's own allocation; the autoscaler then reads the new head's demand.

    Slow (full tier): it runs a head move end to end, which ``test_coordinator_local.py``'s failover
    test runs on every change; the loop reading whichever head ``ray_head`` names is run on every
    change by the tests above (each turn reads the pointer afresh).
    """
    session.wait_for_head(timeout=90)
    session.autoscale(AutoscalePolicy(pools=[Pool(CPU_POOL), Pool(GPU_B)], min_allocations=1, idle_timeout=600,
                                      demand_delay=0.5))
    floor = wait_until(lambda: _decisions(session, "submit"), timeout=60, message="min_allocations was not kept")
    assert floor[0].details["partition"] == "cpu" and "below min_allocations=1" in floor[0].reason
    session.wait_for_worker_allocation(floor[0].job, timeout=90)
    old = session.record().head_job
    session.scheduler.cancel(old)
    head = session.replace_head(timeout=150)
    assert head.job_id == floor[0].job, "the head moved onto the autoscaler's allocation"

    with (tmp_path / "driver.err").open("w") as err:
        result = session.run([sys.executable, "-c", DRIVER], stderr=err, head=head).wait(timeout=150)
    assert result.returncode == 0, (tmp_path / "driver.err").read_text()[-2000:]
    submits = _decisions(session, "submit")
    assert [e.details["partition"] for e in submits] == ["cpu", "gpu-b"], submits
    assert not _decisions(session, "drain"), "the allocation hosting the head is not drained while busy or needed"


GANG = r'''
import ray
from ray.util.placement_group import placement_group
ray.init(logging_level="ERROR", log_to_driver=False)
group = placement_group([{"GPU": 1}] * 2, strategy="STRICT_SPREAD")   # two nodes at once, or nothing
ray.get(group.ready(), timeout=150)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as InGroup
where = ray.remote(num_gpus=1, num_cpus=0)(lambda: ray.get_runtime_context().get_node_id())
print(sorted(ray.get([where.options(scheduling_strategy=InGroup(group, placement_group_bundle_index=i)).remote()
                      for i in range(2)])))
'''


@pytest.mark.slow
def test_a_placement_group_that_needs_two_nodes_gets_both(session, tmp_path):
    """A STRICT_SPREAD group of two one-GPU bundles, a pool of one-GPU nodes: both allocations are
    submitted in one decision (the group is served whole or not at all), and the group is placed.

    Slow (full tier): the loop against the same real parts runs on every change in the tests above;
    a gang's decision is in ``tests/test_autoscale_decide.py``'s tables and its reading from a real
    head in ``tests/test_autoscale_demand_ray.py``, both on every change.
    """
    session.wait_for_head(timeout=90)
    one_gpu = SlurmWorkerAllocationConfig(partition="gpu-b", num_nodes=1, gpus_per_node=1, cpus_per_task=1,
                                          mem="1G", time_limit="30")
    session.autoscale(AutoscalePolicy(pools=[Pool(one_gpu, max_allocations=2)], backlog=2, demand_delay=0.5))
    with (tmp_path / "driver.out").open("w") as out, (tmp_path / "driver.err").open("w") as err:
        result = session.run([sys.executable, "-c", GANG], stdout=out, stderr=err).wait(timeout=180)
    assert result.returncode == 0, (tmp_path / "driver.err").read_text()[-2000:]
    submits = _decisions(session, "submit")
    assert len(submits) == 2 and abs(submits[0].at - submits[1].at) < 1.0, submits
    assert "placement group" in submits[0].reason and "(1 of 2)" in submits[0].reason, submits[0].reason
    ran_on = ast.literal_eval((tmp_path / "driver.out").read_text().strip().splitlines()[-1])
    assert ran_on == sorted(s.node_id for e in submits for s in session.node_states(e.job).values())


BUSY = r'''
import time
import ray
ray.init(logging_level="ERROR", log_to_driver=False)
ray.get(ray.remote(num_cpus=1)(lambda: time.sleep(25)).remote())   # keeps the allocation busy
'''


@pytest.mark.slow
def test_a_busy_allocation_near_its_walltime_gets_a_replacement(session, tmp_path):
    """A one-minute allocation kept busy: ``replace_before_walltime`` ahead of its end a replacement
    of its pool is submitted (named as replacing it), before the first one drains at its signal.

    Slow (full tier): the loop against the same real parts runs on every change in the tests above;
    the walltime decision is in ``tests/test_autoscale_decide.py``'s tables, on every change.
    """
    session.wait_for_head(timeout=90)
    short = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="1G", time_limit="1")
    session.autoscale(AutoscalePolicy(pools=[Pool(short, max_allocations=2)], min_allocations=1,
                                      replace_before_walltime=50, idle_timeout=600, demand_delay=0.5))
    floor = wait_until(lambda: _decisions(session, "submit"), timeout=60, message="min_allocations was not kept")
    first = floor[0].job
    session.wait_for_worker_allocation(first, timeout=90)
    with (tmp_path / "driver.err").open("w") as err:
        run = session.run([sys.executable, "-c", BUSY], stderr=err)
        again = wait_until(lambda: len(_decisions(session, "submit")) > 1 and _decisions(session, "submit"),
                           timeout=60, message="no replacement was submitted before the walltime")
        info = session.job_info(first)
        assert info is not None and info.state is JobState.RUNNING, "replaced ahead of its end, not after"
        assert run.wait(timeout=90).returncode == 0
    replacement = again[1]
    assert replacement.details["replaces"] == first and f"job {first} is busy and ends in" in replacement.reason
