"""When an agent whose node lost its slurmd leaves (``agent.slurm.slurmd_rules``): pure, table-tested.

The scene (issue 10): slurmd dies on a worker node, Slurm sets the node DOWN
and requeues the job, and the agent must notice and leave without every
agent of a big run polling slurmctld.
"""

from __future__ import annotations

import itertools

import pytest

from elastic_ray.agent.machine import Context, Exit, Settings, ShutdownRequested, State, StopRay, step
from elastic_ray.agent.slurm.slurmd_rules import (
    ASK_DELAYS,
    ASK_GRACE,
    DEFAULT_SLURMD_PORT,
    DEFAULT_SLURMD_TIMEOUT,
    Plan,
    SlurmdConf,
    plan,
    read_slurmd_conf,
    verdict,
)
from elastic_ray.scheduler.base import JobInfo, JobState

# The lab's generated slurm.conf (shared/notes), trimmed to what matters.
LAB_CONF = """\
ClusterName=lab
SlurmctldHost=slurmctl(10.77.0.1)
SlurmctldPort=6817
SlurmdPort=6818
SchedulerParameters=batch_sched_delay=0,sched_interval=5,bf_interval=5
ReturnToService=1
SlurmdTimeout=20
NodeName=cpu-1 NodeAddr=10.77.0.11 NodeHostname=cpu-1 CPUs=4 RealMemory=8192 State=UNKNOWN
NodeName=cpu-2 NodeAddr=10.77.0.12 NodeHostname=cpu-2 CPUs=4 RealMemory=8192 State=UNKNOWN
PartitionName=cpu Nodes=cpu-1,cpu-2 Default=YES MaxTime=INFINITE State=UP
"""

# Several slurmds on one host, each on its own port (the notes' fallback (b)).
MULTI_CONF = """\
SlurmdPort=6818
SlurmdTimeout=60
NodeName=m1 NodeHostname=vm NodeAddr=127.0.0.1 Port=17001
NodeName=m2 NodeHostname=vm NodeAddr=127.0.0.1 Port=17002
NodeName=r[01-03] Port=17100
"""


# ------------------------------------------------------------------ slurm.conf

@pytest.mark.parametrize("text, node, expected", [
    ("", "cpu-1", SlurmdConf(DEFAULT_SLURMD_PORT, DEFAULT_SLURMD_TIMEOUT)),
    (LAB_CONF, "cpu-2", SlurmdConf(6818, 20.0)),
    (LAB_CONF, "not-a-node", SlurmdConf(6818, 20.0)),
    (MULTI_CONF, "m1", SlurmdConf(17001, 60.0)),
    (MULTI_CONF, "m2", SlurmdConf(17002, 60.0)),
    (MULTI_CONF, "r02", SlurmdConf(17100, 60.0)),
    (MULTI_CONF, "r04", SlurmdConf(6818, 60.0)),
    ("SlurmdPort=7000\n", "x", SlurmdConf(7000, DEFAULT_SLURMD_TIMEOUT)),
    ("slurmdport=7001\nslurmdtimeout=45\n", "x", SlurmdConf(7001, 45.0)),          # keys are case-insensitive
    ("#SlurmdPort=1\nSlurmdTimeout=30 # was 300\n", "x", SlurmdConf(6818, 30.0)),   # comments
    ("SlurmdTimeout=0\n", "x", SlurmdConf(6818, 0.0)),                               # never set DOWN
    ("SlurmdPort=abc\nSlurmdTimeout=-5\n", "x", SlurmdConf(6818, DEFAULT_SLURMD_TIMEOUT)),  # junk keeps defaults
    ("NodeName=DEFAULT Port=7100\nNodeName=a1 CPUs=4\nNodeName=a2 Port=7200\n", "a1", SlurmdConf(7100, 300.0)),
    ("NodeName=DEFAULT Port=7100\nNodeName=a1 CPUs=4\nNodeName=a2 Port=7200\n", "a2", SlurmdConf(7200, 300.0)),
    ("NodeName=bad[3-1] Port=7300\nSlurmdPort=7301\n", "bad2", SlurmdConf(7301, 300.0)),  # a broken host list
    ("Include /etc/slurm/nodes.conf\n", "x", SlurmdConf(6818, 300.0)),
])
def test_slurm_conf_gives_the_nodes_slurmd_port_and_timeout(text, node, expected):
    assert read_slurmd_conf(text, node) == expected


# ------------------------------------------------------------------ plan

INTERVALS = (1.0, 15.0, 20.0, 30.0)
TIMEOUTS = (0.0, 5.0, 20.0, 300.0)
DOWN_FOR = (0.0, 0.5, 9.9, 10.0, 19.9, 20.0, 100.0, 299.0, 300.0, 3600.0)
ASKED = (0, 1, 2, 3, 4, 50)


