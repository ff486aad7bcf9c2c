"""The seed's hand-over rules that are not timing: the elector's claim stays
valid while it waits for a queued successor, a separate head has one node,
and a short rejoin_timeout is warned about."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from elastic_ray import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config import rejoin_timeout_warning, resolve_separate_head_config
from elastic_ray.config.queue import SlurmQueue, plan_run_layout, plan_session_layout
from elastic_ray.coordinator.head import election
from elastic_ray.coordinator.head.claims import election_claim, renew_claim
from elastic_ray.coordinator.head.failover import Failover
from elastic_ray.coordinator.session import Session
from elastic_ray.errors import ConfigError
from elastic_ray.protocol.disk.records import AllocationRecord, SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobInfo, JobState, Scheduler


def _dir(tmp_path) -> SessionDir:
    return SessionDir.create(tmp_path / "sess", SessionInfo(
        session_id="s-1", job_name="er-test", created_at=1.0, scheduler={"kind": "local"},
        head={"partition": "cpu", "time_limit": "60"}))


# ---------------------------------------------------------------- the claim while waiting

def test_renew_claim_moves_our_expiry_and_leaves_anothers_claim_alone(tmp_path):
    d = _dir(tmp_path)
    with election_claim(d, "a", period=10.0, clock=lambda: 100.0) as claim:
        assert claim.held
        assert renew_claim(d, "a", 10.0, clock=lambda: 108.0)
        rec = d.read_allocation()
        assert rec.election.claimant == "a" and rec.election.since == 100.0 and rec.election.expires == 118.0
        # Another process at 115 s finds the claim live (it would be expired without the renewal).
        assert not renew_claim(d, "b", 10.0, clock=lambda: 115.0)
        assert d.read_allocation().election.claimant == "a"


class _QueuedSuccessor:
    """Just what ``Failover.wait_head_ready`` uses: the session directory, the
    claim period, and a successor job that stays PENDING."""

    def __init__(self, directory: SessionDir, period: float):
        self.dir = directory
        self.claim_period = period
        self.job_name = "er-test"

    def job_info(self, job_id: str, unreachable_ok: bool = False, max_age: float = 0.0) -> JobInfo:
        return JobInfo(job_id=job_id, name=self.job_name, state=JobState.PENDING)


def test_waiting_for_a_queued_successor_keeps_the_claim_for_longer_than_its_period(tmp_path):
    period = 1.5  # renewals every period/3 must not be missed on a loaded 2-core machine
    d = _dir(tmp_path)
    session = _QueuedSuccessor(d, period)
    failover = Failover(session)  # type: ignore[arg-type]
    taken = []

    def rival() -> None:
        # A second process finding the head lost, again and again while the successor is queued.
        while not done.is_set():
            rec = d.update_allocation(lambda r: election.claim(r, "rival", time.time(), period)[0])
            if election.holds_claim(rec, "rival"):
                taken.append(time.time())
                return
            time.sleep(0.05)

    # Taken by hand, not through election_claim (whose own thread would renew it):
    # here only the waiting elector's keep_claim renews.
    d.update_allocation(lambda r: election.claim(r, failover.claimant, time.time(), period)[0])
    failover._renewed_at = time.monotonic()
    done = threading.Event()
    thread = threading.Thread(target=rival)
    thread.start()
    try:
        # Five claim periods in the queue: the successor never starts.
        assert failover.wait_head_ready("42", time.monotonic() + 5 * period) is False
        assert not taken, "the claim lapsed while the elector waited; a second election could start"
        # Once the elector stops renewing, the claim does lapse and the rival gets it:
        # the check above could have failed.
        thread.join(timeout=5 * period)
        assert taken, "the rival never took the claim after the renewals stopped"
    finally:
        done.set()
        thread.join()


# ---------------------------------------------------------------- one-node separate head

TWO_NODE_HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="60", num_nodes=2)


def test_a_separate_head_allocation_has_one_node():
    with pytest.raises(ConfigError, match="num_nodes") as refused:
        resolve_separate_head_config(TWO_NODE_HEAD)
    assert refused.value.field == "num_nodes"
    assert resolve_separate_head_config(SlurmRunAllocationConfig(partition="cpu", time_limit="60")).num_nodes == 1
    with pytest.raises(ConfigError, match="ray_head_allocation.num_nodes"):
        plan_run_layout(SlurmRunAllocationConfig(partition="cpu", time_limit="60"), TWO_NODE_HEAD, SlurmQueue())
    with pytest.raises(ConfigError, match="num_nodes"):
        plan_session_layout(TWO_NODE_HEAD, ray_head_only=True, worker_allocation=None, queue=SlurmQueue())
    # The default layout's first allocation computes: it may have many nodes.
    assert plan_session_layout(TWO_NODE_HEAD, ray_head_only=False, worker_allocation=None,
                               queue=SlurmQueue()).head.num_nodes == 2


def test_session_create_refuses_a_multi_node_separate_head_before_submitting(tmp_path):
    with pytest.raises(ConfigError, match="num_nodes") as refused:
        Session.create(tmp_path / "s", head=TWO_NODE_HEAD, scheduler="local", ray_head_only=True, supervise=False)
    assert "exactly one node" in str(refused.value)
    assert not (tmp_path / "s").exists(), "nothing is created or submitted for a refused config"


# ---------------------------------------------------------------- rejoin_timeout

@pytest.mark.parametrize("rejoin, warns", [(600.0, False), (300.0, False), (299.0, True), (60.0, True)])
def test_a_short_rejoin_timeout_is_warned_about(rejoin, warns):
    warning = rejoin_timeout_warning(SlurmWorkerAllocationConfig(rejoin_timeout=rejoin))
    assert (warning is not None) is warns
    if warns:
        assert "rejoin_timeout" in warning and "elect" in warning


class _RecordingScheduler(Scheduler):
    """Accepts submissions and runs nothing: the warning is about the config."""

    kind = "local"

    def __init__(self, state_dir):
        self.state_dir = state_dir
        self.submitted: list = []

    def submit(self, spec):
        self.submitted.append(spec)
        return str(100 + len(self.submitted))

    def query(self, job_name, job_ids=()):
        return {}

    def cancel(self, job_id):
        pass

    def cancel_by_name(self, job_name):
        pass

    def signal(self, job_id, signal_name, *, batch=False):
        pass

    def test_only(self, spec):
        return 0.0


def test_add_worker_allocation_logs_the_rejoin_timeout_warning(tmp_path, caplog):
    scheduler = _RecordingScheduler(tmp_path / "state")
    s = Session.create(tmp_path / "s", head=SlurmRunAllocationConfig(partition="cpu", time_limit="60"),
                       scheduler=scheduler, supervise=False)
    with caplog.at_level(logging.WARNING, logger="elastic_ray.coordinator"):
        s.add_worker_allocation(SlurmWorkerAllocationConfig(partition="cpu", rejoin_timeout=120))
        s.add_worker_allocation(SlurmWorkerAllocationConfig(partition="cpu"))
    warned = [r for r in caplog.records if "short_rejoin_timeout" in r.getMessage()]
    assert len(scheduler.submitted) == 3  # the head and both worker allocations
    assert len(warned) == 1 and "rejoin_timeout=120s" in warned[0].getMessage()


# ---------------------------------------------------------------- a driver stopped by Slurm's signal

@pytest.mark.parametrize("signal, end_in, inside", [
    (None, 10.0, False),            # no pre-walltime signal: a driver's exit is its own
    ("TERM@50", None, False),       # unlimited
    ("TERM@50", 200.0, False),      # long before the signal can come
    ("TERM@50", 50.0 + 35.0, True),  # Slurm's 30 s timer may send it this early
    ("TERM@50", 50.0, True),
    ("USR1@600", 400.0, True),
])
def test_in_signal_window(signal, end_in, inside):
    from elastic_ray.coordinator.drivers import in_signal_window

    now = 1_000_000.0
    assert in_signal_window(signal, None if end_in is None else now + end_in, now) is inside


def _head_state(state: str, transitions: list[tuple[float, str]]):
    from elastic_ray.protocol.disk.records import AgentRole, AgentState, NodeState, Transition

    return NodeState(session="s", job_id="1", node="n1", node_ip="127.0.0.1", role=AgentRole.HEAD,
                     state=AgentState(state), since=0.0, max_restarts=3, rejoin_timeout=60.0,
                     started_at=0.0, updated_at=0.0, pid=1, control="tcp://127.0.0.1:1",
                     transitions=tuple(Transition(at, AgentState.JOINED, AgentState(to), "")
                                       for at, to in transitions))


@pytest.mark.parametrize("state, transitions, drained", [
    ("JOINED", [], False),                                  # a driver that ended on its own
    ("DRAINING", [], True),                                 # draining now (signal, walltime lead, removal)
    ("LEFT", [(110.0, "DRAINING"), (111.0, "LEFT")], True),  # handed over before the driver looked
    ("LEFT", [(90.0, "DRAINING"), (91.0, "LEFT")], False),   # a drain before this driver started
    ("LEFT", [(111.0, "LEFT")], False),                     # left without draining (a kill)
])
def test_a_driver_counts_the_heads_drain_since_it_started(state, transitions, drained):
    """A head drained ahead of its walltime without any signal hands over
    within half a second when a standby is ready: the driver must still see
    a drain (SlurmStepDrained), from the published transitions."""
    from elastic_ray.coordinator.drivers import head_drained_since

    assert head_drained_since([_head_state(state, transitions)], since=100.0) is drained
    assert head_drained_since([], since=100.0) is False


@pytest.mark.parametrize("job, alive, draining, seen_alive, doubt", [
    ("1", True, False, True, False),    # beating, serving: the paced look is enough
    ("1", True, True, True, True),      # draining: a cancel's SIGTERM looks so first
    ("1", False, False, True, True),    # silent after it was heard: killed, or its node gone
    ("1", False, False, False, False),  # never heard yet: no news
    ("2", False, True, True, False),    # another head's news is not this driver's
])
def test_a_driver_asks_the_scheduler_afresh_only_when_its_head_is_in_doubt(job, alive, draining, seen_alive,
                                                                           doubt):
    from elastic_ray.coordinator.drivers import head_in_doubt
    from elastic_ray.coordinator.head.headwatch import HeadObservation

    obs = HeadObservation(job=job, address="127.0.0.1:6379", alive=alive, draining=draining, last_beat_age=0.5)
    assert head_in_doubt(obs, "1", seen_alive) is doubt


# ---------------------------------------------------------------- the claim as a lease

def test_a_claim_whose_holder_is_known_dead_is_taken_at_once():
    rec0 = AllocationRecord(head_job="1")
    held, ok = election.claim(rec0, "host-a:11:aa", 1000.0, period=30)
    assert ok
    refused, ok = election.claim(held, "host-b:22:bb", 1001.0, period=30)
    assert not ok and refused is held
    refused, ok = election.claim(held, "host-b:22:bb", 1001.0, period=30, holder_dead=lambda c: False)
    assert not ok and refused is held
    taken, ok = election.claim(held, "host-b:22:bb", 1001.0, period=30, holder_dead=lambda c: c == "host-a:11:aa")
    assert ok and taken.election.claimant == "host-b:22:bb"
    assert taken.election.since == 1001.0, "a new election begins; the dead one's start is not inherited"


@pytest.mark.parametrize("claimant, expected", [
    ("host-a:11:aa", ("host-a", 11)), ("h:1:x", ("h", 1)),
    ("rival", None), ("a:b:c", None), (":1:x", None), ("h:1", None), ("h:1:x:y", None), ("h:-1:x", None),
])
def test_claimant_process_reads_only_what_failover_writes(claimant, expected):
    assert election.claimant_process(claimant) == expected


def test_holder_gone_only_for_a_process_of_this_host_that_ended():
    import socket
    import subprocess
    import sys

    from elastic_ray.coordinator.head.claims import holder_gone

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    host = socket.gethostname()
    assert holder_gone(f"{host}:{ended.pid}:x") is True
    assert holder_gone(f"{host}:{os.getpid()}:x") is False
    assert holder_gone(f"{host}-elsewhere:{ended.pid}:x") is False, "another host's pid says nothing here"
    assert holder_gone("rival") is False


def test_the_claim_is_renewed_while_its_block_runs_and_released_after(tmp_path):
    period = 0.8
    d = _dir(tmp_path)
    with election_claim(d, "me:1:x", period) as claim:
        assert claim.held
        deadline = time.time() + 3 * period
        while time.time() < deadline:
            rec = d.update_allocation(lambda r: election.claim(r, "rival", time.time(), period)[0])
            assert not election.holds_claim(rec, "rival"), "the lease lapsed while its holder worked"
            time.sleep(0.1)
    assert d.read_allocation().election is None, "released when the block ends"


def test_an_elector_that_wins_the_claim_after_another_election_judges_the_new_head_first():
    """Seen on the lab: of three processes calling replace_head() together, one
    judged the old head, waited for the claim, and then elected again over
    the head the first elector had just made."""
    from contextlib import contextmanager

    from elastic_ray.coordinator.head.claims import ClaimOutcome
    from elastic_ray.coordinator.head.headwatch import HeadObservation

    old = AllocationRecord(head_job="31", predecessors=())
    new = AllocationRecord(head_job="32", predecessors=("31",))
    jobs = {"31": JobInfo("31", "er-x", JobState.COMPLETED), "32": JobInfo("32", "er-x", JobState.RUNNING)}

    class Racer:
        job_name = "er-x"
        looks = 0

        def observe_head(self, wait=0.0):
            # First look: the old head, silent. Later: the new one, answering.
            if self.looks == 0:
                return HeadObservation("31", None, False, False, None)
            return HeadObservation("32", "10.0.0.2:6379", True, False, 0.1)

        def record(self):
            self.looks += 1
            return old if self.looks == 1 else new

        def query(self, max_age=0.0):
            return jobs

        def assess_head(self, rec, jobs, obs, now):
            alive = obs.alive and obs.job == rec.head_job
            return election.assess_head(rec, jobs, head_alive=alive, now=now)

        @contextmanager
        def election_claim(self, claimant):
            yield ClaimOutcome(True, new)  # the claim is free again: the other elector is done

    failover = Failover(Racer())  # type: ignore[arg-type]
    elections = []
    failover.elect = lambda *a, **k: elections.append(a)  # type: ignore[method-assign]
    assert failover.replace_head(timeout=10, progress=None) == ("32", "10.0.0.2:6379")
    assert elections == [], "a head elected a moment ago was replaced by a second election"
