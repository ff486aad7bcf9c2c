"""The local scheduler: its pure decisions, exhaustively, then its processes, for real.

The decisions (what fits where, which pending job starts, when the warning
is due, every state transition, every supervisor step) are tables. The
effects (detached supervisors, node processes, walltime, crashes, damaged
records, many submitters at once) run real processes against a real state
directory; nothing is faked.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from elastic_ray.config import SlurmRunAllocationConfig as Alloc
from elastic_ray.errors import SchedulerError
from elastic_ray.scheduler.base import JobSpec, JobState
from elastic_ray.scheduler.local import LocalScheduler, resolve_output
from elastic_ray.scheduler.local.cluster import (
    Holding,
    LocalCluster,
    LocalNode,
    NodeFree,
    Placement,
    ResourceRequest,
    compress_hostlist,
    expand_hostlist,
    free_resources,
    infeasible_reason,
    place,
    predict_start,
    request_from_allocation,
    schedule,
)
from elastic_ray.scheduler.local.procs import is_alive, send, send_group
from elastic_ray.scheduler.local.record import (
    BeginEnding,
    Event,
    Finish,
    InvalidTransition,
    JobRecord,
    Kill,
    ProcRef,
    RunView,
    SendWarning,
    Wait,
    apply_event,
    decide,
    exit_event,
    job_info,
    next_state,
    node_argv,
    node_environment,
    parse_signal_name,
    started,
    time_left,
    warning_time,
)
from helpers import marker_events, stays, wait_until, write_marker_script

CLUSTER = LocalCluster.default()
FINAL = [s for s in JobState if s.is_final]


# ==========================================================================
# Pure: host lists.

@pytest.mark.parametrize("text, hosts", [
    ("cpu-1", ["cpu-1"]),
    ("cpu-[1-2]", ["cpu-1", "cpu-2"]),
    ("cpu-[1-2,4],gpua-1", ["cpu-1", "cpu-2", "cpu-4", "gpua-1"]),
    ("n[01-03]", ["n01", "n02", "n03"]),
    ("a,b", ["a", "b"]),
])
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["", "cpu-[1-", "cpu-[2-1]", "cpu-[a]", "x[1][2]", "a,,b"])
def test_expand_hostlist_refuses_garbage(text):
    with pytest.raises(ValueError):
        expand_hostlist(text)


@pytest.mark.parametrize("hosts, text", [
    (["cpu-1"], "cpu-1"),
    (["cpu-1", "cpu-2"], "cpu-[1-2]"),
    (["cpu-1", "cpu-2", "cpu-4", "gpua-1"], "cpu-[1-2,4],gpua-1"),
    (["n01", "n02"], "n[01-02]"),
    (["login", "cpu-2"], "login,cpu-2"),
])
def test_compress_hostlist_round_trips(hosts, text):
    assert compress_hostlist(hosts) == text
    assert expand_hostlist(text) == hosts


# ==========================================================================
# Pure: the cluster description and requests.

def test_default_cluster_is_the_lab_layout():
    parts = CLUSTER.partitions
    assert {p: [n.name for n in ns] for p, ns in parts.items()} == {
        "cpu": ["cpu-1", "cpu-2"], "gpu-a": ["gpua-1"], "gpu-b": ["gpub-1"]}
    assert [n.address for n in CLUSTER.nodes] == ["127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"]
    assert [n.gpus for n in CLUSTER.nodes] == [0, 0, 4, 2]
    assert all(n.cpus == 4 and n.mem_mb == 8192 for n in CLUSTER.nodes)
    assert CLUSTER.default_partition == "cpu"
    assert LocalCluster.from_dict(json.loads(json.dumps(CLUSTER.to_dict()))) == CLUSTER


@pytest.mark.parametrize("change, message", [
    (lambda d: d["nodes"].append(dict(d["nodes"][0])), "duplicate node names"),
    (lambda d: d.update(default_partition="nope"), "default_partition"),
    (lambda d: d.update(kill_wait=-1), "kill_wait"),
    (lambda d: d["nodes"][0].update(cpus="4"), "cpus"),
    (lambda d: d.pop("nodes"), "nodes"),
])
def test_cluster_description_is_validated(change, message):
    data = CLUSTER.to_dict()
    change(data)
    with pytest.raises(ValueError, match=message):
        LocalCluster.from_dict(data)


@pytest.mark.parametrize("alloc, expected", [
    (Alloc(), ResourceRequest()),
    (Alloc(num_nodes=2, cpus_per_task=3), ResourceRequest(num_nodes=2, cpus=3)),
    (Alloc(mem="2G"), ResourceRequest(mem_mb=2048)),
    (Alloc(mem="0"), ResourceRequest(mem_mb=0)),
    (Alloc(mem_per_cpu="512M", cpus_per_task=2), ResourceRequest(cpus=2, mem_mb=1024)),
    (Alloc(partition="gpu-a,gpu-b", gpus_per_node=2), ResourceRequest(gpus=2, partitions=("gpu-a", "gpu-b"))),
    (Alloc(nodelist="cpu-[1-2]", exclude="gpua-1"),
     ResourceRequest(nodelist=("cpu-1", "cpu-2"), exclude=("gpua-1",))),
])
def test_request_from_allocation(alloc, expected):
    assert request_from_allocation(alloc) == expected


# ==========================================================================
# Pure: fit, placement, scheduling, prediction.

def _free(**used: list[Holding]) -> dict[str, NodeFree]:
    return free_resources(CLUSTER, [h for hs in used.values() for h in hs])


def test_free_resources_subtracts_holdings():
    free = free_resources(CLUSTER, [Holding("gpua-1", 2, 1000, (0, 1)), Holding("gpua-1", 1, 24, (3,))])
    assert free["gpua-1"] == NodeFree(cpus=1, mem_mb=8192 - 1024, gpus=(2,))
    assert free["cpu-1"] == NodeFree(cpus=4, mem_mb=8192, gpus=())


@pytest.mark.parametrize("request_, used, nodes", [
    # One CPU anywhere on the default partition: the first node.
    (ResourceRequest(), [], ("cpu-1",)),
    (ResourceRequest(num_nodes=2), [], ("cpu-1", "cpu-2")),
    # cpu-1 is full (CPUs): the next node.
    (ResourceRequest(), [Holding("cpu-1", 4, 1024)], ("cpu-2",)),
    # cpu-1 has CPUs but no memory left (8G head default takes it all).
    (ResourceRequest(), [Holding("cpu-1", 2, 8192)], ("cpu-2",)),
    # Both full: no placement.
    (ResourceRequest(), [Holding("cpu-1", 4, 1), Holding("cpu-2", 4, 1)], None),
    (ResourceRequest(num_nodes=2), [Holding("cpu-1", 4, 1)], None),
    # GPUs.
    (ResourceRequest(gpus=2, partitions=("gpu-a",)), [], ("gpua-1",)),
    (ResourceRequest(gpus=3, partitions=("gpu-a",)), [Holding("gpua-1", 1, 256, (0, 1))], None),
    # A partition list falls through to the next one that fits.
    (ResourceRequest(gpus=2, partitions=("gpu-b", "gpu-a")), [Holding("gpub-1", 1, 256, (0,))], ("gpua-1",)),
    # nodelist: the named node first, even if it is not the first in order.
    (ResourceRequest(nodelist=("cpu-2",)), [], ("cpu-2",)),
    (ResourceRequest(num_nodes=2, nodelist=("cpu-2",)), [], ("cpu-2", "cpu-1")),
    (ResourceRequest(nodelist=("cpu-2",)), [Holding("cpu-2", 4, 1)], None),
    # nodelist grows the node count.
    (ResourceRequest(num_nodes=1, nodelist=("cpu-1", "cpu-2")), [], ("cpu-1", "cpu-2")),
    # exclude.
    (ResourceRequest(exclude=("cpu-1",)), [], ("cpu-2",)),
    (ResourceRequest(exclude=("cpu-1",)), [Holding("cpu-2", 4, 1)], None),
    # mem=0 wants the whole node's memory.
    (ResourceRequest(mem_mb=0), [Holding("cpu-1", 1, 256)], ("cpu-2",)),
])
def test_place(request_, used, nodes):
    placement = place(request_, CLUSTER, _free(x=used))
    assert (placement.nodes if placement else None) == nodes


def test_place_hands_out_lowest_free_gpu_indices():
    """As the lab measured: two 2-GPU jobs on gpua-1 get 0,1 and 2,3."""
    req = ResourceRequest(gpus=2, partitions=("gpu-a",))
    first = place(req, CLUSTER, _free())
    second = place(req, CLUSTER, _free(a=list(first.holdings)))
    assert first.holdings[0].gpus == (0, 1)
    assert second.holdings[0].gpus == (2, 3)
    assert place(req, CLUSTER, _free(a=list(first.holdings), b=list(second.holdings))) is None


@pytest.mark.parametrize("request_, words", [
    (ResourceRequest(num_nodes=3), "not available"),
    (ResourceRequest(cpus=5), "not available"),
    (ResourceRequest(mem_mb=16384), "not available"),
    (ResourceRequest(gpus=1), "not available"),  # no GPUs on the default partition
    (ResourceRequest(gpus=4, partitions=("gpu-b",)), "not available"),  # 4 x h100 on a 2-GPU node
    (ResourceRequest(gpus=8, partitions=("gpu-a",)), "not available"),
    (ResourceRequest(partitions=("nope",)), "invalid partition"),
    (ResourceRequest(nodelist=("gpua-1",)), "not available"),  # node not in the partition
    (ResourceRequest(nodelist=("cpu-1",), exclude=("cpu-1",)), "not available"),
])
def test_infeasible_requests_are_refused(request_, words):
    assert words in infeasible_reason(request_, CLUSTER)


@pytest.mark.parametrize("request_", [
    ResourceRequest(), ResourceRequest(num_nodes=2, cpus=4, mem_mb=8192),
    ResourceRequest(gpus=4, partitions=("gpu-a",)), ResourceRequest(gpus=2, partitions=("gpu-b",)),
    ResourceRequest(gpus=4, partitions=("gpu-b", "gpu-a")),
])
def test_feasible_requests_pass(request_):
    assert infeasible_reason(request_, CLUSTER) is None


def test_schedule_in_order_with_backfill_and_reasons():
    big = ResourceRequest(num_nodes=2, cpus=4)
    small = ResourceRequest(cpus=2)
    held = [Holding("cpu-1", 2, 512)]
    placed, reasons = schedule(CLUSTER, held, [("1", big), ("2", small), ("3", small), ("4", small)])
    # The big job does not fit: "Resources"; small ones behind it backfill
    # (cpu-1 has 2 CPUs left, cpu-2 has 4) until the partition is full.
    assert reasons["1"] == "Resources"
    assert placed["2"].nodes == ("cpu-1",) and placed["3"].nodes == ("cpu-2",)
    assert placed["4"].nodes == ("cpu-2",)
    placed, reasons = schedule(CLUSTER, held, [("5", small), ("6", small), ("7", small), ("8", small)])
    assert sorted(placed) == ["5", "6", "7"]
    # Job 8 would fit the free nodes alone, but earlier jobs took the room first.
    assert reasons == {"8": "Priority"}


def test_schedule_is_deterministic_for_every_supervisor():
    """Each pending job's supervisor computes the plan on its own; all must agree."""
    pending = [(str(i), ResourceRequest(cpus=3)) for i in range(1, 5)]
    assert schedule(CLUSTER, [], pending) == schedule(CLUSTER, [], pending)
    placed, reasons = schedule(CLUSTER, [], pending)
    assert {k: p.nodes for k, p in placed.items()} == {"1": ("cpu-1",), "2": ("cpu-2",)}
    assert reasons == {"3": "Priority", "4": "Priority"}


