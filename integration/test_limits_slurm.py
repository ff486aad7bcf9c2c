"""Enforced memory on the real lab (issue 25): a lab started with ``--limits`` puts every job in a
memory cgroup at its ``--mem`` (TaskPlugin=task/cgroup, ConstrainRAMSpace, no swap beyond it).

* a run in the default layout (the head's allocation computes too, so a head and a worker Ray node
  share one job's grant) is sized inside the grant: the two Ray nodes' memory and object store add
  up to no more than ``--mem``; a driver that puts three times the object store's size into it
  gets every object back intact, Ray spilled to disk, and nothing of the job was OOM-killed
  (the kernel's own count in the job's cgroup, read from the host, and the agent's);
* a Ray task of the job that does go over the grant is killed by the kernel, the job goes on, and
  the node's agent counts the kill: ``session status`` notes it on the allocation's row, the node's
  ``oom_kills`` in ``--json``, an ``oom_killed`` event in the session's log;
* a payload driver (a step of its own) that goes over the grant is killed too; its step's cgroup
  and counter leave with the step, so Slurm's accounting says how it ended: ``PayloadFailed``
  carries ``step_state="OUT_OF_MEMORY"`` and the step, ``session status`` names the step on the
  head's row.

Per change, ``tests/test_oom.py`` covers the counting (the job's cgroup found from /proc, the
kernel's counters read on a cgroup-shaped tree, the status note) and ``tests/test_ray_memory.py``
the sizing from the grant; only a lab that enforces memory shows the kernel doing it.

Skipped unless the running lab enforces limits (``integration/lab up --limits``, or
``ELASTIC_RAY_LAB_LIMITS=1``); ``scripts/lab-variants`` runs them on such a lab (full tier).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from elastic_ray import PayloadFailed, Session, SlurmRunAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind
from elastic_ray.protocol.disk.records import NodeState
from integration.faults import lab_ops
from integration.slurm_helpers import end_session
from tests.helpers import wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.slow, pytest.mark.limits, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
GRANT_MIB = 1536
HEAD = SlurmRunAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=2, mem=f"{GRANT_MIB}M", time_limit="30")


@pytest.fixture
def limited_session(slurm_lab, monkeypatch):
    if not lab_ops.settings().limits:
        pytest.skip("the running lab does not enforce memory (integration/lab up --limits)")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    base = REPO / ".lab" / "test-work" / "limits"
    base.mkdir(parents=True, exist_ok=True)
    made: list[Session] = []

    def make() -> Session:
        # No standby (a third Ray node in the grant is issue 24's question, not this one's);
        # Ray's own memory monitor off, so that only the kernel decides who goes over the grant.
        launcher = RayLauncher(env={"RAY_memory_monitor_refresh_ms": "0"})
        session = Session.create(base / uuid.uuid4().hex[:8], scheduler="slurm", head=HEAD, ray_head_only=False,
                                 launcher=launcher, supervise=False)
        made.append(session)
        session.wait_for_head(timeout=300)
        return session

    yield make
    for session in made:
        end_session(session)


def node_states(session: Session, job: str) -> list[NodeState]:
    return list(session.dir.read_node_states(job).values())


def job_cgroup_files(job: str) -> list[Path]:
    """The kernel's OOM counters of ``job`` on every lab node, read from the host (cgroup v1)."""
    return sorted(Path("/sys/fs/cgroup/memory").glob(f"slurm_*/uid_*/job_{job}/**/memory.oom_control")) + \
        sorted(Path("/sys/fs/cgroup/memory").glob(f"slurm_*/uid_*/job_{job}/memory.oom_control"))


def kernel_oom_kills(job: str) -> int:
    total = 0
    for path in set(job_cgroup_files(job)):
        for line in path.read_text().splitlines():
            if line.startswith("oom_kill "):
                total += int(line.split()[1])
    return total


def run_driver(session: Session, code: str, timeout: float) -> tuple[int, str, str]:
    """The driver's exit code (a failed one too), its stdout and its stderr."""
    out = session.path / f"driver-{uuid.uuid4().hex[:6]}.out"
    err = out.with_suffix(".err")
    with open(out, "w") as o, open(err, "w") as e:
        run = session.run([sys.executable, "-c", textwrap.dedent(code)], stdout=o, stderr=e)
        try:
            rc = run.wait(timeout=timeout).returncode
        except PayloadFailed as failed:
            rc = failed.returncode
    return rc, out.read_text(), err.read_text()


FILL = """
import hashlib, json, re, time
import numpy as np
import ray
ray.init()
deadline = time.time() + 180
while True:   # the hosted head and the allocation's own worker: both join (the worker a little later)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= 2 or time.time() > deadline:
        break
    time.sleep(0.5)
store = max(n["Resources"].get("object_store_memory", 0) for n in nodes)   # the driver's node's, at most
sized = [{"memory": n["Resources"].get("memory", 0), "store": n["Resources"].get("object_store_memory", 0),
          "host": n["NodeManagerHostname"]} for n in nodes]
chunk = 32 * 1024 * 1024
refs, digests = [], []
while len(refs) * chunk < 3 * store:
    a = np.random.default_rng(len(refs)).integers(0, 255, chunk, dtype=np.uint8)
    digests.append(hashlib.sha256(a.tobytes()).hexdigest())
    refs.append(ray.put(a))
    del a
ok = all(hashlib.sha256(ray.get(r).tobytes()).hexdigest() == d for r, d in zip(refs, digests))
from ray._private.internal_api import memory_summary
summary = memory_summary(stats_only=True)
m = re.search(r"Spilled (\\d+) MiB", summary)
print(json.dumps({"ok": ok, "put_mib": len(refs) * chunk // 2**20, "store": store, "nodes": sized,
                  "spilled_mib": int(m.group(1)) if m else None, "summary": summary[-2000:]}), flush=True)
"""


