"""The SSH mode on the real Slurm lab: a client that reaches the cluster only over SSH.

A real OpenSSH server (``lab_sshd``: Debian's sshd on 127.0.0.1, its own keys
and config, remote commands see the lab's SLURM_CONF) stands for the
cluster's login host. The client side uses only ``RemoteSession`` (and the
Dagster resources in SSH mode): every call is an ``ssh`` command. The test
itself plays the cluster's failures from inside (``scancel``) and checks the
cluster side directly (commit files, the ``ray_head`` pointer, PIDs).

Shown here: the seed's failover loop driven from outside (head cancelled
mid-payload, every unit committed exactly once), the outside process killed
and restarted mid-run (the cluster-side supervisor elects meanwhile with no
client at all), and a Dagster materialization in SSH mode with the head
cancelled under it.
"""


import dataclasses
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import dagster
import pytest

import elastic_ray.demo.pipes_payload as pipes_payload_module
from elastic_ray import SlurmAllocationEnded, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.dagster import ComputeResource, SlurmQueueConfig, SlurmResource, SSHConnectionResource
from elastic_ray.dagster import RayLauncher as DagsterRayLauncher
from elastic_ray.dagster import SlurmRunAllocationConfig as DagsterRunAllocation
from elastic_ray.protocol.disk.records import AgentState
from elastic_ray.remote import RemoteSession
from elastic_ray.coordinator.detached import running_pid
from integration.slurm_helpers import end_session, squeue_ids
from tests.helpers import committed_units, wait_until
from tests.remote_helpers import REMOTE_PYTHON, process_alive as alive, target_of

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="1G", cpus_per_task=1)
WORKER = SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=2, mem="1G", time_limit="20")
LAUNCHER = RayLauncher(object_store_memory=100_000_000)
PAYLOAD = "elastic_ray.demo.payload"


def end_remote_session(path: Path) -> None:
    """From inside: stop the session's cluster-side supervisor by its PID, then cancel its jobs."""
    if not (path / "session.json").is_file():
        return
    pid = running_pid(path)
    if pid and pid > 0 and alive(pid):
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not alive(pid), timeout=60, message=f"supervisor {pid} stopped")
    session = Session.open(path, supervise=False)
    try:
        end_session(session, label=f"{path.name} ({session.job_name})")
    finally:
        session.close()


@pytest.fixture
def remote_root(slurm_lab, lab_sshd):
    root = slurm_lab.shared_dir(f"remote/{uuid.uuid4().hex[:8]}")
    try:
        yield root
    finally:
        for path in sorted(p for p in root.rglob("session.json")):
            end_remote_session(path.parent)


def head_pointer(path: Path) -> str | None:
    try:
        return (path / "ray_head").read_text().strip() or None
    except OSError:
        return None


def test_seed_failover_loop_driven_from_outside(remote_root, lab_sshd):
    s = RemoteSession.create(str(remote_root / "loop"), ssh=target_of(lab_sshd), remote_python=REMOTE_PYTHON,
                             head=HEAD, launcher=LAUNCHER, scheduler="slurm")
    s.wait_for_head(timeout=180)
    worker = s.add_worker_allocation(WORKER)
    s.wait_for_worker_allocation(worker, timeout=180)
    commits = remote_root / "commits.txt"
    total = 30
    argv = [REMOTE_PYTHON, "-m", PAYLOAD, str(commits), str(total)]
    first_head = s.record().head_job
    cancelled: dict = {}

    def cancel_head_mid_payload() -> None:
        try:
            wait_until(lambda: len(committed_units(commits)) >= 5, timeout=180, message="payload progress")
            cancelled["at_commits"] = len(committed_units(commits))
            subprocess.run(["scancel", first_head], check=True, timeout=30)
            cancelled["at"] = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - asserted below
            cancelled["error"] = exc

    threading.Thread(target=cancel_head_mid_payload, daemon=True).start()
    out = io.StringIO()
    launches, ended = [], []
    head = None
    # The seed's loop, over SSH.
    while True:
        try:
            launches.append(head.job_id if head else first_head)
            result = s.run(argv, head=head, stdout=out).wait(timeout=300)
            break
        except SlurmAllocationEnded as exc:
            ended.append(exc)
            head = s.replace_head(timeout=300)
            cancelled.setdefault("replaced_after", time.monotonic() - cancelled.get("at", time.monotonic()))
    assert "error" not in cancelled, cancelled
    assert result.returncode == 0
    assert len(ended) == 1 and ended[0].allocation_state in ("CANCELLED", "COMPLETING", "REPLACED")
    assert ended[0].job_id == first_head
    assert head is not None and head.job_id == worker.job_id, "the running worker allocation was elected"
    assert launches == [first_head, worker.job_id]
    assert "payload:" in out.getvalue(), "the payload's output streamed back over SSH"
    assert sorted(committed_units(commits)) == list(range(total)), "every unit committed exactly once"
    print(f"\nSSH: head {first_head} cancelled at {cancelled['at_commits']}/{total} commits; "
          f"replace_head over SSH returned {cancelled['replaced_after']:.1f}s after the cancel")
    news: list[str] = []
    assert first_head not in s.teardown(wait=True, timeout=120, progress=news.append), \
        "the cancelled head is not cancelled again"
    # teardown(wait=True) returns once Slurm has let go: squeue, asked right after, lists none
    # of the session's jobs (not even COMPLETING), and the wait's news came back over SSH.
    assert squeue_ids(s.job_name) == [], squeue_ids(s.job_name)
    print(f"SSH teardown(wait=True) news: {news}")
    s.close()