def test_predict_start():
    req = ResourceRequest(num_nodes=2)
    assert predict_start(req, CLUSTER, [], 100.0) == 100.0
    running = [(500.0, [Holding("cpu-1", 4, 1)]), (300.0, [Holding("cpu-2", 4, 1)])]
    # Needs both nodes: the later of the two ends.
    assert predict_start(req, CLUSTER, running, 100.0) == 500.0
    # Needs one node: the earlier end.
    assert predict_start(ResourceRequest(), CLUSTER, running, 100.0) == 300.0
    # Only an unlimited job could free the room: never, as far as we can tell.
    assert predict_start(ResourceRequest(), CLUSTER, [(None, [Holding("cpu-1", 4, 1)]),
                                                      (None, [Holding("cpu-2", 4, 1)])], 1.0) == math.inf


# ==========================================================================
# Pure: the state machine, every state x every event.

ACTIVE_CASES = {
    # (state, ending_as): {event: expected (state, ending_as) or InvalidTransition}
    (JobState.PENDING, None): {
        Event.START: (JobState.RUNNING, None),
        Event.CANCEL: (JobState.CANCELLED, None),
        Event.TIME_LIMIT: InvalidTransition,
        Event.LAUNCH_FAILED: (JobState.FAILED, None),
        Event.EXITED_OK: InvalidTransition,
        Event.EXITED_ERROR: InvalidTransition,
        Event.SUPERVISOR_LOST: (JobState.FAILED, None),
    },
    (JobState.RUNNING, None): {
        Event.START: InvalidTransition,
        Event.CANCEL: (JobState.COMPLETING, JobState.CANCELLED),
        Event.TIME_LIMIT: (JobState.COMPLETING, JobState.TIMEOUT),
        Event.LAUNCH_FAILED: (JobState.COMPLETING, JobState.FAILED),
        Event.EXITED_OK: (JobState.COMPLETED, None),
        Event.EXITED_ERROR: (JobState.FAILED, None),
        Event.SUPERVISOR_LOST: (JobState.NODE_FAIL, None),
    },
}
for _ending in (JobState.CANCELLED, JobState.TIMEOUT, JobState.FAILED):
    ACTIVE_CASES[(JobState.COMPLETING, _ending)] = {
        Event.START: InvalidTransition,
        Event.CANCEL: (JobState.COMPLETING, _ending),
        Event.TIME_LIMIT: (JobState.COMPLETING, _ending),
        Event.LAUNCH_FAILED: (JobState.COMPLETING, _ending),
        Event.EXITED_OK: (_ending, None),
        Event.EXITED_ERROR: (_ending, None),
        Event.SUPERVISOR_LOST: (_ending, None),
    }
