"""The run as the decisions see it (coordinator/scaling/view.py), and the estimates' rate limit, by table."""

from __future__ import annotations

import math

import pytest

from elastic_ray import SchedulerError, SlurmWorkerAllocationConfig
from elastic_ray.autoscale import AutoscalePolicy, Pool
from elastic_ray.autoscale.demand import RayNode
from elastic_ray.autoscale.records import Phase
from elastic_ray.coordinator.scaling import view
from elastic_ray.coordinator.scaling.estimates import Estimates
from elastic_ray.coordinator.scaling.store import Tracked
from elastic_ray.protocol.disk.records import AllocationRecord, WorkerIntent, WorkerRecord
from elastic_ray.scheduler.base import JobInfo, JobState
from tests.helpers import node_state

NOW = 10_000.0
GPU = SlurmWorkerAllocationConfig(partition="gpu-b", num_nodes=1, gpus_per_node=2, cpus_per_task=4)
CPU2 = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=2, cpus_per_task=8)
POLICY = AutoscalePolicy(pools=[Pool(CPU2), Pool(GPU, max_allocations=2)])
HEAD = "1"


def worker(job: str, config=GPU, **kw) -> WorkerRecord:
    return WorkerRecord(job_id=job, config=config.to_dict(), submitted_at=NOW - 100, **kw)


def info(job: str, state: JobState, end: float | None = NOW + 3600) -> JobInfo:
    return JobInfo(job_id=job, name="er", state=state, end_time=end if state is JobState.RUNNING else None)


def joined(job: str, node: str, ray_id: str, head: str = HEAD):
    return node_state(job, node, "JOINED", node_id=ray_id, head_job=head)


def ray(node_id: str, idle: float, total=None) -> RayNode:
    total = total or {"CPU": 4.0, "GPU": 2.0}
    return RayNode(node_id, total, total, idle, True)


def one(workers, jobs, nodes, ray_nodes=(), tracked=None, pointer=HEAD):
    record = AllocationRecord(head_job=HEAD, workers={w.job_id: w for w in workers})
    return view.allocations(POLICY, record, jobs, nodes, ray_nodes, tracked or {}, pointer, NOW)


MINE = {"7": Tracked(GPU.to_dict(), NOW - 50)}


