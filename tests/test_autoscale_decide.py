"""The autoscaler's decisions (elastic_ray/autoscale/decide.py), by table: pure, no Slurm, no Ray."""

from __future__ import annotations

import pytest

from elastic_ray import SlurmWorkerAllocationConfig as W
from elastic_ray.autoscale import AutoscalePolicy, Pool
from elastic_ray.autoscale.decide import (Allocation, Cancel, Demand, Drain, Estimate, Gang, Memory, Phase, Probe,
                                          Submit, decide)

NOW = 10_000.0
A = W(partition="gpu-a", num_nodes=1, gpus_per_node=4, cpus_per_task=32, ray_resources={"accelerator:a40": 1})
B = W(partition="gpu-b", num_nodes=1, gpus_per_node=2)
A_NODE = {"CPU": 32.0, "GPU": 4.0, "accelerator:a40": 1.0}
B_NODE = {"CPU": 1.0, "GPU": 2.0}
GPU = {"GPU": 1}


def policy(**kw) -> AutoscalePolicy:
    pools = kw.pop("pools", [Pool(A, max_allocations=4), Pool(B, max_allocations=2)])
    return AutoscalePolicy(pools=pools, **kw)


def alloc(job: str, pool: int | None, phase: Phase = Phase.RUNNING, **kw) -> Allocation:
    node = (A_NODE, B_NODE)[pool] if pool is not None else {"CPU": 2.0}
    kw.setdefault("capacity", (node,))
    return Allocation(job, pool, phase, **kw)


def est(a: float | None = 7200.0, b: float | None = 0.0) -> dict[int, Estimate]:
    return {0: Estimate(a, NOW - 5), 1: Estimate(b, NOW - 5)}


def run(p=None, demand=Demand(), allocations=(), estimates=None, memory=None, now=NOW):
    return decide(p or policy(), demand, list(allocations), est() if estimates is None else estimates,
                  memory or Memory(unserved_since=NOW - 40), now)


def submits(decision) -> list[tuple[int, bool, str | None]]:
    return [(a.pool, a.raced, a.replaces) for a in decision.actions if isinstance(a, Submit)]


def kinds(decision, kind) -> list:
    return [a for a in decision.actions if isinstance(a, kind)]


# ------------------------------------------------------------ grow

@pytest.mark.parametrize("kw, demand, allocations, estimates, expected", [
    pytest.param({}, Demand(pending=(GPU,) * 4), (), est(), [(1, False, None)],
                 id="gpu-b-starts-now:one-gpu-b-the-rest-waits-for-the-backlog"),
    pytest.param({"backlog": 2}, Demand(pending=(GPU,) * 4), (), est(), [(1, False, None)] * 2,
                 id="backlog-2:two-gpu-b-not-gpu-a-in-2h"),
    pytest.param({}, Demand(pending=(GPU,) * 4), (), est(a=0.0, b=600.0), [(0, False, None)],
                 id="gpu-a-starts-first:one-4-gpu-node-holds-all"),
    pytest.param({}, Demand(pending=({"accelerator:a40": 1, "GPU": 1},)), (), est(), [(0, False, None)],
                 id="an-a40-request-never-goes-to-gpu-b"),
    pytest.param({}, Demand(pending=(GPU,) * 2), (alloc("7", 1, Phase.QUEUED),), est(), [],
                 id="a-queued-gpu-b-serves-two"),
    pytest.param({}, Demand(pending=(GPU,) * 4), (alloc("7", 1, Phase.QUEUED),), est(), [],
                 id="backlog-of-gpu-b-reached:waits-rather-than-gpu-a-in-2h"),
    pytest.param({}, Demand(pending=(GPU,) * 4), (alloc("7", 1, Phase.STARTING),), est(), [(1, False, None)],
                 id="starting-serves-two:one-more-gpu-b"),
    pytest.param({"backlog": 3}, Demand(pending=(GPU,) * 6), (), est(a=None), [(1, False, None)] * 2
                 + [(0, False, None)], id="gpu-b-at-max-2:the-rest-to-gpu-a"),
    pytest.param({}, Demand(pending=(GPU,) * 3), (), est(a=None, b=None), [(0, False, None)],
                 id="no-estimate:the-policy-s-order"),
    pytest.param({}, Demand(pending=({"GPU": 8},)), (), est(), [], id="fits-no-pool"),
    pytest.param({}, Demand(pending=({"CPU": 0},)), (), est(), [], id="asks-for-nothing"),
])
def test_where_unserved_demand_goes(kw, demand, allocations, estimates, expected):
    decision = run(p=policy(**kw), demand=demand, allocations=allocations, estimates=estimates)
    assert submits(decision) == expected, decision