TRANSITIONS = [(state, ending, event, expected)
               for (state, ending), table in ACTIVE_CASES.items() for event, expected in table.items()]
TRANSITIONS += [(state, None, event, (state, None)) for state in FINAL for event in Event]


def test_transition_table_covers_every_event():
    for table in ACTIVE_CASES.values():
        assert set(table) == set(Event)


@pytest.mark.parametrize("state, ending, event, expected", TRANSITIONS,
                         ids=[f"{s.value}/{e.value if e else '-'}/{ev.value}" for s, e, ev, _ in TRANSITIONS])
def test_next_state(state, ending, event, expected):
    if expected is InvalidTransition:
        with pytest.raises(InvalidTransition):
            next_state(state, ending, event)
    else:
        assert next_state(state, ending, event) == expected


@pytest.mark.parametrize("state", [JobState.SUSPENDED, JobState.PREEMPTED])
def test_states_the_local_scheduler_never_uses_are_refused_or_absorbed(state):
    if state.is_final:
        assert next_state(state, None, Event.CANCEL) == (state, None)
    else:
        with pytest.raises(InvalidTransition):
            next_state(state, None, Event.CANCEL)


def test_completing_needs_a_final_ending():
    with pytest.raises(InvalidTransition):
        next_state(JobState.COMPLETING, None, Event.EXITED_OK)


def _record(**changes) -> JobRecord:
    base = JobRecord(job_id="7", name="job", role="worker", submit_time=100.0, request=ResourceRequest(),
                     node_argv=("true",), workdir="/w", output="/w/out")
    return replace(base, **changes)