@pytest.mark.parametrize("interval, timeout", list(itertools.product(INTERVALS, TIMEOUTS)))
def test_plan_over_the_whole_grid(interval, timeout):
    first = max(ASK_GRACE, timeout)
    for down_for, asked in itertools.product(DOWN_FOR, ASKED):
        # slurmd answers: nothing to ask, look again after the interval.
        assert plan(True, down_for, asked, interval, timeout) == Plan(False, interval)
        got = plan(False, down_for, asked, interval, timeout)
        assert got.next_check_in > 0, "a zero delay would spin the loop"
        if down_for < first:
            # Slurm cannot have requeued the job yet: look again, never later than the
            # moment asking makes sense, and ask nothing.
            assert got == Plan(False, min(interval, first - down_for))
        else:
            assert got == Plan(True, ASK_DELAYS[min(asked, len(ASK_DELAYS) - 1)])


def _asks_during_outage(length: float, interval: float, timeout: float) -> list[float]:
    """When an agent would ask if slurmd is gone from t=0 for ``length`` seconds."""
    t, asked, asks = 0.0, 0, []
    while t < length:
        step_ = plan(False, t, asked, interval, timeout)
        if step_.ask:
            asks.append(t)
            asked += 1
        t += step_.next_check_in
    return asks


def test_lab_outage_asks_at_20_30_50_80_then_every_minute():
    assert _asks_during_outage(300.0, 20.0, 20.0) == [20.0, 30.0, 50.0, 80.0, 140.0, 200.0, 260.0]


def test_a_slurmd_restart_shorter_than_slurmd_timeout_costs_the_controller_nothing():
    assert _asks_during_outage(299.0, 20.0, DEFAULT_SLURMD_TIMEOUT) == []
    assert _asks_during_outage(9.0, 1.0, 0.0) == []


def test_a_long_outage_asks_at_most_once_a_minute_after_the_first_few():
    asks = _asks_during_outage(3600.0, 20.0, DEFAULT_SLURMD_TIMEOUT)
    assert asks[0] == DEFAULT_SLURMD_TIMEOUT
    assert all(b - a <= 60.0 for a, b in zip(asks, asks[1:]))
    assert len(asks) <= (3600.0 - DEFAULT_SLURMD_TIMEOUT) / 60.0 + len(ASK_DELAYS)


# ------------------------------------------------------------------ verdict

def _info(state: JobState, nodes: tuple[str, ...] = ("cpu-1", "cpu-2"), reason: str = "") -> JobInfo:
    return JobInfo(job_id="123", name="er-run", state=state, nodes=nodes, reason=reason)


STAY = {JobState.RUNNING, JobState.SUSPENDED}


@pytest.mark.parametrize("state", list(JobState))
@pytest.mark.parametrize("nodes, here", [(("cpu-1", "cpu-2"), True), (("cpu-1",), False), ((), True)])
def test_verdict_for_every_state_and_placement(state, nodes, here):
    got = verdict("123", "cpu-2", _info(state, nodes))
    assert got.leave is not (state in STAY and here)
    assert "123" in got.reason
    if got.leave:
        assert got.reason.endswith("leaving")
        assert state.value in got.reason or state is JobState.ENDED_UNKNOWN
    else:
        assert "still serving" in got.reason and "cpu-2" in got.reason


def test_no_answer_from_the_scheduler_keeps_the_node_serving():
    got = verdict("123", "cpu-2", None)
    assert not got.leave
    assert "cpu-2" in got.reason and "123" in got.reason and "still serving" in got.reason


def test_requeued_job_says_pending_requeued_and_the_reason():
    got = verdict("123", "cpu-2", _info(JobState.PENDING, (), reason="BeginTime"))
    assert got.leave
    assert got.reason == ("job 123 is PENDING in Slurm (requeued while slurmd on cpu-2 was gone, reason BeginTime); "
                          "leaving")
    assert "reason" not in verdict("123", "cpu-2", _info(JobState.PENDING, (), reason="None")).reason


def test_running_elsewhere_names_where():
    got = verdict("123", "cpu-2", _info(JobState.RUNNING, ("cpu-1", "gpua-1")))
    assert got.leave and "cpu-1,gpua-1" in got.reason and "not on cpu-2" in got.reason


def test_purged_job_is_gone():
    got = verdict("123", "cpu-2", _info(JobState.ENDED_UNKNOWN, ()))
    assert got.leave and "no longer known to Slurm" in got.reason


# ------------------------------------------------------------------ what leaving does

@pytest.mark.parametrize("role, state", [("worker", State.JOINED), ("worker", State.WAITING_FOR_HEAD),
                                         ("head", State.JOINED)])
def test_leaving_is_a_shutdown_that_stops_ray_and_keeps_the_reason(role, state):
    reason = verdict("123", "cpu-2", _info(JobState.PENDING, ())).reason
    ctx = Context(Settings(role=role), state, 0.0, head_job="7", head_address="10.0.0.1:6379", node_id="n1")
    after, actions = step(ctx, ShutdownRequested(5.0, reason))
    assert after.state is State.LEFT
    assert reason in after.reason
    assert actions[-1] == Exit(0)
    assert (StopRay(True) in actions) is (state is not State.WAITING_FOR_HEAD)