@pytest.mark.slow
def test_outside_process_killed_and_restarted_mid_run(remote_root, lab_sshd, tmp_path):
    """Full tier only. On every change: tests/test_remote_local.py (a killed client stops its payload, the session goes on) and the seed's loop from outside on the lab (above)."""
    path = remote_root / "killed"
    s = RemoteSession.create(str(path), ssh=target_of(lab_sshd), remote_python=REMOTE_PYTHON, head=HEAD,
                             launcher=LAUNCHER, scheduler="slurm")
    s.wait_for_head(timeout=180)
    worker = s.add_worker_allocation(WORKER)
    s.wait_for_worker_allocation(worker, timeout=180)
    first_head = s.record().head_job
    supervisor = s.supervisor_pid
    s.close()
    commits = remote_root / "commits-killed.txt"
    total = 40
    target = dataclasses.asdict(target_of(lab_sshd))
    spec = tmp_path / "spec.json"
    # The clients' control folder is ours, so that the master connection the
    # killed client leaves behind (ControlPersist) is ended by the test.
    control = Path(tempfile.mkdtemp(prefix="er-ssh-t-", dir="/tmp"))
    spec.write_text(json.dumps({"path": str(path), "ssh": target, "remote_python": REMOTE_PYTHON,
                                "commits": str(commits), "total": total, "control_dir": str(control)}))

    def start_client(log: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(REPO / "integration" / "remote_loop.py"), str(spec)],
                                stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=REPO)

    first = start_client(tmp_path / "client-1.log")
    try:
        wait_until(lambda: len(committed_units(commits)) >= 5, timeout=180, message="payload progress")
        first.kill()   # the laptop lid closes: no goodbye
        first.wait(30)
        # The cluster side stops the orphaned driver (its stdin ended): the
        # commits stop while the head and its Ray still run.
        def quiet() -> bool:
            before = len(committed_units(commits))
            time.sleep(3)
            return len(committed_units(commits)) == before

        wait_until(quiet, timeout=60, message="the orphaned driver stopped committing")
        at_kill = len(committed_units(commits))
        assert at_kill < total
        # ...and keeps supervising: with no client at all, a lost head is replaced.
        subprocess.run(["scancel", first_head], check=True, timeout=30)
        t0 = time.monotonic()
        wait_until(lambda: head_pointer(path) == worker.job_id, timeout=120,
                   message="the cluster-side supervisor elected the worker with no client connected")
        noticed = time.monotonic() - t0
        inside = Session.open(path, supervise=False)
        wait_until(lambda: any(n.state is AgentState.JOINED and n.head_job == worker.job_id
                               for n in inside.node_states(worker.job_id).values()),
                   timeout=120, message="the worker rejoined the head it now hosts")
        assert alive(supervisor) and running_pid(path) == supervisor

        second = start_client(tmp_path / "client-2.log")
        assert second.wait(300) == 0, (tmp_path / "client-2.log").read_text()[-3000:]
    finally:
        for proc in (first, locals().get("second")):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)
        for socket_path in (control.iterdir() if control.is_dir() else ()):   # the last client closed it
            subprocess.run(["ssh", "-o", f"ControlPath={socket_path}", "-O", "exit", "unused"],
                           capture_output=True, timeout=30)
        shutil.rmtree(control, ignore_errors=True)
    steps = [json.loads(line) for line in (tmp_path / "client-2.log").read_text().splitlines()
             if line.startswith("{")]
    launches = [e["head"] for e in steps if e["step"] == "launch"]
    assert launches == [worker.job_id], f"the restarted client ran once, on the elected head: {steps}"
    units = committed_units(commits)
    assert sorted(units) == list(range(total)), "every unit committed exactly once across both clients"
    print(f"\nSSH: client killed at {at_kill}/{total} commits; head cancelled with no client -> "
          f"cluster-side supervisor moved ray_head in {noticed:.1f}s; restarted client finished")