def test_record_lifecycle_times_and_reasons():
    pending = _record(time_limit=60)
    running = started(pending, Placement("cpu", (Holding("cpu-1", 1, 256),)), 110.0)
    assert (running.state, running.start_time, running.end_time, running.nodes) == (
        JobState.RUNNING, 110.0, 170.0, ("cpu-1",))
    ending = apply_event(running, Event.TIME_LIMIT, 170.5)
    assert (ending.state, ending.ending_as, ending.teardown_since, ending.end_time, ending.reason) == (
        JobState.COMPLETING, JobState.TIMEOUT, 170.5, 170.5, "TimeLimit")
    done = apply_event(ending, Event.EXITED_ERROR, 172.0)
    assert (done.state, done.end_time, done.reason) == (JobState.TIMEOUT, 170.5, "TimeLimit")
    # Final states absorb later events unchanged.
    assert apply_event(done, Event.CANCEL, 180.0) is done
    failed = apply_event(running, Event.EXITED_ERROR, 120.0, "node cpu-1 exited 3")
    assert (failed.state, failed.end_time, failed.reason) == (
        JobState.FAILED, 120.0, "NonZeroExitCode: node cpu-1 exited 3")
    assert apply_event(pending, Event.CANCEL, 105.0).end_time == 105.0
    lost = apply_event(running, Event.SUPERVISOR_LOST, 130.0, "supervisor pid 9 died")
    assert (lost.state, lost.reason) == (JobState.NODE_FAIL, "NodeDown: supervisor pid 9 died")
    with pytest.raises(InvalidTransition):
        apply_event(pending, Event.START, 1.0)


def test_unlimited_job_has_no_end_time():
    running = started(_record(), Placement("cpu", (Holding("cpu-1", 1, 256),)), 5.0)
    assert running.end_time is None and time_left(running, 1e9) is None


@pytest.mark.parametrize("codes, event", [
    ({"cpu-1": 0}, Event.EXITED_OK), ({"cpu-1": 0, "cpu-2": 0}, Event.EXITED_OK),
    ({"cpu-1": 0, "cpu-2": 1}, Event.EXITED_ERROR), ({"cpu-1": -15}, Event.EXITED_ERROR),
    ({}, Event.EXITED_ERROR),
])
def test_exit_event(codes, event):
    assert exit_event(codes) is event


@pytest.mark.parametrize("start, limit, lead, expected", [
    (100.0, 60, 20, 140.0),
    (100.0, 60, None, None),
    (100.0, None, 20, None),
    (100.0, 20, 20, 100.0),
    (100.0, 20, 600, 100.0),  # lead longer than the limit: at once
])
def test_warning_time(start, limit, lead, expected):
    assert warning_time(start, limit, lead) == expected


def test_time_left_and_job_info():
    running = started(_record(time_limit=60), Placement("cpu", (Holding("cpu-1", 1, 256),)), 100.0)
    assert time_left(running, 130.0) == 30.0
    assert time_left(running, 500.0) == 0.0
    assert time_left(_record(), 100.0) is None
    completing = apply_event(running, Event.CANCEL, 140.0)
    assert time_left(completing, 141.0) == 0.0
    assert time_left(apply_event(completing, Event.EXITED_OK, 142.0), 142.0) is None
    info = job_info(running, 110.0)
    assert (info.job_id, info.name, info.state, info.partition, info.nodes, info.time_left) == (
        "7", "job", JobState.RUNNING, "cpu", ("cpu-1",), 50.0)


# ==========================================================================
# Pure: the supervisor's steps.

def _view(**changes) -> RunView:
    base = RunView(now=100.0, state=JobState.RUNNING, end_time=160.0, warning_at=140.0, warning_sent=False,
                   cancel_requested=False, teardown_since=None, kill_wait=5.0, killed=False, nodes_alive=2)
    return replace(base, **changes)


@pytest.mark.parametrize("view, action", [
    (_view(), Wait(140.0)),
    (_view(warning_sent=True), Wait(160.0)),
    (_view(warning_at=None), Wait(160.0)),
    (_view(end_time=None, warning_at=None), Wait(None)),
    (_view(now=140.0), SendWarning()),
    (_view(now=150.0, warning_sent=True), Wait(160.0)),
    (_view(now=160.0), BeginEnding(Event.TIME_LIMIT)),  # the limit wins over a warning due too
    (_view(now=160.0, warning_sent=True), BeginEnding(Event.TIME_LIMIT)),
    (_view(cancel_requested=True), BeginEnding(Event.CANCEL)),
    (_view(now=170.0, cancel_requested=True), BeginEnding(Event.CANCEL)),  # cancel wins over the limit
    (_view(nodes_alive=0), Finish()),
    (_view(nodes_alive=0, cancel_requested=True, now=999.0), Finish()),
    (_view(state=JobState.COMPLETING, teardown_since=100.0, now=101.0), Wait(105.0)),
    (_view(state=JobState.COMPLETING, teardown_since=100.0, now=105.0), Kill()),
    (_view(state=JobState.COMPLETING, teardown_since=100.0, now=106.0, killed=True), Wait(None)),
    (_view(state=JobState.COMPLETING, teardown_since=100.0, nodes_alive=0), Finish()),
    (_view(state=JobState.COMPLETING, teardown_since=100.0, now=101.0, cancel_requested=True), Wait(105.0)),
])
def test_decide(view, action):
    assert decide(view) == action


def test_decide_refuses_a_job_that_is_not_started():
    with pytest.raises(InvalidTransition):
        decide(_view(state=JobState.PENDING))


# ==========================================================================
# Pure: environment, argv, signals, records, output names.

