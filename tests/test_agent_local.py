"""The agent for real: real `ray start`, real agents, on the local scheduler.

These are component tests: everything above the Scheduler is the code that
runs on Slurm; the local scheduler stands in for the cluster so they run
anywhere. The same scenarios against real Slurm live in integration/.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
import zmq

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.agent.node import gcs
from elastic_ray.agent.node.private_dirs import user_temp_root
from elastic_ray.coordinator.session import Session
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind, EventSource
from elastic_ray.protocol.wire.channel import ControlClient

from tests.helpers import stays, wait_until
from tests.hostile_client import FUZZ_FRAMES

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

DRIVER = """
import json, sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(json.dumps({"total": ray.cluster_resources(),
                  "nodes": [{k: n[k] for k in ("NodeID", "Alive", "Resources", "NodeManagerAddress")}
                            for n in ray.nodes() if n["Alive"]]}))
"""


# The tests below drive heads and pointers by hand; an automatic election
# (the coordinator's supervisor, where the Session has one) would interfere.
NO_SUPERVISOR = {"supervise": False} if "supervise" in inspect.signature(Session.create).parameters else {}


def driver(address: str, session: Session, code: str = DRIVER, timeout: float = 90) -> dict:
    """A Ray client of the session's cluster (token auth is on: it needs the session's settings)."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **session.ray_client_env())
    out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture
def session_factory(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    made: list[Session] = []

    def make(**kwargs) -> Session:
        kwargs.setdefault("head", SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"))
        kwargs.setdefault("launcher", RayLauncher(object_store_memory=100_000_000))
        kwargs.update(NO_SUPERVISOR)
        session = Session.create(tmp_path / f"s{len(made)}", scheduler="local", **kwargs)
        made.append(session)
        return session

    yield make
    for session in made:
        session.teardown()
        # The local scheduler's supervisors stop the agents, which stop Ray.
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")
        # ...and each agent removes its Ray temp dirs as it exits: nothing of the run stays in /tmp.
        temp = user_temp_root() / session.info.session_id[:8]
        wait_until(lambda: not temp.exists(), 30, 0.2, f"{temp} removed once the run's agents exited")


GPU_DRIVER = """
import json, sys, time, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
@ray.remote(num_gpus=1)
def hold():
    time.sleep(5)
    return 1
print(json.dumps({"held": ray.get(hold.remote())}))
"""


def test_cpu_head_and_a_gpu_worker_allocation(session_factory, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_GPU_SAMPLE_INTERVAL", "1")   # forwarded to the agents
    # Ray refreshes its metrics page every 10 s by default; every second here, so a 5 s task shows.
    session = session_factory(launcher=RayLauncher(object_store_memory=100_000_000,
                                                   env={"RAY_metrics_report_interval_ms": "1000"}))
    address = session.wait_for_head(timeout=90)
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, gpus_per_node=2, cpus_per_task=2, mem="2G", time_limit="30",
        ray_resources={"accelerator:a40": 1}))
    nodes = session.wait_for_worker_allocation(worker, timeout=90)
    assert list(nodes) == ["gpua-1"]
    seen = driver(address, session)
    total = seen["total"]
    # The head advertises nothing; the worker has what Slurm granted.
    assert total["CPU"] == 2 and total["GPU"] == 2
    assert total["dagster_slurm_worker"] == 1 and total["accelerator:a40"] == 1
    head_nodes = [n for n in seen["nodes"] if not n["Resources"].get("CPU")]
    assert len(head_nodes) == 1 and "GPU" not in head_nodes[0]["Resources"]
    assert nodes["gpua-1"] in {n["NodeID"] for n in seen["nodes"]}
    time.sleep(2)
    assert driver(address, session, GPU_DRIVER)["held"] == 1     # one of the two GPUs, for 5 s
    time.sleep(2)
    state = session.remove_worker_allocation(worker, drain_timeout=30)
    assert state == "COMPLETED"
    # The agent measured its node's GPUs in Ray's terms: both held all along, one busy for the task's 5 s
    # (as Ray's metrics page shows it, refreshed every second here, and sampled every second).
    left = next(e for e in event_log.read(session.dir.path).events
                if e.kind is EventKind.NODE_LEFT and e.job == worker.job_id)
    usage = session.node_states(worker.job_id)["gpua-1"].gpu_usage
    assert usage is not None and usage.samples == left.details["gpu_samples"] >= 6
    held, idle = left.details["gpu_held_seconds"], left.details["gpu_idle_seconds"]
    measured = usage.last_at - usage.first_at
    assert 0.8 * 2 * measured <= held <= 2 * measured + 0.01, (held, measured)
    assert 2.5 <= held - idle <= 9.0, (held, idle)
    _check_the_events_of_a_worker_added_and_removed(session, worker.job_id, "gpua-1", nodes["gpua-1"])


def _check_the_events_of_a_worker_added_and_removed(session: Session, job: str, node: str, ray_node_id: str) -> None:
    """The run's history, as the coordinator and both agents wrote it, in the order it happened."""
    reading = event_log.read(session.dir.path)
    assert reading.skipped == {}
    seen = [(e.kind, e.by, e.job, e.node) for e in reading.events]
    head = session.record().head_job
    C, A = EventSource.COORDINATOR, EventSource.AGENT
    K = EventKind
    assert seen[0] == (K.SESSION_CREATED, C, None, None)
    story = [(K.SUBMITTED, C, head, None), (K.STARTED, A, head, None), (K.SUBMITTED, C, job, None),
             (K.STARTED, A, job, node), (K.NODE_JOINED, A, job, node), (K.DRAIN_REQUESTED, C, job, None),
             (K.DRAIN_REQUESTED, A, job, node), (K.DRAIN_FINISHED, A, job, node), (K.NODE_LEFT, A, job, node),
             (K.REMOVED, C, job, None)]
    at = []
    for kind, by, j, n in story:
        found = [i for i, (k, b, jj, nn) in enumerate(seen) if (k, b, jj) == (kind, by, j) and (n is None or nn == n)]
        assert found, f"no {kind.value} by {by.value} for job {j} in {seen}"
        at.append(found[0])
    assert at == sorted(at), [story[i][0].value for i in sorted(range(len(at)), key=at.__getitem__)]
    by_kind = {(e.kind, e.job): e for e in reading.events}
    submitted = by_kind[(K.SUBMITTED, job)].details
    assert (submitted["role"], submitted["partition"], submitted["nodes"], submitted["gpus_per_node"]) == (
        "worker", "gpu-a", 1, 2)
    assert by_kind[(K.SUBMITTED, head)].details["role"] == "head"
    joined = by_kind[(K.NODE_JOINED, job)]
    assert joined.details["ray_node_id"] == ray_node_id and joined.details["head_job"] == head
    assert by_kind[(K.NODE_LEFT, job)].details["state"] == "LEFT"
    assert by_kind[(K.REMOVED, job)].details["state"] == "COMPLETED"
    assert all(e.at <= time.time() for e in reading.events)


# ---------------------------------------------------------------- one run shared by the tests below

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """A head and one worker allocation, kept for the module (the tests below
    leave the head in place)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    mp.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    mp.setenv("ELASTIC_AGENT_HEAD_LOST_AFTER", "1.5")
    session = Session.create(tmp_path_factory.mktemp("agent-local") / "s", scheduler="local",
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"),
                             launcher=RayLauncher(object_store_memory=100_000_000), **NO_SUPERVISOR)
    try:
        session.wait_for_head(timeout=90)
        worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
            partition="gpu-b", num_nodes=1, gpus_per_node=1, cpus_per_task=1, mem="1G", time_limit="30"))
        session.wait_for_worker_allocation(worker, timeout=90)
        yield session, worker
    finally:
        session.teardown()
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")
        mp.undo()


def one_state(session: Session, job: str) -> dict:
    """The one node's published state as the agent wrote it; {} until there is one."""
    state = next(iter(session.node_states(job).values()), None)
    return state.to_dict() if state is not None else {}


def processes_naming(fragment: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(fragment in arg for arg in proc.info["cmdline"] or ()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


# ---------------------------------------------------------------- 7. garbage on the control socket

@pytest.mark.timeout(180)
def test_ten_thousand_hostile_frames_change_nothing_and_the_agent_still_answers(shared):
    """10,000 random or mutated frames (tests/hostile_client.py, a process of its own, like an attacker)."""
    session, worker = shared
    before = one_state(session, worker.job_id)
    assert before["state"] == "JOINED"
    endpoint, secret, sid = before["control"], session.dir.secret(), session.info.session_id
    client = ControlClient(endpoint, secret, sid)
    first = client.request("status", {}, timeout=5)["status"]["requests"]
    attacker = subprocess.Popen([sys.executable, "-m", "tests.hostile_client"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])
    try:
        attacker.stdin.write(json.dumps({"endpoint": endpoint, "secret": secret.hex(), "sid": sid,
                                         "head_job": before["head_job"], "seed": 20261130}) + "\n")
        attacker.stdin.flush()
        line = attacker.stdout.readline()
        assert line, f"the hostile client ended before sending (exit {attacker.wait(timeout=10)})"
        sent_report = json.loads(line)
        delivered, dropped, sent = sent_report["delivered"], sent_report["dropped"], sent_report["sent"]
        polls = 0

        def all_seen() -> dict | None:
            nonlocal polls
            polls += 1
            counts = client.request("status", {}, timeout=5)["status"]["requests"]
            return counts if counts["rejected"] - first["rejected"] >= delivered else None

        counts = wait_until(all_seen, 60, 0.5, "the agent to have judged every delivered frame")
        attacker.stdin.write("check\n")
        attacker.stdin.flush()
        assert json.loads(attacker.stdout.readline())["answered"] == 0, "a hostile frame was answered"
        attacker.stdin.close()
        code = attacker.wait(timeout=30)
        # Its own libzmq may abort in its teardown (see tests/hostile_client.py): that is the attacker's end.
        assert code in (0, -signal.SIGABRT), f"the hostile client exited {code}"
        if code:
            print(f"\nthe hostile client's own libzmq {zmq.zmq_version()} aborted in its teardown (exit {code})")
    finally:
        if attacker.poll() is None:
            attacker.kill()
            attacker.wait(timeout=10)
    # Nothing hostile was accepted: only our 20 genuine requests and our status calls.
    assert counts["accepted"] == first["accepted"] + 20 + polls, (first, counts, polls)
    assert counts["rejected"] - first["rejected"] == delivered, (first, counts, delivered)
    status = client.request("status", {}, timeout=5)["status"]
    after = one_state(session, worker.job_id)
    assert status["pid"] == before["pid"] and status["state"] == "JOINED" and status["node_id"] == before["node_id"]
    assert after["state"] == "JOINED" and after["node_id"] == before["node_id"]
    assert psutil.pid_exists(before["pid"])
    address = session.dir.read_head_endpoint(before["head_job"]).address
    assert gcs.node_alive(address, before["node_id"], timeout=20, env=session.ray_client_env())
    print(f"\nfuzz against agent {worker.job_id} ({endpoint}): {FUZZ_FRAMES} frames, {delivered} delivered "
          f"and rejected, {dropped} dropped by libzmq (part > 64 KiB), 0 accepted; sent in {sent:.1f} s; "
          f"rejections by reason {dict(sorted((k, v - first['rejected_by_reason'].get(k, 0)) for k, v in counts['rejected_by_reason'].items()))}")


# ---------------------------------------------------------------- a damaged pointer does not drop the cluster

def test_an_unreadable_pointer_keeps_the_live_head(shared):
    session, worker = shared
    before = one_state(session, worker.job_id)
    head = session.dir.read_ray_head()
    try:
        session.dir.ray_head_file.write_text("not a job id\n")

        def still_joined() -> bool:
            state = ControlClient(before["control"], session.dir.secret(), session.info.session_id).request(
                "status", {}, timeout=5)["status"]
            assert state["state"] == "JOINED" and state["node_id"] == before["node_id"], state
            return True
        # 6 pointer polls and more than head_lost_after
        stays(still_joined, 3, 0.3, "the worker staying JOINED on its node")
    finally:
        session.dir.write_ray_head(head)
    log = (session.dir.log_dir / f"agent-{worker.job_id}-{before['node']}.log").read_text()
    assert "event=head_pointer_missing" in log


# ---------------------------------------------------------------- a stalled head agent is not a lost head

def test_a_stalled_head_agent_does_not_make_workers_leave(shared):
    """The head's agent stops beating (here: SIGSTOP for 6 s, four times the
    1.5 s head_lost_after) while its Ray serves on: the worker asks the GCS,
    which answers, and keeps its node."""
    session, worker = shared
    before = one_state(session, worker.job_id)
    head_job = session.dir.read_ray_head()
    head_state = one_state(session, head_job)
    agent = psutil.Process(head_state["pid"])
    assert abs(agent.create_time() - head_state["pid_create_time"]) < 1
    assert "elastic_ray.agent" in " ".join(agent.cmdline()) and str(session.path) in " ".join(agent.cmdline())
    client = ControlClient(before["control"], session.dir.secret(), session.info.session_id)
    agent.suspend()
    try:
        def still_joined() -> bool:
            state = client.request("status", {}, timeout=5)["status"]
            assert state["state"] == "JOINED" and state["node_id"] == before["node_id"], state
            return True
        stays(still_joined, 6, 0.3, "the worker staying JOINED on its node")   # a window of observation
    finally:
        agent.resume()
    log = (session.dir.log_dir / f"agent-{worker.job_id}-{before['node']}.log").read_text()
    assert "event=head_silent" in log and "gcs=answers" in log
    wait_until(lambda: client.request("status", {}, timeout=5)["status"]["state"] == "JOINED", 10, 0.3,
               "the worker still joined after the head agent resumed")


# ---------------------------------------------------------------- a TERM while Ray is still starting

@pytest.mark.parametrize("when", ["at-once", "ray-launched"])
def test_term_while_starting_leaves_at_once_and_leaves_no_ray_behind(shared, when):
    """TERM as soon as the agent decided to start Ray, or once `ray start` runs
    but its node has not registered yet: the agent leaves at once (nothing
    to drain) and no Ray process of the job survives it."""
    session, _ = shared
    handle = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="cpu", num_nodes=1, gpus_per_node=0, cpus_per_task=1, mem="1G", time_limit="30"))
    state = wait_until(lambda: (s := one_state(session, handle.job_id)).get("state") == "STARTING" and s, 60, 0.05,
                       "the worker to start Ray")
    if when == "ray-launched":
        client = ControlClient(state["control"], session.dir.secret(), session.info.session_id)
        launched = wait_until(lambda: (s := client.request("status", {}, timeout=5)["status"]).get("ray_pid") and s,
                              30, 0.02, "`ray start` to run")
        assert launched["state"] == "STARTING", "joined before the test could signal"
    session.scheduler.signal(handle.job_id, "TERM")
    final = wait_until(lambda: (i := session.query().get(handle.job_id)) and i.state.is_final and i, 60, 0.2,
                       "the job to end")
    left = one_state(session, handle.job_id)
    assert final.state.value == "COMPLETED"
    assert left["state"] == "LEFT" and "drain before joining" in left["reason"], left["reason"]
    fragment = f"{user_temp_root()}/{session.info.session_id[:8]}/{handle.job_id}."
    wait_until(lambda: not processes_naming(fragment), 15, 0.2, f"no process under {fragment}")
    assert not list(Path(fragment.rsplit("/", 1)[0]).glob(f"{handle.job_id}.*"))
    print(f"\nTERM {when}: job {final.state.value}, agent {left['state']}; "
          f"exited {left['updated_at'] - state['since']:.1f} s after the start began")


# ---------------------------------------------------------------- the hosted head

@pytest.mark.timeout(240)
@pytest.mark.slow
def test_a_worker_hosts_a_head_and_its_own_node_follows_it(session_factory):
    """Full tier only. On every change a worker allocation's agent hosts the head and its own node
    follows it in: on the lab, the fault matrix's elector-killed scenario (the election picks a
    running worker allocation, which hosts the head; the payload goes on there); locally,
    tests/test_default_layout_local.py (the first allocation hosts the head and computes) and
    tests/test_standby_head_local.py (a hosted standby becomes the head)."""
    session = session_factory()
    session.wait_for_head(timeout=90)
    worker = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, gpus_per_node=1, cpus_per_task=2, mem="2G", time_limit="30"))
    nodes = session.wait_for_worker_allocation(worker, timeout=90)
    before = one_state(session, worker.job_id)
    client = ControlClient(before["control"], session.dir.secret(), session.info.session_id)
    reply = client.request("host_head", {"head_job": worker.job_id}, timeout=5)
    assert reply["ok"], reply
    endpoint = wait_until(lambda: session.dir.read_head_endpoint(worker.job_id), 90, 0.2, "the hosted head")
    hosted = client.request("status", {}, timeout=5)["status"]["hosted_head"]
    assert hosted["state"] == "READY" and hosted["address"] == endpoint.address
    old_head = session.dir.read_ray_head()
    t_switch = time.time()
    session.dir.write_ray_head(worker.job_id)
    state = wait_until(lambda: (s := one_state(session, worker.job_id)).get("state") == "JOINED"
                       and s.get("head_job") == worker.job_id and s.get("node_id") != nodes["gpua-1"] and s,
                       60, 0.2, "the host's own node to join its hosted head")
    seen = driver(endpoint.address, session)
    total = seen["total"]
    assert total["CPU"] == 2 and total["GPU"] == 1, total          # the hosted head adds none
    assert state["node_id"] in {n["NodeID"] for n in seen["nodes"]}
    # The old head may go: this allocation now carries the run.
    session.scheduler.cancel(old_head)
    wait_until(lambda: session.query()[old_head].state.is_final, 60, 0.5, "the old head to end")
    again = client.request("status", {}, timeout=5)["status"]
    assert again["state"] == "JOINED" and again["node_id"] == state["node_id"]
    assert again["hosted_head"]["state"] == "READY"
    rejoined = [t["at"] for t in state["transitions"] if t["to"] == "JOINED"][-1] - t_switch

    # The hosting allocation is drained: its worker node leaves, but the agent
    # keeps the run's head until the session has another one.
    t_drain = time.time()
    assert worker.request_drain(drain_timeout=60, reason="test handover") == 1
    leaving = wait_until(lambda: (s := client.request("status", {}, timeout=5)["status"])["state"] == "LEFT"
                         and s, 30, 0.2, "the host's worker node to leave")
    assert leaving["handover_deadline"] == pytest.approx(t_drain + 60, abs=2)
    assert leaving["hosted_head"]["state"] == "READY" and not leaving["exited"]
    assert session.query()[worker.job_id].state.value == "RUNNING"
    # Recorded as the session's successor, so the session's teardown (which
    # cancels only the jobs it recorded) ends it too.
    successor = session.submit_head_allocation(record_as=lambda r, job: replace(r, successor=job))
    wait_until(lambda: session.dir.read_head_endpoint(successor), 90, 0.2, "the successor head")
    t_moved = time.time()
    session.dir.write_ray_head(successor)
    final = wait_until(lambda: (i := session.query().get(worker.job_id)) and i.state.is_final and i, 30, 0.2,
                       "the hosting allocation to end once the head moved")
    assert final.state.value == "COMPLETED"
    hosted_dir = f"{user_temp_root()}/{session.info.session_id[:8]}/{worker.job_id}."
    wait_until(lambda: not processes_naming(hosted_dir), 15, 0.2, "the hosted head's processes to be gone")
    ended = one_state(session, worker.job_id)
    print(f"\nhosted head on {before['node']} ({endpoint.address}); the host's worker rejoined it "
          f"{rejoined:.1f} s after the pointer moved; drained, it kept the head until the pointer moved on "
          f"and ended {ended['updated_at'] - t_moved:.1f} s after that ({final.state.value})")