def test_a_run_in_the_default_layout_is_sized_inside_the_grant_and_spills_instead_of_being_killed(limited_session):
    session = limited_session()
    job = session.record().head_job
    code, out, err = run_driver(session, FILL, timeout=600)
    assert code == 0, f"driver exit {code}\n{err[-3000:]}"
    got = json.loads(out.strip().splitlines()[-1])
    print(f"\nput {got['put_mib']} MiB into a store of at most {got['store'] // MIB} MiB: spilled {got['spilled_mib']} MiB; "
          f"nodes {got['nodes']}")
    assert got["ok"], "an object came back different from what was put"
    assert got["spilled_mib"] and got["spilled_mib"] > 0, got["summary"]
    # Both Ray nodes of the job's one node (the hosted head and the allocation's worker) inside one grant.
    assert len(got["nodes"]) == 2 and len({n["host"] for n in got["nodes"]}) == 1, got["nodes"]
    total = sum(n["memory"] + n["store"] for n in got["nodes"])
    assert total <= GRANT_MIB * MIB, f"Ray was given {total // MIB} MiB on a grant of {GRANT_MIB} MiB"
    # Nothing was killed: the kernel's count in the job's cgroup, and the agent's.
    assert job_cgroup_files(job), f"no memory cgroup of job {job} under /sys/fs/cgroup/memory"
    assert kernel_oom_kills(job) == 0
    assert session.query([job])[job].state.value == "RUNNING"
    states = node_states(session, job)
    assert states and all(s.oom_kills == 0 for s in states), [(s.node, s.oom_kills) for s in states]


HOG = """
import sys
import ray
ray.init()

@ray.remote(max_retries=0)
def hog():
    held = []
    while True:                  # 64 MiB at a time, every page written: the kernel must find them
        held.append(b"\\x01" * (64 * 1024 * 1024))

try:
    ray.get(hog.remote())
except Exception as e:           # the worker died: Ray says so, the driver fails
    print(f"task failed: {type(e).__name__}: {str(e)[:300]}", file=sys.stderr, flush=True)
    sys.exit(3)
"""


def test_a_process_over_the_grant_is_killed_and_the_status_says_so(limited_session):
    session = limited_session()
    job = session.record().head_job
    t0 = time.time()
    code, _out, err = run_driver(session, HOG, timeout=300)
    assert code == 3, f"driver exit {code}: a task that allocates without end was not stopped\n{err[-2000:]}"
    # The kernel killed its Ray worker in the job's cgroup (the agent's step, where the raylet
    # runs its workers); the job and its head go on. (A driver run as a step of its own that goes
    # over: the next test.)
    assert kernel_oom_kills(job) >= 1, err[-2000:]
    assert session.query([job])[job].state.value == "RUNNING"
    session.wait_for_head(timeout=60)
    # The agent counts it within one status period (20 s), and the status says so.
    wait_until(lambda: any((s.oom_kills or 0) >= 1 for s in node_states(session, job)), timeout=60,
               message="no agent of the job counted the OOM kill")
    status = subprocess.run([sys.executable, "-m", "elastic_ray.cli", "session", "status", str(session.path), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    rows = [r for r in json.loads(status.stdout)["jobs"] if r["job_id"] == job]
    assert rows and sum(n.get("oom_kills") or 0 for n in rows[0]["nodes"]) >= 1, rows
    text = subprocess.run([sys.executable, "-m", "elastic_ray.cli", "session", "status", str(session.path)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert "OOM killer ended" in text.stdout, text.stdout
    kills = [e for e in event_log.read(session.path).events if e.kind is EventKind.OOM_KILLED]
    assert any(e.job == job and e.at >= t0 - 1 and (e.details.get("kills") or 0) >= 1 for e in kills), kills


DRIVER_HOG = """
import sys
held = []
print("allocating", flush=True)
while True:                      # the driver itself: 64 MiB at a time, every page written
    held.append(b"\\x01" * (64 * 1024 * 1024))
"""


def test_a_driver_over_the_grant_fails_as_out_of_memory_and_the_status_says_so(limited_session):
    session = limited_session()
    job = session.record().head_job
    err_path = session.path / "driver-hog.err"
    with open(err_path, "w") as err:
        run = session.run([sys.executable, "-c", DRIVER_HOG], stderr=err)
        t0 = time.monotonic()
        with pytest.raises(PayloadFailed) as failed:
            run.wait(timeout=300)
        waited = time.monotonic() - t0
    exc = failed.value
    print(f"\ndriver failed after {waited:.1f} s: {exc}")
    # Slurm's srun exits 1, as for any failure; the step's end in accounting says why.
    assert exc.step_state == "OUT_OF_MEMORY" and (exc.step or "").startswith(f"{job}."), (str(exc), err_path.read_text())
    assert "OOM killer" in str(exc)
    # The job and its head go on; the status names the step on the head's row, in --json and as text.
    assert session.query([job])[job].state.value == "RUNNING"
    status = subprocess.run([sys.executable, "-m", "elastic_ray.cli", "session", "status", str(session.path), "--json"],
                            capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    rows = [r for r in json.loads(status.stdout)["jobs"] if r["job_id"] == job]
    assert rows and rows[0]["driver_oom_steps"] == [exc.step], rows
    text = subprocess.run([sys.executable, "-m", "elastic_ray.cli", "session", "status", str(session.path)],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert f"payload driver step {exc.step} ended OUT_OF_MEMORY" in text.stdout, text.stdout
    finished = [e for e in event_log.read(session.path).events if e.kind is EventKind.PAYLOAD_FINISHED]
    assert finished and finished[-1].reason == "PayloadFailed", finished