def test_node_environment():
    record = started(_record(env={"MY": "1", "SLURM_JOB_ID": "spoof"}, name="demo"),
                     Placement("gpu-a", (Holding("gpua-1", 3, 768, (2, 3)),)), 1.0)
    base = {"PATH": "/bin", "SLURM_JOB_ID": "41", "SLURM_NODEID": "5", "CUDA_VISIBLE_DEVICES": "0"}
    env = node_environment(record, 0, base, "127.0.0.13")
    assert env["PATH"] == "/bin" and env["MY"] == "1"
    assert env["SLURM_JOB_ID"] == "7" and env["SLURM_JOB_NAME"] == "demo"
    assert env["SLURM_JOB_NODELIST"] == "gpua-1" and env["SLURM_NNODES"] == "1"
    assert env["SLURM_NODEID"] == "0" and env["SLURMD_NODENAME"] == "gpua-1"
    assert env["SLURM_CPUS_ON_NODE"] == "3" and env["SLURM_JOB_PARTITION"] == "gpu-a"
    assert env["SLURM_MEM_PER_NODE"] == "768"       # what the node holds, as --mem gives it
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["SLURM_GPUS_ON_NODE"] == "2"
    assert env["ELASTIC_RAY_NODE_IP"] == "127.0.0.13"


def test_node_environment_of_a_cpu_job_drops_inherited_gpu_and_slurm_values():
    record = started(_record(), Placement("cpu", (Holding("cpu-1", 1, 256), Holding("cpu-2", 1, 256))), 1.0)
    env = node_environment(record, 1, {"CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1"}, "127.0.0.12")
    assert "CUDA_VISIBLE_DEVICES" not in env and "SLURM_GPUS_ON_NODE" not in env
    assert env["SLURM_JOB_NODELIST"] == "cpu-[1-2]" and env["SLURM_NODEID"] == "1"
    assert env["SLURMD_NODENAME"] == "cpu-2" and env["SLURM_CPUS_ON_NODE"] == "1"


def test_node_argv():
    assert node_argv(_record(node_argv=("a", "b c"))) == ["a", "b c"]
    argv = node_argv(_record(node_argv=("a", "b c"), pre_start_commands=("export X=1", "cd /")))
    assert argv[:2] == ["bash", "-c"] and argv[3:] == ["elastic-ray-node", "a", "b c"]
    assert "export X=1\ncd /\n" in argv[2] and argv[2].endswith('exec "$@"\n')


@pytest.mark.parametrize("text, sig", [
    ("USR1", signal.SIGUSR1), ("SIGUSR1", signal.SIGUSR1), ("usr1", signal.SIGUSR1),
    ("15", signal.SIGTERM), (9, signal.SIGKILL), (" TERM ", signal.SIGTERM),
])
def test_parse_signal_name(text, sig):
    assert parse_signal_name(text) is sig


@pytest.mark.parametrize("text", ["NOPE", "999", "", None])
def test_parse_signal_name_refuses(text):
    with pytest.raises(ValueError):
        parse_signal_name(text)


def test_record_round_trip_and_validation():
    record = started(_record(env={"A": "b"}, time_limit=30, warning_signal="USR1", warning_seconds=10,
                             supervisor=ProcRef(12, 3.5)),
                     Placement("gpu-b", (Holding("gpub-1", 2, 512, (0, 1)),)), 7.0)
    record = replace(apply_event(record, Event.CANCEL, 9.0), node_procs=(ProcRef(13, 4.5, "gpub-1"),))
    data = json.loads(json.dumps(record.to_dict()))
    assert JobRecord.from_dict(data) == record
    for key, bad in [("state", "BOGUS"), ("job_id", "x1"), ("holdings", "no"), ("env", {"A": 1}),
                     ("version", 99), ("supervisor", {"pid": -1, "create_time": 1.0}), ("submit_time", True)]:
        broken = dict(data, **{key: bad})
        with pytest.raises(ValueError):
            JobRecord.from_dict(broken)
    with pytest.raises(ValueError, match="missing key"):
        JobRecord.from_dict({k: v for k, v in data.items() if k != "name"})


@pytest.mark.parametrize("pattern, expected", [
    ("out-%j.txt", "/w/out-12.txt"), ("%x-%j.log", "/w/demo-12.log"), ("/abs/%j", "/abs/12"),
    ("100%%-%j", "/w/100%-12"), ("odd%", "/w/odd%"),
])
def test_resolve_output(pattern, expected):
    assert str(resolve_output(pattern, "12", "demo", Path("/w"))) == expected


# ==========================================================================
# Real processes.

KILL_WAIT = 1.0


def _kill_leftovers(state_dir: Path) -> None:
    """Teardown: SIGKILL every supervisor and node process group a test left, by verified pid."""
    for path in (state_dir / "jobs").glob("*.json"):
        try:
            data = json.loads(path.read_text())
            record = JobRecord.from_dict(data)
        except (ValueError, OSError):
            continue
        for proc in record.node_procs:
            send_group(proc, signal.SIGKILL)
        if record.supervisor is not None:
            send(record.supervisor, signal.SIGKILL)


@pytest.fixture
def sched(tmp_path):
    scheduler = LocalScheduler(tmp_path / "state", LocalCluster.default(kill_wait=KILL_WAIT))
    yield scheduler
    _kill_leftovers(scheduler.state_dir)


@pytest.fixture
def script(tmp_path):
    return write_marker_script(tmp_path)


def _spec(tmp_path, name="t", argv=("true",), **alloc) -> JobSpec:
    return JobSpec(job_name=name, role="worker", allocation=Alloc(**alloc), node_argv=tuple(argv),
                   workdir=tmp_path, output=f"{name}-%j.out")