def test_the_reason_says_what_waits_and_when_each_pool_starts():
    decision = run(p=policy(backlog=2), demand=Demand(pending=(GPU,) * 4))
    reasons = [a.reason for a in kinds(decision, Submit)]
    assert reasons == [f"4 x {{GPU: 1}} pending 40 s; gpu-b starts now; gpu-a in ~2 h: submitted gpu-b ({k} of 2)"
                       for k in (1, 2)], reasons
    waits = run(demand=Demand(pending=(GPU,) * 4))
    assert any(n.startswith("2 unserved wait for a queued submission to start (backlog 1)") for n in waits.notes), \
        waits.notes


def test_a_shape_no_pool_holds_is_a_note_not_a_submission():
    decision = run(demand=Demand(pending=({"GPU": 8},)))
    assert not submits(decision) and decision.unserved == 1
    assert any("{GPU: 8} fits no pool" in n for n in decision.notes), decision.notes


@pytest.mark.parametrize("kw, allocations, expected", [
    pytest.param({"max_nodes": 1, "backlog": 2}, (), [(1, False, None)], id="max-nodes-1:one-node-only"),
    pytest.param({"max_nodes": 2, "backlog": 2}, (alloc("5", 0),), [(1, False, None)],
                 id="max-nodes-counts-running"),
    pytest.param({"max_nodes": 1}, (alloc("5", 0),), [], id="max-nodes-reached"),
    pytest.param({"pools": [Pool(B, max_allocations=1)]}, (alloc("5", 0, capacity=(B_NODE,)),), [],
                 id="max-allocations-reached"),
])
def test_the_bounds(kw, allocations, expected):
    decision = run(p=policy(**kw), demand=Demand(pending=(GPU,) * 4), allocations=allocations,
                   estimates=est() if "pools" not in kw else {0: Estimate(0.0, NOW)})
    assert submits(decision) == expected, decision
    if not expected:
        assert any("at the bounds (max_allocations, max_nodes)" in n for n in decision.notes), decision.notes


def test_demand_waits_demand_delay_before_a_submission_and_flapping_restarts_it():
    p = policy(demand_delay=2.0)
    four = Demand(pending=(GPU,) * 4)
    first = decide(p, four, [], est(), Memory(), NOW)
    assert not submits(first) and first.memory.unserved_since == NOW
    assert any("waiting 2 s" in n for n in first.notes)
    gone = decide(p, Demand(), [], est(), first.memory, NOW + 1)
    assert gone.memory.unserved_since is None and not gone.actions
    back = decide(p, four, [], est(), gone.memory, NOW + 2)
    assert not submits(back) and back.memory.unserved_since == NOW + 2   # the wait starts again
    later = decide(p, four, [], est(), back.memory, NOW + 4)
    assert submits(later) == [(1, False, None)]


def test_probes_only_when_something_is_to_be_placed_and_the_estimate_is_old():
    stale = {0: Estimate(60.0, NOW - 120), 1: Estimate(0.0, NOW - 5)}
    assert kinds(run(demand=Demand(), estimates={}), Probe) == []
    assert [a.pool for a in kinds(run(demand=Demand(pending=(GPU,)), estimates={}), Probe)] == [0, 1]
    assert [a.pool for a in kinds(run(demand=Demand(pending=(GPU,)), estimates=stale), Probe)] == [0]


def test_race_submits_to_every_pool_that_fits_when_no_start_is_known():
    decision = run(p=policy(race=True), demand=Demand(pending=(GPU,) * 2), estimates=est(a=None, b=None))
    assert submits(decision) == [(0, True, None), (1, True, None)], decision
    # A known start: no race.
    assert submits(run(p=policy(race=True), demand=Demand(pending=(GPU,) * 2))) == [(1, False, None)]


# ------------------------------------------------------------ gangs and request_resources

