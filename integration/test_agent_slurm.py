"""The per-node agent on REAL Slurm with REAL Ray: join, resources, restart with
backoff, drain, the pre-walltime signal, head moves and release.

One run (session) with one CPU head is shared by the module: the head on
``cpu`` plus worker allocations on ``gpu-a`` and ``gpu-b`` are submitted by
the fixture before the head is ready (that is what the first test checks),
and later tests add allocations of their own. The head move and the release
come last because they end the run. Every test that can is timed and prints
its figures (run with ``-s`` to see them).

Ray drivers run inside the head's Slurm job (``srun --overlap``), as a run's
payload steps do: a Ray driver needs a raylet on its own node, so a driver on
the lab's host (which runs no Ray node) cannot connect.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.agent.node import gcs
from elastic_ray.coordinator.session import Session, WorkerAllocation
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.wire.channel import ControlClient

from integration import labctl

_spec = importlib.util.spec_from_file_location(
    "elastic_ray_tests_helpers", Path(__file__).resolve().parent.parent / "tests" / "helpers.py")
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
wait_until = _helpers.wait_until
stays = _helpers.stays

pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.timeout(300)]

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "lab_ray_driver.py"
AGENT_CLI = str(Path(sys.executable).parent / "elastic-agent")

# Agent tuning, forwarded to every node by the coordinator (ELASTIC_AGENT_*).
AGENT_ENV = {
    "ELASTIC_AGENT_POLL_INTERVAL": "0.5",
    "ELASTIC_AGENT_BACKOFF_BASE": "2",
    "ELASTIC_AGENT_START_TIMEOUT": "90",
    "ELASTIC_AGENT_HEAD_LOST_AFTER": "3",
}
REJOIN_TIMEOUT = 15.0
LAUNCHER = RayLauncher(object_store_memory=100_000_000)
WALLTIME_TEST = "test_walltime_warning_drains_and_the_job_completes_before_its_limit"


def log(message: str) -> None:
    print(f"[agent-lab {time.strftime('%H:%M:%S')}] {message}", flush=True)


def create_session(path: Path, head: SlurmRunAllocationConfig) -> Session:
    """A session whose head is watched by nobody but these tests: an automatic
    election would undo the head moves and losses the tests make on purpose."""
    kwargs: dict[str, Any] = {}
    if "supervise" in inspect.signature(Session.create).parameters:
        kwargs["supervise"] = False
    return Session.create(path, scheduler="slurm", head=head, launcher=LAUNCHER, **kwargs)


def worker_config(partition: str, **kw: Any) -> SlurmWorkerAllocationConfig:
    kw.setdefault("num_nodes", 1)
    kw.setdefault("cpus_per_task", 1)
    kw.setdefault("mem", "1G")
    kw.setdefault("time_limit", "15")
    kw.setdefault("rejoin_timeout", REJOIN_TIMEOUT)
    kw.setdefault("gpus_per_node", 0)  # else inherited from the session's first worker allocation (gpu-a)
    return SlurmWorkerAllocationConfig(partition=partition, **kw)


@dataclass
class LabRun:
    session: Session
    work: Path
    head_job: str
    head_node: str = ""
    address: str = ""
    head_published_at: float = 0.0
    workers: dict[str, WorkerAllocation] = field(default_factory=dict)   # name -> handle
    configs: dict[str, SlurmWorkerAllocationConfig] = field(default_factory=dict)
    submitted_at: dict[str, float] = field(default_factory=dict)

    # -------------------------------------------------------------- views
    def add(self, name: str, config: SlurmWorkerAllocationConfig) -> WorkerAllocation:
        self.submitted_at[name] = time.time()
        handle = self.session.add_worker_allocation(config)
        self.workers[name], self.configs[name] = handle, config
        log(f"submitted worker allocation {name!r}: job {handle.job_id} on {config.partition}")
        return handle

    def state(self, name_or_job: str) -> dict[str, Any]:
        """The one node's published state of a (single-node) allocation; {} until there is one."""
        job = self.workers[name_or_job].job_id if name_or_job in self.workers else name_or_job
        state = next(iter(self.session.node_states(job).values()), None)
        return state.to_dict() if state is not None else {}

    def wait_state(self, name: str, predicate, timeout: float, what: str) -> dict[str, Any]:
        return wait_until(lambda: (s := self.state(name)) and predicate(s) and s, timeout, 0.2,
                          f"{name} ({self.workers[name].job_id}): {what}")

    def joined(self, name: str, timeout: float = 120) -> dict[str, Any]:
        return self.wait_state(name, lambda s: s.get("state") == "JOINED" and s.get("node_id"), timeout, "JOINED")

    def job_state(self, job: str) -> str:
        info = self.session.scheduler.query(self.session.job_name, [job]).get(job)
        return info.state.value if info else "?"

    def final(self, job: str, timeout: float = 90) -> str:
        def ended() -> str | None:
            info = self.session.scheduler.query(self.session.job_name, [job]).get(job)
            return info.state.value if info is not None and info.state.is_final else None
        return wait_until(ended, timeout, 0.5, f"job {job} to end")

    def gcs_nodes(self, address: str | None = None) -> list[gcs.NodeRecord]:
        return gcs.list_nodes(address or self.address, timeout=20, env=self.session.ray_client_env())

    # -------------------------------------------------------------- running things on nodes
    def driver(self, mode: str, args: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
        proc = subprocess.run(self._driver_argv(mode, args), capture_output=True, text=True, timeout=timeout,
                              env=self._driver_env(), stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, f"driver {mode} rc={proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def driver_popen(self, mode: str, args: dict[str, Any]) -> subprocess.Popen:
        return subprocess.Popen(self._driver_argv(mode, args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=self._driver_env(), stdin=subprocess.DEVNULL)

    def _driver_argv(self, mode: str, args: dict[str, Any]) -> list[str]:
        return ["srun", f"--jobid={self.head_job}", "--overlap", "-w", self.head_node, "--ntasks=1",
                PY, str(DRIVER), mode, json.dumps(args)]

    def _driver_env(self) -> dict[str, str]:
        # Token auth is on: the driver needs the session's RAY_AUTH_MODE and token file.
        return dict(os.environ, RAY_ADDRESS=self.address, RAY_USAGE_STATS_ENABLED="0",
                    **self.session.ray_client_env())


def srun_in(job: str, node: str, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command inside a running job on one of its nodes (node-local /tmp, netns)."""
    return subprocess.run(["srun", f"--jobid={job}", "--overlap", "-w", node, "--ntasks=1", *argv],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def agent_status(job: str, node: str, as_json: bool = True) -> Any:
    """`elastic-agent status --job JOB [--json]` run inside the job on its node."""
    proc = srun_in(job, node, [AGENT_CLI, "status", "--job", job, *(["--json"] if as_json else [])])
    assert proc.returncode == 0, proc.stderr
    if not as_json:
        return proc.stdout
    return [a for a in json.loads(proc.stdout) if a.get("job_id") == job]


def transitions(state: dict[str, Any]) -> list[tuple[float, str, str, str]]:
    return [(t["at"], t["from"], t["to"], t["reason"]) for t in state.get("transitions", [])]


def raylet_of(state: dict[str, Any], node: str) -> psutil.Process:
    """The raylet the agent reports, checked before anyone signals it: it runs in
    the node's network namespace, is called raylet, and lives under the agent's
    own temp dir (so it is this node's Ray, not another job's)."""
    pid, temp_dir = state.get("raylet_pid"), state.get("temp_dir")
    assert isinstance(pid, int) and temp_dir, state
    ns = labctl.settings_from_env().netns(node)
    assert pid in labctl.netns_pids(ns), f"raylet {pid} is not in {ns}"
    proc = psutil.Process(pid)
    assert proc.name() == "raylet", proc.name()
    assert any(arg.startswith(f"--raylet_socket_name={temp_dir}/") for arg in proc.cmdline()), proc.cmdline()
    return proc


# ------------------------------------------------------------------ the shared run

@pytest.fixture(scope="module")
def run(slurm_lab, request):
    mp = pytest.MonkeyPatch()
    for key, value in AGENT_ENV.items():
        mp.setenv(key, value)
    work = slurm_lab.shared_dir(f"agent-slurm/{uuid.uuid4().hex[:8]}")
    session = create_session(work / "session", SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"))
    lab = LabRun(session=session, work=work, head_job=session.dir.read_ray_head())
    log(f"session {session.path} job name {session.job_name}; head job {lab.head_job}")
    try:
        # Before the head is ready, on purpose (test_worker_submitted_before_its_head_waits_then_joins).
        lab.add("gpu-a", worker_config("gpu-a", gpus_per_node=2, cpus_per_task=2, mem="2G",
                                       ray_resources={"accelerator:a40": 1}))
        lab.add("gpu-b", worker_config("gpu-b", gpus_per_node=1, cpus_per_task=3, mem="2G",
                                       ray_resources={"accelerator:h100": 1}))
        lab.address = session.wait_for_head(timeout=120)
        endpoint = session.dir.read_head_endpoint(lab.head_job)
        lab.head_node, lab.head_published_at = endpoint.host, endpoint.started_at
        log(f"head {lab.head_job} ready on {lab.head_node} at {lab.address}")
        if any(item.name == WALLTIME_TEST for item in request.session.items):
            # Its walltime runs while the other tests do (Slurm's 30 s tick is slow).
            lab.add("walltime", worker_config("cpu", time_limit="1", signal_before_timeout="TERM@20"))
        yield lab
    finally:
        session.teardown()
        jobs = list(lab.workers.values())
        try:
            wait_until(lambda: all(i.state.is_final for i in session.query().values()), 120, 1.0,
                       "every job of the session to end after teardown")
        finally:
            mp.undo()
            log(f"torn down {len(jobs)} worker allocations and the head(s)")


# ------------------------------------------------------------------ 2. waits for its head, then joins

def test_worker_submitted_before_its_head_waits_then_joins(run):
    for name in ("gpu-a", "gpu-b"):
        state = run.joined(name)
        steps = transitions(state)
        assert steps[0][1:3] == ("WAITING_FOR_HEAD", "STARTING"), steps
        assert steps[-1][2] == "JOINED" and state["head_job"] == run.head_job
        # It was up and waiting before the head existed, and started Ray only after.
        assert state["started_at"] < run.head_published_at <= steps[0][0] + 0.5, (state["started_at"],
                                                                                  run.head_published_at, steps)
        log(f"{name}: agent up {run.head_published_at - state['started_at']:.1f} s before the head was ready; "
            f"Ray started {steps[0][0] - run.head_published_at:.2f} s after it, joined "
            f"{steps[-1][0] - run.head_published_at:.1f} s after it")


# ------------------------------------------------------------------ 1. resources and placement

def test_resources_come_from_the_allocations_and_custom_resources_place_actors(run):
    joined = {name: run.joined(name) for name in ("gpu-a", "gpu-b")}
    if "walltime" in run.workers:  # let the cluster settle: that allocation joins in the meantime
        run.wait_state("walltime", lambda s: s.get("state") in ("JOINED", "LEFT"), 60, "JOINED or LEFT")
    seen = run.driver("resources", {"actors": [{"resource": "accelerator:a40"}, {"resource": "accelerator:h100"}]})
    records = {n.node_id: n for n in run.gcs_nodes() if n.alive}
    heads = [n for n in records.values() if n.is_head_node]
    assert len(heads) == 1
    head = heads[0]
    assert head.resources_total.get("CPU", 0) == 0 and head.resources_total.get("GPU", 0) == 0, head.resources_total
    # The cluster's CPUs and GPUs are exactly the workers' (the head adds none),
    # as the driver saw them (its node list and totals are one moment).
    workers = [n for n in records.values() if not n.is_head_node]
    seen_workers = [n for n in seen["nodes"] if n["node_id"] != head.node_id]
    assert seen["total"].get("CPU", 0) == sum(n["resources"].get("CPU", 0) for n in seen_workers)
    assert seen["total"].get("GPU", 0) == sum(n["resources"].get("GPU", 0) for n in seen_workers)
    assert all(n["resources"].get("CPU", 0) == 0 for n in seen["nodes"] if n["node_id"] == head.node_id)
    for name, state in joined.items():
        config, job = run.configs[name], run.workers[name].job_id
        node = records[state["node_id"]]
        cpus = srun_in(job, state["node"], ["printenv", "SLURM_CPUS_ON_NODE"]).stdout.strip()
        res = node.resources_total
        log(f"{name}: node {state['node']} SLURM_CPUS_ON_NODE={cpus} ray resources "
            f"{ {k: v for k, v in sorted(res.items()) if not k.startswith('node:')} }")
        assert int(cpus) == config.cpus_per_task
        assert res["CPU"] == int(cpus)
        assert res["GPU"] == config.gpus_per_node
        assert res["dagster_slurm_worker"] == 1
        for resource in config.ray_resources:
            assert res[resource] == config.ray_resources[resource]
        assert node.labels.get("slurm.job-id") == job
    assert all(n.resources_total.get("dagster_slurm_worker") == 1 for n in workers)
    where = {a["resource"]: a for a in seen["actors"]}
    assert where["accelerator:a40"]["node_id"] == joined["gpu-a"]["node_id"]
    assert where["accelerator:a40"]["host"] == "gpua-1"
    assert where["accelerator:h100"]["node_id"] == joined["gpu-b"]["node_id"]
    assert where["accelerator:h100"]["host"] == "gpub-1"
    log(f"cluster total: { {k: v for k, v in sorted(seen['total'].items()) if not k.startswith('node:')} }")

    # 8. what an operator logged into the node sees
    job, node = run.workers["gpu-a"].job_id, joined["gpu-a"]["node"]
    text = agent_status(job, node, as_json=False)
    data = agent_status(job, node)
    print(f"\n$ srun --jobid={job} --overlap -w {node} elastic-agent status --job {job}\n{text}")
    print(f"$ srun --jobid={job} --overlap -w {node} elastic-agent status --job {job} --json\n"
          f"{json.dumps(data, indent=2, sort_keys=True)}")
    assert f"job {job} node {node} role worker  [running]" in text
    assert len(data) == 1 and data[0]["state"] == "JOINED" and data[0]["liveness"] == "running"
    assert data[0]["node_id"] == joined["gpu-a"]["node_id"] and data[0]["head_job"] == run.head_job


# ------------------------------------------------------------------ 4. drain while a task runs

def test_drain_lets_the_running_task_finish_and_takes_no_new_work(run):
    handle = run.add("drain-x", worker_config("cpu", cpus_per_task=2))
    state = run.joined("drain-x")
    markers = run.work / f"drain-{handle.job_id}"
    markers.mkdir()
    driver = run.driver_popen("drain", {"node": state["node_id"], "markers": str(markers), "seconds": 20})
    try:
        started = json.loads(wait_until(lambda: (markers / "long-started").exists()
                                        and (markers / "long-started").read_text(), 90, 0.2,
                                        "the long task to start"))
        assert started["node_id"] == state["node_id"]
        t_drain = time.time()
        assert handle.request_drain(drain_timeout=120, reason="test drain") == 1
        # Ray must know before new work is offered: the GCS lists the node as draining.
        wait_until(lambda: any(n.node_id == state["node_id"] and n.draining for n in run.gcs_nodes()), 30, 0.3,
                   "the GCS to list the node as draining")
        t_draining = time.time()
        (markers / "go").write_text("")
        out, err = driver.communicate(timeout=150)
        assert driver.returncode == 0, err[-4000:]
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert result["long"]["node_id"] == state["node_id"], "the running task finished where it ran"
    assert all(s["node_id"] != state["node_id"] for s in result["small"]), result["small"]
    final = run.final(handle.job_id)
    left = run.state("drain-x")
    steps = transitions(left)
    t_left = next(at for at, _, to, _ in steps if to == "LEFT")
    log(f"drain: request -> GCS draining {t_draining - t_drain:.1f} s; task finished "
        f"{result['long']['finished'] - t_drain:.1f} s after the request; node left "
        f"{t_left - result['long']['finished']:.1f} s after the task; job {final}; "
        f"{len(result['small'])} new tasks ran on {sorted({s['host'] for s in result['small']})}")
    assert final == "COMPLETED"
    assert left["state"] == "LEFT" and "node left after drain" in left["reason"], left["reason"]
    assert t_left >= result["long"]["finished"] - 0.5
    dead = [n for n in run.gcs_nodes() if n.node_id == state["node_id"]]
    assert dead and not dead[0].alive and "DRAIN" in (dead[0].death_reason_name or ""), dead


def test_drain_deadline_shorter_than_the_task_retries_it_elsewhere(run):
    handle = run.add("drain-y", worker_config("cpu", cpus_per_task=2))
    state = run.joined("drain-y")
    markers = run.work / f"retry-{handle.job_id}"
    markers.mkdir()
    attempts = markers / "attempts"
    driver = run.driver_popen("retry", {"node": state["node_id"], "markers": str(markers), "seconds": 20,
                                        "max_retries": 2})
    try:
        wait_until(lambda: attempts.exists() and attempts.read_text().strip(), 90, 0.2, "the task to start")
        first = json.loads(attempts.read_text().splitlines()[0])
        assert first["node_id"] == state["node_id"]
        t_drain = time.time()
        assert handle.request_drain(drain_timeout=5, reason="test short deadline") == 1
        out, err = driver.communicate(timeout=180)
        assert driver.returncode == 0, err[-4000:]
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    tries = [json.loads(line) for line in attempts.read_text().splitlines()]
    final = run.final(handle.job_id)
    left = run.state("drain-y")
    t_left = next(at for at, _, to, _ in transitions(left) if to == "LEFT")
    log(f"short drain: node stopped {t_left - t_drain:.1f} s after the request (deadline 5 s); attempts on "
        f"{[t['host'] for t in tries]}; retry started {tries[-1]['at'] - t_left:.1f} s after the stop; "
        f"finished {result['done'] - t_drain:.1f} s after the request; job {final}")
    assert len(tries) == 2 and tries[1]["node_id"] != state["node_id"]
    assert result["result"]["node_id"] == tries[1]["node_id"]
    assert left["state"] == "LEFT" and "deadline" in left["reason"], left["reason"]
    assert 4.0 <= t_left - t_drain <= 15.0
    assert final == "COMPLETED"


# ------------------------------------------------------------------ 5. the signal path

def test_term_signal_drains_with_the_deadline_taken_from_slurm(run):
    handle = run.add("signal", worker_config("cpu", time_limit="10"))
    state = run.joined("signal")
    info = run.session.scheduler.query(run.session.job_name, [handle.job_id])[handle.job_id]
    t0 = time.time()
    subprocess.run(["scancel", "--signal=TERM", handle.job_id], check=True, timeout=30)
    run.wait_state("signal", lambda s: s.get("state") in ("DRAINING", "LEFT"), 30, "DRAINING")
    final = run.final(handle.job_id, timeout=60)
    left = run.state("signal")
    steps = transitions(left)
    drain_at = next(at for at, _, to, _ in steps if to == "DRAINING")
    t_left = next(at for at, _, to, _ in steps if to == "LEFT")
    deadline = left["drain_deadline"]
    log(f"TERM: drain began {drain_at - t0:.2f} s after scancel --signal=TERM with its deadline "
        f"{deadline - drain_at:.0f} s ahead (job end {info.end_time - drain_at:.0f} s ahead); the idle node "
        f"left {t_left - drain_at:.1f} s later; job {final} {time.time() - t0:.1f} s after the signal")
    # A signal while the job runs is the pre-walltime warning: the agent asked
    # Slurm for the end time and drains until 15 s before it, not a few seconds.
    assert abs(deadline - (info.end_time - 15)) <= 2, (deadline, info.end_time)
    assert any(to == "DRAINING" and "SIGTERM (job RUNNING)" in reason for _, _, to, reason in steps), steps
    # An idle node does not wait for that deadline: it leaves at once, and the job ends well.
    assert left["state"] == "LEFT" and "node left after drain" in left["reason"]
    assert t_left - drain_at < 15
    assert final == "COMPLETED"
    # Ray saw a drain (preemption), not a SIGTERM to its own processes.
    gone = [n for n in run.gcs_nodes() if n.node_id == state["node_id"]]
    assert gone and not gone[0].alive and gone[0].death_reason_name == "AUTOSCALER_DRAIN_PREEMPTED", gone


# ------------------------------------------------------------------ 3. raylet crashes: backoff, then GAVE_UP

def test_raylet_kills_restart_with_growing_delays_then_the_node_gives_up(run):
    handle = run.add("crashy", worker_config("cpu"))
    state = run.joined("crashy")
    node = state["node"]
    max_restarts = state["max_restarts"]
    seen_ids = [state["node_id"]]
    figures = []
    for kill in range(1, max_restarts + 2):
        raylet = raylet_of(state, node)
        t_kill = time.time()
        raylet.kill()
        if kill <= max_restarts:
            state = run.wait_state("crashy", lambda s: s.get("state") == "JOINED" and s.get("node_id")
                                   and s["node_id"] not in seen_ids, 90, f"rejoin after kill {kill}")
            steps = transitions(state)
            backoff = [t for t in steps if t[2] == "RESTART_BACKOFF"][-1]
            restart = [t for t in steps if t[1] == "RESTART_BACKOFF" and t[2] == "STARTING"][-1]
            joined = steps[-1]
            figures.append({"kill": kill, "noticed": backoff[0] - t_kill, "delay": restart[0] - backoff[0],
                            "rejoined": joined[0] - t_kill})
            seen_ids.append(state["node_id"])
            log(f"kill {kill}: noticed {figures[-1]['noticed']:.2f} s after the kill; restart after a "
                f"{figures[-1]['delay']:.1f} s delay; rejoined (new node id) {figures[-1]['rejoined']:.1f} s "
                f"after the kill")
        else:
            state = run.wait_state("crashy", lambda s: s.get("state") == "GAVE_UP", 30, "GAVE_UP")
            log(f"kill {kill}: GAVE_UP {transitions(state)[-1][0] - t_kill:.2f} s after the kill: {state['reason']}")
    delays = [f["delay"] for f in figures]
    base = float(AGENT_ENV["ELASTIC_AGENT_BACKOFF_BASE"])
    for i, delay in enumerate(delays):
        assert base * 2 ** i - 0.1 <= delay <= base * 2 ** i + 2.0, delays     # 2, 4, 8 s
    assert delays == sorted(delays) and len(set(round(d) for d in delays)) == len(delays)
    assert state["failures"] == max_restarts + 1 and state["gave_up_on"] == run.head_job
    assert "staying out until another head" in state["reason"]

    # It stays out while the head lives: watched until the GCS has noticed the
    # last crash (its health check takes about 15 s) and for at least 8 s.
    gave_up_at = time.time()

    def settled() -> bool:
        now = run.state("crashy")
        assert now["state"] == "GAVE_UP" and now.get("ray_pid") is None, now
        ours = [n for n in run.gcs_nodes() if n.alive and n.labels.get("slurm.job-id") == handle.job_id]
        return not ours and time.time() - gave_up_at >= 8
    wait_until(settled, 60, 1.0, "the killed node DEAD in the GCS while the agent stays out")

    # ... and says so where an operator looks.
    text = agent_status(handle.job_id, node, as_json=False)
    data = agent_status(handle.job_id, node)
    print(f"\n$ srun --jobid={handle.job_id} --overlap -w {node} elastic-agent status --job {handle.job_id}\n{text}")
    print(f"$ srun --jobid={handle.job_id} --overlap -w {node} elastic-agent status --job {handle.job_id} --json\n"
          f"{json.dumps(data, indent=2, sort_keys=True)}")
    assert "state      GAVE_UP" in text and "staying out until another head" in text
    assert len(data) == 1 and data[0]["state"] == "GAVE_UP" and data[0]["failures"] == max_restarts + 1
    assert data[0]["liveness"] == "running"
    assert run.job_state(handle.job_id) == "RUNNING"


# ------------------------------------------------------------------ 5b. a real walltime warning (slow)

@pytest.mark.slow
def test_walltime_warning_drains_and_the_job_completes_before_its_limit(run):
    handle = run.workers.get("walltime")
    assert handle is not None, "the fixture submits this allocation when this test is selected"
    final = run.final(handle.job_id, timeout=150)
    info = run.session.scheduler.query(run.session.job_name, [handle.job_id])[handle.job_id]
    state = run.state("walltime")
    steps = transitions(state)
    log(f"walltime job {handle.job_id}: started {info.start_time and time.strftime('%H:%M:%S', time.localtime(info.start_time))}, "
        f"limit at +60 s; transitions (s after start): "
        f"{[(round(at - (info.start_time or at), 1), to, reason[:60]) for at, _, to, reason in steps]}; "
        f"ended {final} at +{(info.end_time or 0) - (info.start_time or 0):.0f} s")
    assert final == "COMPLETED", final
    assert state["state"] == "LEFT"
    drain = [t for t in steps if t[2] in ("DRAINING", "LEFT") and "SIGTERM (job RUNNING)" in t[3]]
    assert drain, steps
    # It left before the limit (start + 60 s), not at it.
    left_at = next(at for at, _, to, _ in steps if to == "LEFT")
    assert info.start_time is not None and left_at < info.start_time + 60


# ------------------------------------------------------------------ 6. the head moves; then no head at all

def test_workers_follow_a_moved_head_in_seconds_then_release_without_one(run):
    live = {name: run.state(name) for name in run.workers
            if run.job_state(run.workers[name].job_id) == "RUNNING"}
    assert {"gpu-a", "gpu-b"} <= set(live), live
    # gpu-a and gpu-b JOINED with a node id first: run alone (-k, or the
    # version matrix's subset) this test may come before the ones that waited
    # for that. (Other workers of the module, e.g. one whose Ray gave up, stay as they are.)
    for name in ("gpu-a", "gpu-b"):
        live[name] = run.joined(name)
    before = {name: s.get("node_id") for name, s in live.items()}
    # Recorded as the successor: the session's teardown (recorded jobs only) ends it even if this test fails.
    new_head = run.session.submit_head_allocation(record_as=lambda r, job: replace(r, successor=job))
    log(f"second head job {new_head} submitted; workers following {run.head_job}: {sorted(live)}")
    endpoint = wait_until(lambda: run.session.dir.read_head_endpoint(new_head), 120, 0.3, "the new head's endpoint")
    # The old head is asked to drain first (as replace_head's caller does): it
    # keeps serving until the pointer moves, so its workers stay where they are.
    old = run.state(run.head_job)
    with ControlClient(old["control"], run.session.secret, run.session.info.session_id) as client:
        reply = client.request("drain", {"deadline": time.time() + 120, "reason": "test: the head moves"}, timeout=5)
    assert reply["state"] == "DRAINING", reply

    def workers_stay_put() -> bool:
        now = {name: run.state(name).get("node_id") for name in live}
        moved = {name: node for name, node in now.items() if node != before[name]}
        assert not moved, f"node ids changed: {moved}"
        assert run.state(run.head_job)["state"] == "DRAINING", run.state(run.head_job)
        return True
    # a window of observation (4 pointer polls)
    stays(workers_stay_put, 2, 0.25, "the workers stay on the draining head")
    t_switch = time.time()
    run.session.dir.write_ray_head(new_head)

    def rejoined() -> dict[str, dict[str, Any]] | None:
        states = {name: run.state(name) for name in live}
        done = all(s.get("state") == "JOINED" and s.get("head_job") == new_head and s.get("node_id")
                   and s["node_id"] != before[name] for name, s in states.items())
        return states if done else None

    states = wait_until(rejoined, 60, 0.2, "every worker to join the new head")
    per_node = {name: next(at for at, _, to, _ in reversed(transitions(s)) if to == "JOINED") - t_switch
                for name, s in states.items()}
    new_ids = {s["node_id"] for s in states.values()}
    alive = {n.node_id for n in run.gcs_nodes(endpoint.address) if n.alive}
    log(f"head move: pointer changed -> rejoined the new head (new node ids): "
        f"{ {k: round(v, 1) for k, v in sorted(per_node.items())} }; all within {max(per_node.values()):.1f} s "
        f"(Ray's own GCS timeout would be 60 s)")
    assert new_ids <= alive
    assert max(per_node.values()) < 30
    # The drained old head left as soon as the pointer moved, not at its deadline.
    old_final = run.final(run.head_job, timeout=60)
    old = run.state(run.head_job)
    t_old_left = next(at for at, _, to, _ in transitions(old) if to == "LEFT")
    log(f"old head {run.head_job}: LEFT {t_old_left - t_switch:.1f} s after the pointer moved "
        f"({old['reason']}); job {old_final}")
    assert old["state"] == "LEFT" and f"head moved to {new_head}" in old["reason"]
    assert t_old_left - t_switch < 10 and old_final == "COMPLETED"
    if "crashy" in states:  # the node that gave up on the old head is back with the new one
        assert run.state("crashy")["failures"] == 0

    # No head at all: the new head's job ends; the pointer still names it.
    t_gone = time.time()
    run.session.scheduler.cancel(new_head)
    for name in live:
        job = run.workers[name].job_id
        final = run.final(job, timeout=REJOIN_TIMEOUT + 60)
        state = run.state(name)
        released = next(at for at, _, to, _ in transitions(state) if to == "RELEASED")
        log(f"{name}: no head -> RELEASED {released - t_gone:.1f} s after the head was cancelled "
            f"(rejoin_timeout {REJOIN_TIMEOUT:.0f} s); job {final}")
        assert state["state"] == "RELEASED", state["reason"]
        assert final == "COMPLETED"
        assert REJOIN_TIMEOUT <= released - t_gone <= REJOIN_TIMEOUT + 20