def _state(sched, job_id, name="t"):
    return sched.query(name, [job_id])[job_id].state


def _wait_state(sched, job_id, states, timeout=10.0, name="t"):
    states = {states} if isinstance(states, JobState) else set(states)
    return wait_until(lambda: (info := sched.query(name, [job_id])[job_id]).state in states and info,
                      timeout, interval=0.05, message=f"job {job_id} in {sorted(s.value for s in states)}")


def _record_of(sched, job_id) -> JobRecord:
    return sched.store.read(job_id)


def test_walltime_sends_the_warning_first_then_times_out(sched, tmp_path, script):
    marker = tmp_path / "marker"
    spec = _spec(tmp_path, argv=(sys.executable, str(script), str(marker)), num_nodes=2,
                 time_limit="0:04", signal_before_timeout="USR1@2")
    job = sched.submit(spec)
    info = _wait_state(sched, job, JobState.TIMEOUT, timeout=15)
    events = marker_events(marker)
    for node in ("0", "1"):
        kinds = [e[0] for e in events if e[1] == node]
        assert kinds == ["ready", "usr1", "term"], events
    start = info.start_time
    usr1 = [e[4] for e in events if e[0] == "usr1"]
    term = [e[4] for e in events if e[0] == "term"]
    # The warning comes 2 s before the 4 s limit, the TERM at the limit (upper
    # bounds are loose: a loaded machine may be slow to deliver, never early).
    assert all(start + 1.9 < t < start + 3.5 for t in usr1), (start, usr1)
    assert all(start + 3.9 < t < start + 7.0 for t in term), (start, term)
    assert info.reason == "TimeLimit"
    output = Path(_record_of(sched, job).output).read_text()
    assert "CANCELLED DUE TO TIME LIMIT" in output


def test_cancel_kills_a_node_that_ignores_term_after_kill_wait(sched, tmp_path, script):
    marker = tmp_path / "marker"
    job = sched.submit(_spec(tmp_path, argv=(sys.executable, str(script), str(marker), "--ignore-term")))
    wait_until(lambda: any(e[0] == "ready" for e in marker_events(marker)), 10, 0.05, "node ready")
    node_pid = _record_of(sched, job).node_procs[0].pid
    t0 = time.time()
    sched.cancel(job)
    wait_until(lambda: _state(sched, job) is JobState.COMPLETING, 5, 0.02, "COMPLETING")
    _wait_state(sched, job, JobState.CANCELLED, timeout=10)
    took = time.time() - t0
    assert KILL_WAIT * 0.8 < took < KILL_WAIT + 3, took
    assert [e[0] for e in marker_events(marker)] == ["ready", "term"]
    assert not psutil.pid_exists(node_pid) or psutil.Process(node_pid).status() == psutil.STATUS_ZOMBIE
    record = _record_of(sched, job)
    assert record.exit_codes == {"cpu-1": -signal.SIGKILL}


def test_pending_job_starts_when_capacity_frees(sched, tmp_path, script):
    release = tmp_path / "release"
    hog = sched.submit(_spec(tmp_path, argv=(sys.executable, str(script), str(tmp_path / "m1"),
                                             "--exit-when", str(release)), num_nodes=2, cpus_per_task=4))
    _wait_state(sched, hog, JobState.RUNNING)
    waiter = sched.submit(_spec(tmp_path, argv=("true",)))
    info = wait_until(lambda: (i := sched.query("t", [waiter])[waiter]).reason == "Resources" and i,
                      5, 0.05, "waiter pending for Resources")
    assert info.state is JobState.PENDING and info.start_time is None
    # It stays pending while the hog runs (polled a few scheduling rounds).
    stays(lambda: _state(sched, waiter) is JobState.PENDING, 4 * sched.cluster.sched_interval, 0.05,
          f"job {waiter} staying PENDING", show=lambda: _state(sched, waiter))
    release.touch()
    hog_info = _wait_state(sched, hog, JobState.COMPLETED)
    waiter_info = _wait_state(sched, waiter, JobState.COMPLETED, timeout=5)
    assert waiter_info.start_time >= hog_info.end_time
    assert waiter_info.start_time - hog_info.end_time < 2.0


def test_failed_node_makes_the_job_failed_with_exit_codes(sched, tmp_path):
    job = sched.submit(_spec(tmp_path, argv=("bash", "-c", 'exit $((SLURM_NODEID * 3))'), num_nodes=2))
    info = _wait_state(sched, job, {JobState.FAILED, JobState.COMPLETED})
    assert info.state is JobState.FAILED and info.reason == "NonZeroExitCode"
    assert _record_of(sched, job).exit_codes == {"cpu-1": 0, "cpu-2": 3}


def test_unstartable_node_command_fails_the_job(sched, tmp_path):
    job = sched.submit(_spec(tmp_path, argv=("/nonexistent/command",)))
    _wait_state(sched, job, JobState.FAILED)
    assert _record_of(sched, job).exit_codes == {"cpu-1": 127}
    assert "cannot start" in Path(_record_of(sched, job).output).read_text()


def test_pre_start_commands_reach_the_node_command_and_their_failure_fails_the_job(sched, tmp_path):
    out = tmp_path / "seen"
    job = sched.submit(replace(_spec(tmp_path, argv=("bash", "-c", f'echo "$GREETING $MINE" > {out}')),
                               pre_start_commands=("export GREETING=hi",), env={"MINE": "there"}))
    _wait_state(sched, job, JobState.COMPLETED)
    assert out.read_text().strip() == "hi there"
    bad = sched.submit(replace(_spec(tmp_path, argv=("true",)), pre_start_commands=("false",)))
    _wait_state(sched, bad, JobState.FAILED)