@pytest.mark.parametrize("gang, pools, allocations, expected", [
    pytest.param(Gang(({"GPU": 2},) * 2, "STRICT_SPREAD"), [Pool(B, max_allocations=2)], (),
                 [(0, False, None)] * 2, id="two-nodes-at-once:two-allocations"),
    pytest.param(Gang(({"GPU": 2},) * 2, "STRICT_SPREAD"), [Pool(B, max_allocations=1)], (), [],
                 id="never-half-served:one-allocation-allowed"),
    pytest.param(Gang(({"GPU": 1},) * 2, "STRICT_PACK"), [Pool(B, max_allocations=2)], (), [(0, False, None)],
                 id="strict-pack-on-one-node"),
    pytest.param(Gang(({"GPU": 2},) * 2, "STRICT_SPREAD"), [Pool(B, max_allocations=2)],
                 (alloc("8", 0, Phase.QUEUED, capacity=(B_NODE,)), alloc("9", 0, Phase.QUEUED, capacity=(B_NODE,))),
                 [], id="served-by-two-queued"),
    pytest.param(Gang(({"GPU": 2},) * 2, "STRICT_SPREAD"), [Pool(B, max_allocations=3)],
                 (alloc("8", 0, Phase.QUEUED, capacity=(B_NODE,)),), [(0, False, None)] * 2,
                 id="one-queued-is-not-half-of-it:two-more"),
])
def test_a_placement_group_gets_all_its_nodes_or_none(gang, pools, allocations, expected):
    p = policy(pools=pools, backlog=3)
    decision = run(p=p, demand=Demand(gangs=(gang,)), allocations=allocations,
                   estimates={0: Estimate(0.0, NOW)})
    assert submits(decision) == expected, decision


def test_request_resources_grows_without_tasks_and_keeps_idle_capacity_it_needs():
    three = Demand(constraints=({"CPU": 1},) * 3)
    cpu = W(partition="cpu", num_nodes=1, cpus_per_task=2)
    p = policy(pools=[Pool(cpu, max_allocations=3)], idle_timeout=60)
    node = {"CPU": 2.0}
    one = alloc("5", 0, capacity=(node,), idle_since=NOW - 600)
    decision = run(p=p, demand=three, allocations=[one], estimates={0: Estimate(0.0, NOW)})
    assert submits(decision) == [(0, False, None)]
    assert not kinds(decision, Drain), "the idle allocation holds two of the three requested CPUs"
    # Cleared: the idle allocation goes.
    assert [a.job_id for a in kinds(run(p=p, allocations=[one]), Drain)] == ["5"]


# ------------------------------------------------------------ cancel, shed, replace

def test_a_queued_submission_no_longer_needed_is_cancelled_after_cancel_delay():
    queued = alloc("7", 0, Phase.QUEUED, submitted_at=NOW - 100)
    early = run(allocations=[queued], memory=Memory())
    assert not kinds(early, Cancel) and early.memory.unneeded_since == {"7": NOW}
    late = run(allocations=[queued], memory=early.memory, now=NOW + 31)
    assert [(a.job_id, a.reason) for a in kinds(late, Cancel)] == [("7", "queued gpu-a job 7: not needed for 31 s")]
    # Demand that comes back meanwhile finds it queued and keeps it.
    back = run(demand=Demand(pending=(GPU,)), allocations=[queued], memory=early.memory, now=NOW + 31)
    assert not kinds(back, Cancel) and not submits(back) and back.memory.unneeded_since == {}


def test_a_raced_submission_is_cancelled_as_soon_as_the_demand_is_met():
    started = alloc("8", 1, Phase.STARTING)
    loser = alloc("9", 0, Phase.QUEUED, raced=True)
    decision = run(demand=Demand(pending=(GPU,) * 2), allocations=[started, loser], memory=Memory())
    assert [a.job_id for a in kinds(decision, Cancel)] == ["9"]


def test_min_allocations_is_kept_by_submitting_and_by_not_cancelling_or_draining():
    p = policy(min_allocations=1)
    assert [a.reason for a in kinds(run(p=p), Submit)] == ["below min_allocations=1: submitted gpu-b"]
    queued = alloc("7", 0, Phase.QUEUED)
    assert not kinds(run(p=p, allocations=[queued], now=NOW + 100, memory=Memory({}, {"7": NOW})), Cancel)
    idle = alloc("5", 1, idle_since=NOW - 1000)
    assert not kinds(run(p=p, allocations=[idle]), Drain)