@pytest.mark.parametrize("case, workers, jobs, nodes, ray_nodes, tracked, expected", [
    ("queued in Slurm", [worker("7")], {"7": info("7", JobState.PENDING)}, {}, [], MINE,
     [("7", 1, Phase.QUEUED, None)]),
    ("running, its node not joined yet", [worker("7")], {"7": info("7", JobState.RUNNING)}, {}, [], MINE,
     [("7", 1, Phase.STARTING, None)]),
    ("running, joined a head that is not the current one", [worker("7")], {"7": info("7", JobState.RUNNING)},
     {"7": {"g": joined("7", "g", "aa", head="99")}}, [ray("aa", 5)], MINE, [("7", 1, Phase.STARTING, None)]),
    ("running and busy", [worker("7")], {"7": info("7", JobState.RUNNING)}, {"7": {"g": joined("7", "g", "aa")}},
     [ray("aa", 0)], MINE, [("7", 1, Phase.RUNNING, None)]),
    ("running and idle 40 s", [worker("7")], {"7": info("7", JobState.RUNNING)}, {"7": {"g": joined("7", "g", "aa")}},
     [ray("aa", 40)], MINE, [("7", 1, Phase.RUNNING, NOW - 40)]),
    ("joined but unknown to Ray: not idle", [worker("7")], {"7": info("7", JobState.RUNNING)},
     {"7": {"g": joined("7", "g", "aa")}}, [], MINE, [("7", 1, Phase.RUNNING, None)]),
    ("two nodes: idle since the later one went idle", [worker("8", CPU2)], {"8": info("8", JobState.RUNNING)},
     {"8": {"a": joined("8", "a", "aa"), "b": joined("8", "b", "bb")}}, [ray("aa", 40), ray("bb", 10)],
     {"8": Tracked(CPU2.to_dict(), NOW - 50)}, [("8", 0, Phase.RUNNING, NOW - 10)]),
    ("two nodes, one busy: not idle", [worker("8", CPU2)], {"8": info("8", JobState.RUNNING)},
     {"8": {"a": joined("8", "a", "aa"), "b": joined("8", "b", "bb")}}, [ray("aa", 40), ray("bb", 0)],
     {"8": Tracked(CPU2.to_dict(), NOW - 50)}, [("8", 0, Phase.RUNNING, None)]),
    ("the session drains it", [worker("7", state=WorkerIntent.DRAINING)], {"7": info("7", JobState.RUNNING)},
     {}, [], MINE, [("7", 1, Phase.DRAINING, None)]),
    ("the autoscaler ended it", [worker("7")], {"7": info("7", JobState.PENDING)}, {}, [],
     {"7": Tracked(GPU.to_dict(), NOW - 50, ending=True)}, [("7", 1, Phase.DRAINING, None)]),
    ("its node drains at the walltime signal", [worker("7")], {"7": info("7", JobState.RUNNING)},
     {"7": {"g": node_state("7", "g", "DRAINING", node_id="aa", head_job=HEAD)}}, [ray("aa", 0)], MINE,
     [("7", 1, Phase.DRAINING, None)]),
    ("one node left, the other still joined", [worker("8", CPU2)], {"8": info("8", JobState.RUNNING)},
     {"8": {"a": joined("8", "a", "aa"), "b": node_state("8", "b", "LEFT", exited=True)}}, [ray("aa", 9)],
     {"8": Tracked(CPU2.to_dict(), NOW - 50)}, [("8", 0, Phase.DRAINING, None)]),
    ("a node asked to drain, still joined", [worker("7")], {"7": info("7", JobState.RUNNING)},
     {"7": {"g": node_state("7", "g", "JOINED", node_id="aa", head_job=HEAD, drain_deadline=NOW + 60)}},
     [ray("aa", 0)], MINE, [("7", 1, Phase.DRAINING, None)]),
    ("a node waiting out a restart: still on its way", [worker("7")], {"7": info("7", JobState.RUNNING)},
     {"7": {"g": node_state("7", "g", "RESTART_BACKOFF", head_job=HEAD)}}, [], MINE,
     [("7", 1, Phase.STARTING, None)]),
    ("its agent gave up on the current head: it counts for nothing", [worker("7")],
     {"7": info("7", JobState.RUNNING)},
     {"7": {"g": node_state("7", "g", "GAVE_UP", head_job=HEAD, gave_up_on=HEAD)}}, [], MINE,
     [("7", 1, Phase.GAVE_UP, None)]),
    ("gave up on a head that moved on: it follows the new one", [worker("7")], {"7": info("7", JobState.RUNNING)},
     {"7": {"g": node_state("7", "g", "GAVE_UP", head_job="99", gave_up_on="99")}}, [], MINE,
     [("7", 1, Phase.STARTING, None)]),
    ("one node joined, the other gave up: it never fills", [worker("8", CPU2)], {"8": info("8", JobState.RUNNING)},
     {"8": {"a": joined("8", "a", "aa"), "b": node_state("8", "b", "GAVE_UP", head_job=HEAD, gave_up_on=HEAD)}},
     [ray("aa", 50)], {"8": Tracked(CPU2.to_dict(), NOW - 50)}, [("8", 0, Phase.GAVE_UP, None)]),
    ("COMPLETING", [worker("7")], {"7": info("7", JobState.COMPLETING)}, {}, [], MINE,
     [("7", 1, Phase.DRAINING, None)]),
    ("ended: left out", [worker("7")], {"7": info("7", JobState.COMPLETED)}, {}, [], MINE, []),
    ("removed: left out", [worker("7", state=WorkerIntent.REMOVED)], {"7": info("7", JobState.RUNNING)}, {}, [],
     MINE, []),
    ("not the autoscaler's: no pool", [worker("7")], {"7": info("7", JobState.PENDING)}, {}, [], {},
     [("7", None, Phase.QUEUED, None)]),
    ("a pool the policy no longer has: no pool", [worker("7")], {"7": info("7", JobState.PENDING)}, {}, [],
     {"7": Tracked({**GPU.to_dict(), "partition": "gone"}, NOW)}, [("7", None, Phase.QUEUED, None)]),
])
def test_allocations(case, workers, jobs, nodes, ray_nodes, tracked, expected):
    got = one(workers, jobs, nodes, ray_nodes, tracked)
    assert [(a.job_id, a.pool, a.phase, a.idle_since) for a in got] == expected, case