def test_daemons_started_by_a_node_die_with_the_job(sched, tmp_path, script):
    """Like proctrack/cgroup: what a node command daemonizes does not outlive the job."""
    pidfile, release = tmp_path / "daemon.pid", tmp_path / "release"
    job = sched.submit(_spec(tmp_path, argv=(sys.executable, str(script), str(tmp_path / "m"),
                                             "--daemon", str(pidfile), "--exit-when", str(release))))
    daemon = int(wait_until(lambda: pidfile.exists() and pidfile.read_text(), 10, 0.05, "daemon pid"))
    assert psutil.pid_exists(daemon)
    daemon_proc = psutil.Process(daemon)
    release.touch()
    _wait_state(sched, job, JobState.COMPLETED)
    wait_until(lambda: not daemon_proc.is_running() or daemon_proc.status() == psutil.STATUS_ZOMBIE,
               5, 0.05, "daemon gone")


def test_killed_supervisor_is_reported_and_its_nodes_freed(sched, tmp_path, script):
    marker = tmp_path / "m"
    job = sched.submit(_spec(tmp_path, argv=(sys.executable, str(script), str(marker)),
                             num_nodes=2, cpus_per_task=4))
    wait_until(lambda: len([e for e in marker_events(marker) if e[0] == "ready"]) == 2, 10, 0.05, "nodes ready")
    record = _record_of(sched, job)
    waiter = sched.submit(_spec(tmp_path, argv=("true",)))
    _wait_state(sched, waiter, JobState.PENDING)
    os.kill(record.supervisor.pid, signal.SIGKILL)
    info = _wait_state(sched, job, JobState.NODE_FAIL, timeout=5)
    assert "supervisor" in info.reason
    # Its node processes were killed, and the pending job got the nodes.
    wait_until(lambda: not any(is_alive(p) for p in record.node_procs), 5, 0.05, "node processes gone")
    _wait_state(sched, waiter, JobState.COMPLETED, timeout=5)
    assert "event=job.lost" in (sched.state_dir / "scheduler.log").read_text()


def test_killed_pending_supervisor_fails_the_job(sched, tmp_path):
    job = sched.submit(_spec(tmp_path, argv=("sleep", "30"), partition="gpu-b", gpus_per_node=2))
    _wait_state(sched, job, JobState.RUNNING)
    pending = sched.submit(_spec(tmp_path, argv=("true",), partition="gpu-b", gpus_per_node=1))
    _wait_state(sched, pending, JobState.PENDING)
    os.kill(_record_of(sched, pending).supervisor.pid, signal.SIGKILL)
    info = _wait_state(sched, pending, JobState.FAILED, timeout=5)
    assert info.start_time is None
    sched.cancel(job)
    _wait_state(sched, job, JobState.CANCELLED)


def test_damaged_record_is_ended_unknown_and_logged(sched, tmp_path):
    job = sched.submit(_spec(tmp_path, name="dmg", argv=("true",)))
    _wait_state(sched, job, JobState.COMPLETED, name="dmg")
    sched.store.record_path(job).write_text('{"version": 1, "job_id": ')  # truncated
    other = sched.submit(_spec(tmp_path, name="dmg", argv=("true",)))
    result = sched.query("dmg", [job, other])
    assert result[job].state is JobState.ENDED_UNKNOWN and "damaged" in result[job].reason
    assert result[other].state in (JobState.PENDING, JobState.RUNNING, JobState.COMPLETED)
    sched.query("dmg", [job])
    log_lines = [line for line in (sched.state_dir / "scheduler.log").read_text().splitlines()
                 if "query.damaged_record" in line]
    assert len(log_lines) == 1 and f"job={job}" in log_lines[0]  # logged once, not at every poll
    sched.cancel(job)  # a no-op, not a crash
    assert sched.store.record_path(job).read_text() == '{"version": 1, "job_id": '  # kept for inspection
    # Garbage that is valid JSON is refused too.
    sched.store.record_path(job).write_text(json.dumps({"version": 1, "job_id": job, "state": "RUNNING"}))
    assert sched.query("dmg", [job])[job].state is JobState.ENDED_UNKNOWN


def test_cancel_pending_is_immediate_and_cancel_ended_or_unknown_is_a_noop(sched, tmp_path):
    hog = sched.submit(_spec(tmp_path, argv=("sleep", "30"), partition="gpu-b", gpus_per_node=2))
    _wait_state(sched, hog, JobState.RUNNING)
    pending = sched.submit(_spec(tmp_path, argv=("true",), partition="gpu-b", gpus_per_node=2))
    supervisor = _record_of(sched, pending).supervisor
    sched.cancel(pending)
    assert _state(sched, pending) is JobState.CANCELLED  # at once, no waiting
    wait_until(lambda: not is_alive(supervisor), 5, 0.05, "pending supervisor exits")
    sched.cancel(pending)
    sched.cancel("424242")
    sched.cancel_by_name("t")
    _wait_state(sched, hog, JobState.CANCELLED, timeout=5)


