"""history/usage: node-hours and GPU-hours, by table, with the figures worked out by hand."""

from __future__ import annotations

import json

import pytest

from elastic_ray.history.runs import build
from elastic_ray.history.usage import usage
from tests.history_events import NOW, T0, K, ev, scenario

H = 3600.0


def _submitted(gpus=4, nodes=2):
    return ev(0, K.SUBMITTED, "7", role="worker", partition="gpu", nodes=nodes, gpus_per_node=gpus)


# events, now (seconds after T0), node-hours, GPU-hours held, live, partial
CASES = {
    "2 nodes x 1.5 h x 4 GPUs = 12 GPU-hours": (
        [_submitted(), ev(0, K.STARTED, "7", "a"), ev(0, K.STARTED, "7", "b"),
         ev(1.5 * H, K.NODE_LEFT, "7", "a"), ev(1.5 * H, K.NODE_LEFT, "7", "b"), ev(1.5 * H, K.REMOVED, "7")],
        2 * H, 3.0, 12.0, False, False),
    "counted from the start, not the join: 1 node x (0.25 h + 0.75 h) x 8 GPUs": (
        [_submitted(8, 1), ev(0, K.STARTED, "7", "a"), ev(0.25 * H, K.NODE_JOINED, "7", "a"),
         ev(H, K.NODE_LEFT, "7", "a")], 2 * H, 1.0, 8.0, True, False),
    "still there at now: 1 node x 0.5 h x 8 GPUs": (
        [_submitted(8, 1), ev(0, K.STARTED, "7", "a")], 0.5 * H, 0.5, 4.0, True, False),
    "start line lost: from the join, 1 h x 4 GPUs": (
        [_submitted(4, 1), ev(0.5 * H, K.NODE_JOINED, "7", "a"), ev(1.5 * H, K.NODE_LEFT, "7", "a")],
        2 * H, 1.0, 4.0, True, False),
    "neither start nor join: nothing counted, partial": (
        [_submitted(4, 1), ev(H, K.NODE_LEFT, "7", "a")], 2 * H, 0.0, 0.0, True, True),
    "GPU count unknown (submission lost): node-hours only, partial": (
        [ev(0, K.STARTED, "7", "a"), ev(H, K.NODE_LEFT, "7", "a")], 2 * H, 1.0, None, True, True),
    "failed without its nodes' leave lines: they left with the job, 3 nodes x 2 h x 1 GPU": (
        [_submitted(1, 3), *(ev(0, K.STARTED, "7", n) for n in "abc"), ev(2 * H, K.FAILED, "7")],
        5 * H, 6.0, 6.0, False, False),
    "the coordinator's clock behind the agent's: a start after the job's end counts nothing": (
        [_submitted(4, 1), ev(100, K.STARTED, "7", "a"), ev(40, K.FAILED, "7")], H, 0.0, 0.0, False, False),
    "never started (pending, then removed): nothing held": (
        [_submitted(), ev(10, K.PENDING, "7"), ev(60, K.REMOVED, "7")], H, 0.0, 0.0, False, False),
    "no GPUs: node-hours, zero GPU-hours": (
        [_submitted(0, 1), ev(0, K.STARTED, "7", "a"), ev(0.1 * H, K.NODE_LEFT, "7", "a")], H, 0.1, 0.0, True,
        False),
}


@pytest.mark.parametrize("events, now, node_hours, gpu_hours, live, partial", CASES.values(), ids=CASES.keys())
def test_one_allocation(events, now, node_hours, gpu_hours, live, partial):
    figures = usage(build(events, T0 + now))
    (row,) = figures.allocations
    assert row.node_hours == pytest.approx(node_hours)
    assert row.gpu_hours_held == (None if gpu_hours is None else pytest.approx(gpu_hours))
    assert (row.live, row.partial, row.gpu_hours_idle) == (live, partial, None)
    assert figures.node_hours == pytest.approx(node_hours) and figures.partial == partial


def test_the_scenario_s_run_totals():
    """100: 1 node 30 s -> 3600 s (its job failed), 0 GPUs; 101: 2 nodes 200 s -> now (5600 s) = 1.5 h each,
    4 GPUs; 102: 1 node 330 s -> 1860 s = 0.425 h, 2 GPUs."""
    figures = usage(build(scenario(), NOW))
    rows = {r.job: r for r in figures.allocations}
    assert rows["100"].node_hours == pytest.approx(3570 / H) and rows["100"].gpu_hours_held == 0.0
    assert rows["101"].node_hours == pytest.approx(3.0) and rows["101"].gpu_hours_held == pytest.approx(12.0)
    assert rows["102"].node_hours == pytest.approx(0.425) and rows["102"].gpu_hours_held == pytest.approx(0.85)
    assert [(r.role, r.partition, r.nodes, r.ended_how) for r in figures.allocations] == [
        ("head", "cpu", 1, "failed"), ("worker", "gpu", 2, None), ("worker", "gpu-a", 1, "removed")]
    assert figures.node_hours == pytest.approx(3570 / H + 3.0 + 0.425)
    assert figures.gpu_hours_held == pytest.approx(12.85)
    assert figures.gpu_hours_idle is None and not figures.partial


def test_to_dict_is_json_with_rounded_figures():
    doc = usage(build(scenario(), NOW)).to_dict()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["total"] == {"node_hours": 4.4167, "gpu_hours_held": 12.85, "gpu_hours_idle": None, "partial": False}
    assert doc["allocations"][1] == {"job": "101", "role": "worker", "partition": "gpu", "nodes": 2,
                                     "nodes_requested": 2, "gpus_per_node": 4, "node_hours": 3.0,
                                     "gpu_hours_held": 12.0, "gpu_hours_idle": None, "ended_how": None, "live": True,
                                     "partial": False}


def test_an_empty_run_adds_up_to_nothing():
    figures = usage(build([], T0))
    assert (figures.allocations, figures.node_hours, figures.gpu_hours_held, figures.partial) == ((), 0.0, 0.0, False)