def test_capacity_is_ray_s_once_every_node_is_known_else_the_pool_s_shape():
    queued = one([worker("8", CPU2)], {"8": info("8", JobState.PENDING)}, {})[0]
    assert queued.capacity == ({"CPU": 8.0},) * 2
    running = one([worker("7")], {"7": info("7", JobState.RUNNING)}, {"7": {"g": joined("7", "g", "aa")}},
                  [ray("aa", 0, {"CPU": 4.0, "GPU": 2.0, "memory": 1e9})])[0]
    assert running.capacity == ({"CPU": 4.0, "GPU": 2.0, "memory": 1e9},)
    assert running.end_time == NOW + 3600 and queued.end_time is None
    assert queued.free == () and running.free == ({"CPU": 4.0, "GPU": 2.0, "memory": 1e9},)


def test_an_allocation_that_gave_up_says_why_and_offers_nothing_free():
    got = one([worker("7")], {"7": info("7", JobState.RUNNING)},
              {"7": {"g": node_state("7", "g", "GAVE_UP", head_job=HEAD, gave_up_on=HEAD,
                                     reason="Ray ended 4 times under head 1 (exit 1); staying out until another head")}})
    assert got[0].phase is Phase.GAVE_UP and not got[0].phase.counts and got[0].free == ()
    assert got[0].why == "node g: Ray ended 4 times under head 1 (exit 1); staying out until another head"


def test_the_head_s_allocation_is_marked():
    got = one([worker("7"), worker("9", hosts_run_head=True)],
              {"7": info("7", JobState.PENDING), "9": info("9", JobState.PENDING)}, {}, pointer="7")
    assert [a.hosts_head for a in got] == [True, True]


# ---------------------------------------------------------------- estimates

def test_a_pool_is_asked_at_most_once_a_minute_answered_or_not():
    asked = []

    def predict(config):
        asked.append(config.partition)
        if config.partition == "cpu":
            raise SchedulerError("sbatch: error: Requested node configuration is not available")
        return NOW + 120

    est = Estimates()
    clock = lambda: NOW  # noqa: E731
    assert est.ask(GPU, predict, NOW, clock) and est.ask(CPU2, predict, NOW, clock)
    assert not est.ask(GPU, predict, NOW + 30, clock) and not est.ask(CPU2, predict, NOW + 59, clock)
    assert est.ask(GPU, predict, NOW + 60, lambda: NOW + 60)
    assert asked == ["gpu-b", "cpu", "gpu-b"]
    got = est.for_policy(POLICY)
    assert got[1].start_in == pytest.approx(60.0) and got[0].start_in is None
    assert "not available" in est.to_dict(POLICY)["0"]["error"]


def test_a_start_is_counted_from_the_answer_not_the_turn_s_start():
    est = Estimates()
    est.ask(GPU, lambda c: NOW + 1.5, NOW, lambda: NOW + 1.5)      # "now", said 1.5 s into the turn
    assert est.for_policy(POLICY)[1].start_in == 0.0


def test_an_endless_wait_is_an_unknown_start_and_a_takeover_keeps_the_answers():
    est = Estimates()
    est.ask(GPU, lambda c: math.inf, NOW)
    assert est.for_policy(POLICY)[1].start_in is None
    later = Estimates()
    later.load(POLICY, {"1": {"start_in": 5.0, "asked_at": NOW}, "9": {"asked_at": NOW}, "0": {"bad": 1}})
    assert later.for_policy(POLICY)[1].start_in == 5.0 and not later.may_ask(view_key(GPU), NOW + 1)


def view_key(config):
    from elastic_ray.coordinator.scaling.estimates import pool_key
    return pool_key(config)