@pytest.mark.parametrize("allocations, drained", [
    pytest.param([alloc("5", 1, idle_since=NOW - 400)], ["5"], id="idle-past-the-timeout"),
    pytest.param([alloc("5", 1, idle_since=NOW - 100)], [], id="idle-not-long-enough"),
    pytest.param([alloc("5", 1)], [], id="busy"),
    pytest.param([alloc("5", 1, Phase.STARTING, idle_since=NOW - 400)], [], id="starting-is-not-idle"),
    pytest.param([alloc("5", None, idle_since=NOW - 400)], [], id="not-the-autoscaler-s"),
    pytest.param([alloc("5", 1, idle_since=NOW - 400, hosts_head=True), alloc("6", 0, idle_since=NOW - 400)],
                 ["6"], id="the-head-s-allocation-stays"),
    pytest.param([alloc("5", 1, idle_since=NOW - 400, hosts_head=True)], [], id="the-head-s-even-as-the-last"),
    pytest.param([alloc("5", 1, idle_since=NOW - 900, hosts_head=True), alloc("6", 1, idle_since=NOW - 400)],
                 ["6"], id="the-head-s-never:the-other-idle-one-goes"),
    pytest.param([alloc("5", 1, idle_since=NOW - 400, hosts_head=True), alloc("6", 0)], [],
                 id="the-head-s-while-another-runs"),
])
def test_shedding(allocations, drained):
    decision = run(p=policy(idle_timeout=300), allocations=allocations)
    assert [a.job_id for a in kinds(decision, Drain)] == drained, decision
    for action in kinds(decision, Drain):
        assert "idle for 400 s (idle_timeout 300 s): drained" in action.reason


GAVE_UP = dict(why="node g: Ray ended 4 times under head 1; staying out until another head")


@pytest.mark.parametrize("kw, allocations, drained, expected_submits", [
    pytest.param({}, [alloc("5", 1, Phase.GAVE_UP, **GAVE_UP)], ["5"], [(1, False, None)],
                 id="the-autoscaler-s:drained-and-the-demand-gets-a-new-one"),
    pytest.param({}, [alloc("5", None, Phase.GAVE_UP, **GAVE_UP)], [], [(1, False, None)],
                 id="the-user-s:never-drained-but-counts-for-nothing"),
    pytest.param({}, [alloc("5", 1, Phase.GAVE_UP, hosts_head=True, **GAVE_UP)], [], [(1, False, None)],
                 id="the-head-s:not-drained"),
    pytest.param({"min_allocations": 1}, [alloc("5", 1, Phase.GAVE_UP, **GAVE_UP)], ["5"],
                 [(1, False, None)], id="not-counted-for-min-allocations"),
    pytest.param({"pools": [Pool(B, max_allocations=1)]}, [alloc("5", 0, Phase.GAVE_UP, **GAVE_UP)], ["5"],
                 [(0, False, None)], id="not-counted-against-max-allocations"),
])
def test_an_allocation_whose_agent_gave_up_counts_for_nothing(kw, allocations, drained, expected_submits):
    decision = run(p=policy(**kw), demand=Demand(pending=(GPU,)), allocations=allocations)
    assert [a.job_id for a in kinds(decision, Drain)] == drained, decision
    assert submits(decision) == expected_submits, decision
    for action in kinds(decision, Drain):
        assert action.reason == ("gpu-b job 5 gave up (node g: Ray ended 4 times under head 1; staying out until "
                                 "another head): it counts for nothing; drained")


@pytest.mark.parametrize("allocations, expected", [
    pytest.param([alloc("5", 1, end_time=NOW + 600)], [(1, False, "5")], id="busy-near-its-end"),
    pytest.param([alloc("5", 1, end_time=NOW + 1200)], [], id="not-yet"),
    pytest.param([alloc("5", 1, end_time=NOW + 600, idle_since=NOW - 400)], [], id="idle-gets-none"),
    pytest.param([alloc("5", 1, end_time=NOW + 600), alloc("6", 1, Phase.QUEUED, replaces="5")], [],
                 id="already-replaced"),
    pytest.param([alloc("5", 1, end_time=NOW + 600), alloc("6", 1, end_time=NOW + 600)],
                 [(1, False, "5"), (1, False, "6")], id="max-2-both-replaced:in-their-place"),
])
def test_a_busy_allocation_is_replaced_before_its_walltime(allocations, expected):
    decision = run(p=policy(replace_before_walltime=900), allocations=allocations)
    assert submits(decision) == expected, decision


def test_no_replacement_with_replace_before_walltime_zero():
    decision = run(p=policy(replace_before_walltime=0), allocations=[alloc("5", 1, end_time=NOW + 10)])
    assert not submits(decision)


# ------------------------------------------------------------ room Ray has free now