@pytest.mark.dagster
@pytest.mark.slow
def test_dagster_materialization_over_ssh_survives_a_cancelled_head(remote_root, lab_sshd, tmp_path):
    """Full tier only. On every change: tests/test_dagster_ssh_local.py (Dagster over SSH) and integration/test_dagster_slurm.py (the seed's loop in an asset on the lab)."""
    commits = remote_root / "commits-dagster.txt"
    total = 30
    cancelled: dict = {}
    t = target_of(lab_sshd)
    ssh = SSHConnectionResource(host=t.host, port=t.port, user=t.user, key_path=t.key_path,
                                options=list(t.options), config_file=t.config_file)

    def cancel_head_mid_run(session) -> None:
        try:
            wait_until(lambda: len(committed_units(commits)) >= 4, timeout=180, message="payload progress")
            cancelled["head"] = session.session.record().head_job   # over SSH
            cancelled["at_commits"] = len(committed_units(commits))
            subprocess.run(["scancel", cancelled["head"]], check=True, timeout=30)
        except BaseException as exc:  # noqa: BLE001 - asserted below
            cancelled["error"] = exc

    @dagster.asset
    def robust(context: dagster.AssetExecutionContext, compute: ComputeResource):
        session = compute.get_run_allocation_session(context)
        assert isinstance(session.session, RemoteSession), "SSH mode"
        cancelled["worker"] = session.worker_allocations[0].job_id
        threading.Thread(target=cancel_head_mid_run, args=(session,), daemon=True).start()
        while True:   # the seed's loop, unchanged
            try:
                return compute.run(context=context, payload_path=pipes_payload_module.__file__,
                                   args=[str(commits), str(total)]).get_results()
            except SlurmAllocationEnded:
                session.replace_head(timeout=3600)

    compute = ComputeResource(
        slurm=SlurmResource(queue=SlurmQueueConfig(time_limit="20", mem="1G"), ssh=ssh,
                            remote_base=str(remote_root / "dagster"), remote_python=REMOTE_PYTHON),
        default_launcher=DagsterRayLauncher(object_store_memory=100_000_000),
        ray_head_allocation=DagsterRunAllocation(partition="cpu", cpus_per_task=1, mem="1G", time_limit="30"),
        run_allocation=DagsterRunAllocation(partition="gpu-a", cpus_per_task=2))
    began = time.time()
    result = dagster.materialize([robust], resources={"compute": compute})
    wall = time.time() - began
    assert result.success
    assert "error" not in cancelled, cancelled
    events = result.asset_materializations_for_node("robust")
    meta = {k: v.value for k, v in events[-1].metadata.items()}
    assert meta["elastic_ray/ssh_host"] == t.host
    # What the run held, computed on the cluster side: the one cancel moved the head once; one-node
    # allocations (the head's, the worker's, at most one more) each held for at most the wall time.
    assert "elastic_ray/usage_error" not in meta, meta["elastic_ray/usage_error"]
    assert meta["elastic_ray/head_moves"] == 1
    assert 0 < meta["elastic_ray/node_hours"] <= 3 * wall / 3600 + 1e-4, (meta, wall)
    if importlib.util.find_spec("matplotlib") is not None:   # the cluster side is this venv
        host, _, page = meta["elastic_ray/timeline"].partition(":")
        assert host == t.host and Path(page).name == "timeline.html" and Path(page).is_file(), meta
    assert meta["elastic_ray/head_job"] == cancelled["worker"] != cancelled["head"]
    assert meta["already_committed"] >= cancelled["at_commits"] >= 4
    assert meta["already_committed"] + meta["committed_now"] == total, "Pipes metadata came back over SSH"
    assert sorted(committed_units(commits)) == list(range(total)), "every unit committed exactly once"
    # The run's end tore the session down over SSH: its supervisor is gone.
    (session_dir,) = [p.parent for p in (remote_root / "dagster").rglob("session.json")]
    wait_until(lambda: running_pid(session_dir) is None, timeout=90, message="the supervisor ended with the run")
    print(f"\nSSH Dagster: head {cancelled['head']} cancelled at {cancelled['at_commits']}/{total}; "
          f"relaunch on {meta['elastic_ray/head_job']} found {meta['already_committed']} committed")
