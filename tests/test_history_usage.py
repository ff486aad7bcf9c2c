"""history/usage: node-hours and GPU-hours, by table, with the figures worked out by hand."""

from __future__ import annotations

import json

import pytest

from elastic_ray.history.runs import build
from elastic_ray.history.usage import usage
from tests.history_events import NOW, T0, K, ev, scenario, write_session

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


# =============================================================== `elastic-ray session usage`

_session = write_session


def _usage(*args):
    from click.testing import CliRunner

    from elastic_ray.cli.main import main

    return CliRunner().invoke(main, ["session", "usage", *args], catch_exceptions=False)


def test_the_command_prints_a_table_with_the_run_total(tmp_path):
    import time

    session = _session(tmp_path, scenario(time.time() - 5600))
    result = _usage(str(session))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.split()[:3] == ["job", "role", "partition"] and "GPU-hours held" in line for line in lines)
    rows = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in ("100", "101",
                                                                                                    "102", "run")}
    assert rows["100"] == ["100", "head", "cpu", "1", "0.99", "0.00", "?", "failed"]     # no agent measured: "?"
    assert rows["101"][:4] == ["101", "worker", "gpu", "2"] and rows["101"][-1] == "live"
    assert rows["101"][4:6] == ["3.00", "12.00"]       # 2 nodes x 1.5 h x 4 GPUs (to the second: the clock moved)
    assert rows["102"] == ["102", "worker", "gpu-a", "1", "0.42", "0.85", "?", "removed"]
    assert rows["run"] == ["run", "4", "4.42", "12.85", "?"]


def test_the_command_s_json(tmp_path):
    session = _session(tmp_path, scenario())
    (session / "events.jsonl").open("ab").write(b'{"torn": \n')
    doc = json.loads(_usage(str(session), "--json").stdout)
    assert doc["schema"] == "elastic-ray/1" and doc["command"] == "session usage"
    assert [a["job"] for a in doc["allocations"]] == ["100", "101", "102"]
    assert doc["allocations"][2]["gpu_hours_held"] == 0.85 and doc["skipped_lines"] == 1
    assert set(doc["total"]) == {"node_hours", "gpu_hours_held", "gpu_hours_idle", "partial"}


@pytest.mark.parametrize("json_flag", [False, True])
def test_a_missing_session_is_a_usage_error(tmp_path, json_flag):
    result = _usage(str(tmp_path / "gone"), *(["--json"] if json_flag else []))
    assert result.exit_code == 2 and "no such directory" in result.output
    if json_flag:
        assert json.loads(result.stdout)["error"]["type"] == "usage"


def test_idle_gpu_hours_are_what_the_agents_measured_and_partial_when_some_did_not():
    from elastic_ray.history.runs import build
    from elastic_ray.history.usage import usage
    from elastic_ray.protocol.disk.events import Event, EventKind as K, EventSource as S

    t0 = 1_796_000_000.0

    def ev(at, kind, job, node=None, **details):
        return Event(at=t0 + at, kind=kind, by=S.AGENT if node else S.COORDINATOR, job=job, node=node, details=details)

    events = [ev(0, K.SUBMITTED, "7", role="worker", partition="gpu", nodes=2, gpus_per_node=4),
              ev(10, K.STARTED, "7", "g1"), ev(10, K.STARTED, "7", "g2"),
              # g1 left after 2 h, 3 of its 8 GPU-hours idle; g2 is still in the run (its node file says 1 h idle)
              ev(7210, K.NODE_LEFT, "7", "g1", state="LEFT", gpu_held_seconds=28800.0, gpu_idle_seconds=10800.0),
              ev(20, K.SUBMITTED, "8", role="worker", partition="gpu", nodes=1, gpus_per_node=2),
              ev(30, K.STARTED, "8", "h1"), ev(3630, K.NODE_LEFT, "8", "h1", state="LEFT")]   # an older agent: no figures
    history = build(events, now=t0 + 7210)
    measured = usage(history, {("7", "g2"): 3600.0})
    by_job = {row.job: row for row in measured.allocations}
    assert by_job["7"].gpu_hours_idle == pytest.approx(4.0) and not by_job["7"].partial
    assert by_job["8"].gpu_hours_idle is None and not by_job["8"].partial
    assert measured.gpu_hours_idle == pytest.approx(4.0)
    without_g2 = {row.job: row for row in usage(history).allocations}
    assert without_g2["7"].gpu_hours_idle == pytest.approx(3.0) and without_g2["7"].partial