@pytest.mark.parametrize("free, pending, expected_submits, unserved", [
    pytest.param(({"CPU": 1.0, "GPU": 2.0},), 2, [], 0, id="a-node-that-just-joined-has-room:Ray-places-them"),
    pytest.param(({"CPU": 1.0, "GPU": 1.0},), 2, [(1, False, None)], 1, id="room-for-one:one-more-allocation"),
    pytest.param(((),), 2, [(1, False, None)], 2, id="busy-node:nothing-free"),
])
def test_pending_demand_that_fits_what_running_nodes_have_free_is_not_unserved(free, pending, expected_submits,
                                                                              unserved):
    running = alloc("7", 1, Phase.RUNNING, free=tuple(dict(f) for f in free))
    decision = run(demand=Demand(pending=(GPU,) * pending), allocations=(running,))
    assert submits(decision) == expected_submits and decision.unserved == unserved, decision


def test_room_on_a_running_node_leaves_a_queued_submission_unneeded():
    running = alloc("7", 1, Phase.RUNNING, free=({"CPU": 1.0, "GPU": 2.0},))
    queued = alloc("8", 1, Phase.QUEUED, submitted_at=NOW - 100)
    decision = run(demand=Demand(pending=(GPU,) * 2), allocations=(running, queued),
                   memory=Memory(unneeded_since={"8": NOW - 31}))
    assert [c.job_id for c in kinds(decision, Cancel)] == ["8"] and not submits(decision)
    free_of_draining = alloc("7", 1, Phase.DRAINING, free=({"CPU": 1.0, "GPU": 2.0},))
    assert submits(run(demand=Demand(pending=(GPU,) * 2), allocations=(free_of_draining,))) == [(1, False, None)]


# ------------------------------------------------------------ when to decide again (wake_at)

@pytest.mark.parametrize("kw, demand, allocations, memory, expected", [
    pytest.param({}, Demand(), (), Memory(), None, id="nothing-waits:the-next-turn"),
    pytest.param({"demand_delay": 2.0}, Demand(pending=(GPU,)), (), Memory(), NOW + 2,
                 id="new-demand:when-demand-delay-runs-out"),
    pytest.param({"demand_delay": 2.0}, Demand(pending=(GPU,)), (), Memory(unserved_since=NOW - 1.5), NOW + 0.5,
                 id="demand-waiting-1.5-s:in-0.5-s"),
    pytest.param({"demand_delay": 2.0}, Demand(pending=(GPU,)), (), Memory(unserved_since=NOW - 40), None,
                 id="demand-submitted-for:nothing-waits"),
    pytest.param({"idle_timeout": 300}, Demand(), (alloc("5", 1, idle_since=NOW - 100),), Memory(), NOW + 200,
                 id="idle-100-s:when-idle-timeout-runs-out"),
    pytest.param({"idle_timeout": 300}, Demand(), (alloc("5", 1, idle_since=NOW - 400),), Memory(), None,
                 id="idle-past-it:drained-now-nothing-waits"),
    pytest.param({"idle_timeout": 300}, Demand(), (alloc("5", 1, idle_since=NOW - 100, hosts_head=True),),
                 Memory(), None, id="the-head-s-never-drained:no-wake"),
    pytest.param({"idle_timeout": 300}, Demand(), (alloc("5", 1, Phase.STARTING, idle_since=NOW - 100),),
                 Memory(), None, id="starting:not-idle"),
    pytest.param({"cancel_delay": 30}, Demand(), (alloc("7", 1, Phase.QUEUED),),
                 Memory(unneeded_since={"7": NOW - 10}), NOW + 20, id="queued-unneeded-10-s:when-cancel-delay-ends"),
    pytest.param({"cancel_delay": 30}, Demand(), (alloc("7", 1, Phase.QUEUED),),
                 Memory(unneeded_since={"7": NOW - 40}), None, id="queued-cancelled-now:nothing-waits"),
    pytest.param({"replace_before_walltime": 900}, Demand(), (alloc("5", 1, end_time=NOW + 1000),), Memory(),
                 NOW + 100, id="busy-ends-in-1000-s:when-the-replacement-is-due"),
    pytest.param({"idle_timeout": 300, "demand_delay": 2.0}, Demand(pending=({"accelerator:x": 1},)),
                 (alloc("5", 1, idle_since=NOW - 299),), Memory(), NOW + 1, id="the-earliest-of-several"),
])
def test_a_decision_says_when_its_first_delay_runs_out(kw, demand, allocations, memory, expected):
    decision = decide(policy(**kw), demand, list(allocations), est(), memory, NOW)
    assert decision.wake_at == (pytest.approx(expected) if expected is not None else None), decision