def test_signal_batch_reaches_only_the_first_node(sched, tmp_path, script):
    marker = tmp_path / "m"
    job = sched.submit(_spec(tmp_path, argv=(sys.executable, str(script), str(marker)), num_nodes=2))
    wait_until(lambda: len([e for e in marker_events(marker) if e[0] == "ready"]) == 2, 10, 0.05, "ready")
    sched.signal(job, "USR1", batch=True)
    wait_until(lambda: [e[1] for e in marker_events(marker) if e[0] == "usr1"] == ["0"], 5, 0.05, "usr1 on 0")
    sched.signal(job, "SIGUSR1")
    wait_until(lambda: sorted(e[1] for e in marker_events(marker) if e[0] == "usr1") == ["0", "0", "1"],
               5, 0.05, "usr1 on both")
    with pytest.raises(SchedulerError):
        sched.signal(job, "NOPE")
    sched.cancel(job)
    _wait_state(sched, job, JobState.CANCELLED)
    with pytest.raises(SchedulerError, match="not running"):
        sched.signal(job, "USR1")
    with pytest.raises(SchedulerError, match="Invalid job id"):
        sched.signal("424242", "USR1")


def test_test_only_predicts_start(sched, tmp_path):
    spec = _spec(tmp_path, argv=("true",), num_nodes=2)
    now = time.time()
    assert now - 1 <= sched.test_only(spec) <= time.time() + 1
    hog = sched.submit(_spec(tmp_path, argv=("sleep", "60"), num_nodes=2, cpus_per_task=4, time_limit="5"))
    info = _wait_state(sched, hog, JobState.RUNNING)
    assert sched.test_only(spec) == pytest.approx(info.end_time)
    assert sched.test_only(_spec(tmp_path, partition="gpu-a")) <= time.time() + 1
    with pytest.raises(SchedulerError, match="not available"):
        sched.test_only(_spec(tmp_path, partition="gpu-b", gpus_per_node=4))
    with pytest.raises(SchedulerError, match="not available"):
        sched.submit(_spec(tmp_path, num_nodes=3))
    assert sched.calls["test_only"] == 4


def test_submit_refuses_missing_workdir_and_output_dir(sched, tmp_path):
    with pytest.raises(SchedulerError, match="workdir"):
        sched.submit(replace(_spec(tmp_path), workdir=tmp_path / "missing"))
    with pytest.raises(SchedulerError, match="output"):
        sched.submit(replace(_spec(tmp_path), output="no/such/dir/%j.out"))


def test_state_dir_keeps_its_cluster(tmp_path):
    first = LocalScheduler(tmp_path / "s", LocalCluster.default(kill_wait=2.0))
    assert LocalScheduler(tmp_path / "s").cluster == first.cluster  # later users inherit it
    with pytest.raises(SchedulerError, match="another cluster"):
        LocalScheduler(tmp_path / "s", LocalCluster.default())
    custom = LocalCluster(nodes=(LocalNode("n-1", "127.0.0.21", "p", cpus=1),), default_partition="p")
    assert LocalScheduler(tmp_path / "c", custom).cluster.partitions == {"p": custom.nodes}


SUBMITTER = r"""
import sys, time
from pathlib import Path
from elastic_ray.config import SlurmRunAllocationConfig
from elastic_ray.scheduler.base import JobSpec
from elastic_ray.scheduler.local import LocalScheduler
state, work, go, count = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
sched = LocalScheduler(state)
spec = JobSpec(job_name="many", role="worker", allocation=SlurmRunAllocationConfig(), node_argv=("true",),
               workdir=work, output="many-%j.out")
(work / f"ready-{sys.argv[5]}").touch()
while not go.exists():
    time.sleep(0.005)
print(" ".join(sched.submit(spec) for _ in range(count)), flush=True)
"""


def test_concurrent_submitters_get_distinct_ids(sched, tmp_path):
    go = tmp_path / "go"
    counts = [3, 3, 2, 2]
    procs = [subprocess.Popen([sys.executable, "-c", SUBMITTER, str(sched.state_dir), str(tmp_path), str(go),
                               str(n), str(i)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i, n in enumerate(counts)]
    try:
        # Release them together once all are imported, so the submissions really overlap.
        wait_until(lambda: len(list(tmp_path.glob("ready-*"))) == len(procs), 30, 0.02, "submitters ready")
        go.touch()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert all(p.returncode == 0 for p in procs), outputs
    ids = [job for out, _ in outputs for job in out.split()]
    assert len(ids) == 10 and len(set(ids)) == 10, ids
    assert sorted(int(i) for i in ids) == list(range(1, 11))
    final = wait_until(lambda: (r := sched.query("many", ids)) and all(i.state.is_final for i in r.values()) and r,
                       20, 0.1, "all ten jobs ended")
    assert {info.state for info in final.values()} == {JobState.COMPLETED}


def test_node_processes_die_with_a_killed_supervisor_even_before_anyone_notices(sched, tmp_path, script):
    """No query runs here: the node processes must not wait for a reaper to find them."""
    marker = tmp_path / "m"
    job = sched.submit(_spec(tmp_path, argv=(sys.executable, str(script), str(marker))))
    wait_until(_ready_count(marker, 1), 10, 0.05, "node ready")
    record = _record_of(sched, job)
    node = psutil.Process(record.node_procs[0].pid)
    os.kill(record.supervisor.pid, signal.SIGKILL)
    wait_until(lambda: not node.is_running() or node.status() == psutil.STATUS_ZOMBIE, 5, 0.05, "node gone")


def _ready_count(marker: Path, count: int):
    return lambda: len([e for e in marker_events(marker) if e[0] == "ready"]) >= count
