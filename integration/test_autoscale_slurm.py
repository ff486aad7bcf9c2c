"""The autoscaler on the real Slurm lab: real sbatch/--test-only/squeue/scancel, real agents, real Ray.

The lab has cpu-1, cpu-2 (partition cpu), gpua-1 (gpu-a, 4 x a40) and gpub-1
(gpu-b, 2 x h100). Each session's head is a one-CPU allocation on cpu; this
process supervises the session, so the autoscaler runs here under the lease
unless a test says otherwise. Drivers run inside the head's job (``srun
--overlap``), where a run's payload runs. Every decision is read back from the
event log; every job this module submits of its own (the one holding gpu-a) is
cancelled by its id at the end, and every session is torn down.

Per change: the headline story (gpu-a held, GPU tasks go to gpu-b, idle drain
COMPLETED). The rest is ``slow`` (full tier); what covers each on every change
is in its docstring.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from elastic_ray import Session, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.autoscale import AutoscalePolicy, Pool
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.head.election import claimant_process
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind
from elastic_ray.scheduler.base import JobState
from integration.slurm_helpers import end_session
from tests.helpers import stays, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(480)]

REPO = Path(__file__).resolve().parents[1]
HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G", cpus_per_task=1)
CPU_POOL = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="1G", time_limit="30")
GPU_A = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, gpus_per_node=1, cpus_per_task=1, mem="1G",
                                    time_limit="30", ray_resources={"accelerator:a40": 1})
GPU_B = SlurmWorkerAllocationConfig(partition="gpu-b", num_nodes=1, gpus_per_node=2, cpus_per_task=2, mem="1G",
                                    time_limit="30")

GPU_TASKS = r'''
import time
import ray
ray.init(logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1)
def where():
    time.sleep(1)
    return ray.get_runtime_context().get_node_id()

print(sorted(set(ray.get([where.remote() for _ in range(4)], timeout=240))))
'''


@pytest.fixture
def make_session(slurm_lab, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_RAY_AUTOSCALE_INTERVAL", "1")
    base = REPO / ".lab" / "test-work" / "autoscale"
    base.mkdir(parents=True, exist_ok=True)
    made: list[Session] = []

    def make(**kwargs) -> Session:
        kwargs.setdefault("head", HEAD)
        # No warm standby: nothing here is about failover (and it would move with every new pool).
        kwargs.setdefault("launcher", RayLauncher(object_store_memory=100_000_000, standby_head=False))
        kwargs.setdefault("supervise", True)
        session = Session.create(base / uuid.uuid4().hex[:8], scheduler="slurm", **kwargs)
        made.append(session)
        return session

    yield make
    for session in made:
        end_session(session, timeout=120)


@pytest.fixture
def gpu_a_held(slurm_lab):
    """Every GPU of gpu-a held by a job of another name (30 minutes), running before the test goes on."""
    out = subprocess.run(["sbatch", "--parsable", "-J", f"someone-else-{uuid.uuid4().hex[:6]}", "-p", "gpu-a",
                          "--gres=gpu:4", "-c", "1", "--mem=256M", "-t", "30", "-o", "/dev/null",
                          "--wrap", "sleep 1800"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    try:
        wait_until(lambda: _squeue_state(job) == "RUNNING", timeout=60, message="the job holding gpu-a did not start")
        yield job
    finally:
        subprocess.run(["scancel", job], check=False, timeout=30)


def _squeue_state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def _decisions(session: Session, action: str) -> list:
    return [e for e in event_log.read(session.path).events
            if e.kind is EventKind.SCALER_DECISION and e.details.get("action") == action]


def _final(session: Session, job: str, timeout: float = 120):
    return wait_until(lambda: (i := session.job_info(job)) is not None and i.state.is_final and i, timeout=timeout,
                      message=f"job {job} did not end")


def _driver(session: Session, code: str, workdir: Path, *args: str, timeout: float = 300):
    """Run ``code`` as the run's payload (in the head's job); returns (returncode, stdout, stderr)."""
    out_path, err_path = workdir / f"driver-{uuid.uuid4().hex[:6]}.out", workdir / "driver.err"
    with out_path.open("w") as out, err_path.open("a") as err:
        result = session.run([sys.executable, "-c", code, *args], stdout=out, stderr=err).wait(timeout=timeout)
    return result.returncode, out_path.read_text(), err_path.read_text()[-3000:]


def test_gpu_tasks_go_to_the_gpu_partition_that_starts_now_and_idle_drains_it(make_session, gpu_a_held):
    session = make_session()
    session.wait_for_head(timeout=120)
    t0 = time.monotonic()
    session.autoscale(AutoscalePolicy(pools=[Pool(CPU_POOL), Pool(GPU_A), Pool(GPU_B)], idle_timeout=5,
                                      demand_delay=0.5, backlog=1))
    code, out, err = _driver(session, GPU_TASKS, session.path)
    assert code == 0, err
    t_ran = time.monotonic() - t0

    submits = _decisions(session, "submit")
    # gpu-b first. Its 2 GPUs are fewer than 4 tasks want, and gpu-b is at its backlog while that job
    # starts: the rest may be asked of gpu-a, Slurm's answer for it notwithstanding (the policy allows
    # submitting to a far-off pool too and keeping what starts first); that one must go once met.
    partitions = [e.details["partition"] for e in submits]
    assert partitions[0] == "gpu-b" and set(partitions[1:]) <= {"gpu-a"} and len(partitions) <= 2, \
        [e.reason for e in submits]
    job, reason = submits[0].job, submits[0].reason
    assert re.match(r"\d x \{CPU: 1, GPU: 1\} pending", reason), reason
    # Slurm's own --test-only answers: gpu-b now, gpu-a when the job holding it ends (its 30 minutes).
    assert "gpu-b starts now" in reason and re.search(r"gpu-a in ~(2[89]|30) min", reason), reason
    ran_on = ast.literal_eval(out.strip().splitlines()[-1])
    assert ran_on == [s.node_id for s in session.node_states(job).values()], "every task ran on gpu-b's node"
    assert [s for s in session.node_states(job)] == ["gpub-1"]

    queued = [e.job for e in submits[1:]]
    if queued:
        cancel = wait_until(lambda: _decisions(session, "cancel"), timeout=60,
                            message="the queued gpu-a job was not cancelled once the demand was met")
        assert [e.job for e in cancel] == queued and "not needed for" in cancel[0].reason, cancel[0].reason
        assert _final(session, queued[0], 60).state is JobState.CANCELLED
    drain = wait_until(lambda: _decisions(session, "drain"), timeout=90, message="the idle allocation was not drained")
    assert drain[0].job == job and "idle" in drain[0].reason, drain[0].reason
    assert _final(session, job).state is JobState.COMPLETED
    t_done = time.monotonic() - t0
    assert len(_decisions(session, "submit")) == len(submits), "nothing more was submitted"
    assert [e.job for e in _decisions(session, "cancel")] == queued
    assert _squeue_state(gpu_a_held) == "RUNNING", "the other user's job is untouched"
    session.autoscale(None)
    print(f"\n[lab] policy set -> 4 GPU tasks done {t_ran:.1f} s; -> gpu-b allocation COMPLETED {t_done:.1f} s")
    for e in submits + _decisions(session, "cancel") + drain:
        print(f"[lab] {e.details['action']} job {e.job}: {e.reason}")


LEAVER = r'''
import pathlib, sys, time
import ray
ray.init(logging_level="ERROR", log_to_driver=False)
waiting = [ray.remote(num_gpus=1, resources={"accelerator:a40": 1})(lambda: 1).remote() for _ in range(2)]
marker, deadline = pathlib.Path(sys.argv[1]), time.time() + 180
while not marker.exists() and time.time() < deadline:
    time.sleep(0.2)
'''


@pytest.mark.slow
def test_a_queued_gpu_a_submission_is_cancelled_once_its_demand_is_gone(make_session, gpu_a_held):
    """Full tier. Per change: the same decision by table (tests/test_autoscale_decide.py) and for real on
    the local scheduler (tests/test_autoscale_local.py::test_a_queued_submission_no_longer_needed_is_cancelled)."""
    session = make_session()
    session.wait_for_head(timeout=120)
    session.autoscale(AutoscalePolicy(pools=[Pool(GPU_A), Pool(GPU_B)], demand_delay=0.5, cancel_delay=2))
    marker = session.path / "leave"
    err_path = session.path / "leaver.err"
    with err_path.open("w") as err:
        run = session.run([sys.executable, "-c", LEAVER, str(marker)], stderr=err)
        submitted = wait_until(lambda: _decisions(session, "submit"), timeout=90, message="nothing was submitted")
        marker.touch()
        assert run.wait(timeout=120).returncode == 0, err_path.read_text()[-2000:]
    job = submitted[0].job
    assert submitted[0].details["partition"] == "gpu-a", "an a40 request never goes to gpu-b"
    assert _squeue_state(job) == "PENDING"
    cancel = wait_until(lambda: _decisions(session, "cancel"), timeout=90, message="the queued job was not cancelled")
    assert cancel[0].job == job and "not needed for" in cancel[0].reason
    assert _final(session, job, 60).state is JobState.CANCELLED


REQUEST = r'''
import sys
import ray
from ray.autoscaler.sdk import request_resources
ray.init(logging_level="ERROR", log_to_driver=False)
request_resources(bundles=[{"CPU": 1}] * int(sys.argv[1]))
'''


@pytest.mark.slow
def test_request_resources_grows_with_no_task_and_clearing_it_shrinks_to_the_minimum(make_session):
    """Full tier. Per change: tests/test_autoscale_local.py's request_resources test (same real Ray, the
    local scheduler), the reading from a real GCS in tests/test_autoscale_demand_ray.py."""
    session = make_session()
    session.wait_for_head(timeout=120)
    session.autoscale(AutoscalePolicy(pools=[Pool(CPU_POOL, max_allocations=3)], min_allocations=1,
                                      idle_timeout=3, demand_delay=0.5, backlog=2))
    floor = wait_until(lambda: _decisions(session, "submit"), timeout=60, message="min_allocations was not kept")
    session.wait_for_worker_allocation(floor[0].job, timeout=120)
    assert _driver(session, REQUEST, session.path, "4")[0] == 0
    # The head's CPU and the floor's: 4 bundles of one CPU need two more one-CPU allocations.
    grown = wait_until(lambda: len(s := _decisions(session, "submit")) >= 3 and s, timeout=90,
                       message="request_resources did not grow the run")
    assert "requested {CPU: 1}" in grown[1].reason, grown[1].reason
    for e in grown[1:]:
        session.wait_for_worker_allocation(e.job, timeout=150)
    stays(lambda: not _decisions(session, "drain"), 5.0, message="capacity request_resources asks for was drained")
    assert _driver(session, REQUEST, session.path, "0")[0] == 0
    drained = wait_until(lambda: len(d := _decisions(session, "drain")) >= 2 and d, timeout=120,
                         message="the cluster did not shrink after the request was cleared")
    ours = {e.job for e in grown[:3]}
    assert len({e.job for e in drained}) == 2 and {e.job for e in drained} < ours, [e.reason for e in drained]
    for e in drained:
        assert _final(session, e.job).state is JobState.COMPLETED
    # Back to min_allocations: whichever one it kept stays, idle or not.
    stays(lambda: len(_decisions(session, "drain")) == 2, 6.0, message="drained below min_allocations")
    (kept,) = ours - {e.job for e in drained}
    assert _squeue_state(kept) == "RUNNING"


GANG = r'''
import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy as InGroup
ray.init(logging_level="ERROR", log_to_driver=False)
group = placement_group([{"GPU": 1}] * 2, strategy="STRICT_SPREAD")
ray.get(group.ready(), timeout=240)
where = ray.remote(num_gpus=1, num_cpus=0)(lambda: ray.get_runtime_context().get_node_id())
print(sorted(ray.get([where.options(scheduling_strategy=InGroup(group, placement_group_bundle_index=i)).remote()
                      for i in range(2)])))
'''


@pytest.mark.slow
def test_a_placement_group_over_two_nodes_gets_both_at_once(make_session):
    """Full tier. Per change: the gang decision by table (tests/test_autoscale_decide.py) and the group
    read from a real head (tests/test_autoscale_demand_ray.py)."""
    session = make_session()
    session.wait_for_head(timeout=120)
    one_gpu = SlurmWorkerAllocationConfig(partition="gpu-b", num_nodes=1, gpus_per_node=1, cpus_per_task=1,
                                          mem="1G", time_limit="30")
    session.autoscale(AutoscalePolicy(pools=[Pool(one_gpu, max_allocations=2)], backlog=2, demand_delay=0.5))
    code, out, err = _driver(session, GANG, session.path)
    assert code == 0, err
    submits = _decisions(session, "submit")
    assert len(submits) == 2 and abs(submits[0].at - submits[1].at) < 1.5, [e.reason for e in submits]
    assert "placement group" in submits[0].reason and "(1 of 2)" in submits[0].reason, submits[0].reason
    ran_on = ast.literal_eval(out.strip().splitlines()[-1])
    assert ran_on == sorted(s.node_id for e in submits for s in session.node_states(e.job).values())


HOLDER = r'''
import sys, time
from elastic_ray.coordinator.session import Session
s = Session.open(sys.argv[1], supervise=True)
print("open", flush=True)
time.sleep(900)
'''


def _lease_pid(session: Session) -> int | None:
    lease = session.dir.read_allocation().autoscaler
    who = None if lease is None or not lease.is_live(time.time()) else claimant_process(lease.claimant)
    return None if who is None else who[1]


@pytest.mark.slow
def test_the_autoscaler_s_process_killed_mid_run_another_takes_over(make_session):
    """Full tier. Per change: the takeover by tests/test_autoscale_lease_local.py (real processes, one lease)
    and the scaling by the local tests; here both at once on the lab."""
    session = make_session(supervise=False)
    session.wait_for_head(timeout=120)
    env = dict(os.environ, ELASTIC_RAY_AUTOSCALE_INTERVAL="1")
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(session.path)], stdout=subprocess.PIPE, text=True,
                              env=env, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "open"
        session.autoscale(AutoscalePolicy(pools=[Pool(GPU_B)], idle_timeout=5, demand_delay=0.5))
        wait_until(lambda: _lease_pid(session) == holder.pid, timeout=30, message="the other process took no lease")
        err_path = session.path / "driver.err"
        with err_path.open("w") as err:
            run = session.run([sys.executable, "-c", GPU_TASKS], stderr=err, stdout=subprocess.DEVNULL)
            submitted = wait_until(lambda: _decisions(session, "submit"), timeout=90, message="nothing was submitted")
            os.kill(holder.pid, signal.SIGKILL)
            holder.wait(timeout=10)
            t_killed = time.monotonic()
            # This process takes the lease over (a dead holder on this host is seen gone at once).
            mine = Session.open(session.path, supervise=True)
            try:
                wait_until(lambda: _lease_pid(session) == os.getpid(), timeout=60,
                           message="nobody took the lease over")
                t_taken = time.monotonic() - t_killed
                assert run.wait(timeout=240).returncode == 0, err_path.read_text()[-2000:]
                job = submitted[0].job
                drain = wait_until(lambda: _decisions(session, "drain"), timeout=90,
                                   message="the new holder did not shrink the run")
                assert drain[0].job == job and _final(session, job).state is JobState.COMPLETED
                assert len(_decisions(session, "submit")) == 1, "the new holder did not submit the same demand again"
                print(f"\n[lab] lease taken over {t_taken:.1f} s after the holder was killed")
            finally:
                mine.close()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


BUSY = r'''
import time
import ray
ray.init(logging_level="ERROR", log_to_driver=False)
ray.get(ray.remote(num_cpus=1)(lambda: time.sleep(40)).remote())
'''


@pytest.mark.slow
def test_a_busy_allocation_near_its_walltime_is_replaced_before_it_drains(make_session):
    """Full tier. Per change: the walltime decision by table (tests/test_autoscale_decide.py)."""
    session = make_session()
    session.wait_for_head(timeout=120)
    short = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1, cpus_per_task=1, mem="1G", time_limit="2")
    session.autoscale(AutoscalePolicy(pools=[Pool(short, max_allocations=2)], min_allocations=1,
                                      replace_before_walltime=100, idle_timeout=600, demand_delay=0.5))
    floor = wait_until(lambda: _decisions(session, "submit"), timeout=60, message="min_allocations was not kept")
    first = floor[0].job
    session.wait_for_worker_allocation(first, timeout=120)
    err_path = session.path / "driver.err"
    with err_path.open("w") as err:
        run = session.run([sys.executable, "-c", BUSY], stderr=err)
        again = wait_until(lambda: len(s := _decisions(session, "submit")) > 1 and s, timeout=90,
                           message="no replacement was submitted before the walltime")
        assert _squeue_state(first) == "RUNNING", "replaced ahead of its end, not after"
        assert run.wait(timeout=150).returncode == 0, err_path.read_text()[-2000:]
    replacement = again[1]
    assert replacement.details["replaces"] == first and f"job {first} is busy and ends in" in replacement.reason
    session.wait_for_worker_allocation(replacement.job, timeout=120)


DATA = r'''
import json, time
import ray
from ray.data import ActorPoolStrategy
ray.init(logging_level="ERROR", log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False

class Slow:
    def __call__(self, batch):
        time.sleep(1.5)   # long enough a pipeline (48 batches) for the pool to grow while it runs
        batch["node"] = [ray.get_runtime_context().get_node_id()] * len(batch["id"])
        return batch

rows = ray.data.range(240, override_num_blocks=48).map_batches(
    Slow, compute=ActorPoolStrategy(min_size=1, max_size=4), num_cpus=1, batch_size=5).take_all()
print(json.dumps({"rows": sorted(r["id"] for r in rows), "nodes": sorted({r["node"] for r in rows})}))
'''


@pytest.mark.slow
def test_a_ray_data_actor_pool_grows_onto_new_allocations_and_finishes(make_session):
    """A Ray Data pipeline whose actor pool may hold 1 to 4 actors of one CPU, on a head of one CPU:
    the actors it wants beyond the head (pending actors, and Ray Data's own ``request_resources``)
    grow the run onto the cpu pool, the pipeline finishes with every row, and the allocations are
    drained once idle. Full tier (Ray Data on the lab takes a while). Per change: the same two kinds of
    demand, pending actors and requested bundles, by table (tests/test_autoscale_demand.py, _decide.py)
    and request_resources for real (tests/test_autoscale_local.py)."""
    import json

    session = make_session()
    session.wait_for_head(timeout=120)
    session.autoscale(AutoscalePolicy(pools=[Pool(CPU_POOL, max_allocations=3)], idle_timeout=5, backlog=2))
    code, out, err = _driver(session, DATA, session.path, timeout=400)
    assert code == 0, err
    done = json.loads(out.strip().splitlines()[-1])
    assert done["rows"] == list(range(240)), "every row once"
    submits = _decisions(session, "submit")
    assert submits and all(e.details["partition"] == "cpu" for e in submits), [e.reason for e in submits]
    grown = {s.node_id for e in submits for s in session.node_states(e.job).values()}
    assert len(set(done["nodes"]) & grown) >= 2, "the pool grew: its actors ran on several added allocations"
    for e in submits:
        assert _final(session, e.job, 150).state is JobState.COMPLETED
    print(f"\n[lab] Ray Data: {len(submits)} allocations added, batches ran on {len(done['nodes'])} nodes")
    for e in submits:
        print(f"[lab] submit job {e.job}: {e.reason}")
