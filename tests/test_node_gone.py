"""Lost Ray nodes are reported to the head at once (issue 10): the pieces without Ray.

The wire schema of ``mark_dead``, the pure decisions of which nodes to report
(once), the coordinator's reporter against a fake head agent, the head
agent's service and the worker's report, deferred replies on the control
socket, and the GCS health-check settings of the head's ``ray start``.
The same path with real agents and real Ray is in
``test_node_gone_local.py``.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from types import MappingProxyType

import pytest

from elastic_ray.agent.node import health_check
from elastic_ray.agent.head import node_gone
from elastic_ray.coordinator.allocations.lost_nodes import (LostNodeReporter, head_takes_reports, jobs_to_check,
                                                         nodes_to_report)
from elastic_ray.protocol.wire.channel import ControlClient, ControlServer, ControlTimeout, Deferred
from elastic_ray.protocol.wire.frames import (
    MAX_MARK_DEAD_IDS,
    FrameRejected,
    ReplayGuard,
    check_body,
    is_ray_node_id,
    open_frame,
    seal,
)
from elastic_ray.protocol.disk.head_agent import head_control_endpoint
from elastic_ray.protocol.disk.records import AllocationRecord, HeadEndpoint, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.base import JobInfo, JobState
from tests.helpers import node_state
from tests.test_session_dir import make_info

SECRET = b"k" * 32
SID = "s-1"
A = "a" * 56
B = "0123456789abcdef" * 3 + "01234567"
C = "c" * 56


# ---------------------------------------------------------------- the frame schema

def test_a_mark_dead_request_round_trips():
    parts = seal(SECRET, SID, "mark_dead", {"node_ids": [A, B], "reason": "slurm job 7 is FAILED"},
                 to="tcp://10.0.0.1:4000")
    env = open_frame(SECRET, SID, parts, ReplayGuard(), time.time(), to="tcp://10.0.0.1:4000")
    assert env.kind == "mark_dead" and list(env.body["node_ids"]) == [A, B]


@pytest.mark.parametrize("body, field", [
    ({"reason": "x"}, "missing field 'node_ids'"),
    ({"node_ids": [A]}, "missing field 'reason'"),
    ({"node_ids": [], "reason": "x"}, "mark_dead.node_ids"),
    ({"node_ids": A, "reason": "x"}, "mark_dead.node_ids"),
    ({"node_ids": [A.upper()], "reason": "x"}, "mark_dead.node_ids"),
    ({"node_ids": [A[:-1]], "reason": "x"}, "mark_dead.node_ids"),
    ({"node_ids": [A + "0"], "reason": "x"}, "mark_dead.node_ids"),
    ({"node_ids": ["g" * 56], "reason": "x"}, "mark_dead.node_ids"),
    ({"node_ids": [56], "reason": "x"}, "mark_dead.node_ids"),
    ({"node_ids": [A, A], "reason": "x"}, "must not repeat"),
    ({"node_ids": [f"{i:056x}" for i in range(MAX_MARK_DEAD_IDS + 1)], "reason": "x"}, "mark_dead.node_ids"),
    ({"node_ids": [A], "reason": 5}, "mark_dead.reason"),
    ({"node_ids": [A], "reason": "x" * 1025}, "mark_dead.reason"),
    ({"node_ids": [A], "reason": "x", "force": True}, "unexpected field 'force'"),
])
def test_a_bad_mark_dead_body_is_refused_naming_the_field(body, field):
    with pytest.raises(FrameRejected) as exc:
        check_body("mark_dead", body)
    assert exc.value.reason == "bad_body" and field in str(exc.value)
    with pytest.raises(ValueError, match="mark_dead"):   # the sender fails the same way, before sending
        seal(SECRET, SID, "mark_dead", body, to="tcp://10.0.0.1:4000")


def test_the_largest_mark_dead_request_fits_a_frame():
    ids = [f"{i:056x}" for i in range(MAX_MARK_DEAD_IDS)]
    seal(SECRET, SID, "mark_dead", {"node_ids": ids, "reason": "r" * 1024}, to="tcp://10.0.0.1:4000")


def test_node_id_shape():
    assert is_ray_node_id(A) and is_ray_node_id(B)
    assert not any(is_ray_node_id(v) for v in (None, "", A.upper(), A[:-1], b"a" * 56, "z" * 56))


# ---------------------------------------------------------------- the pure decisions

def _rec(*workers: str, hosts_head: str | None = None) -> AllocationRecord:
    rec = AllocationRecord(head_job="1")
    for job in workers:
        rec = rec.with_worker(WorkerRecord(job_id=job, config={}, submitted_at=1.0, hosts_run_head=job == hosts_head))
    return rec


def _jobs(**states: JobState) -> dict[str, JobInfo]:
    return {job.lstrip("j"): JobInfo(job.lstrip("j"), "er-test", state) for job, state in states.items()}


def test_jobs_to_check_are_recorded_workers_no_longer_running():
    rec = _rec("10", "11", "12", "13", "14", "15", "16")
    jobs = _jobs(j1=JobState.FAILED, j10=JobState.RUNNING, j11=JobState.FAILED, j12=JobState.NODE_FAIL,
                 j13=JobState.PENDING, j14=JobState.COMPLETING, j15=JobState.CANCELLED, j99=JobState.FAILED)
    # 1 is the head (not a worker), 10 runs, 16 was not listed, 99 is not the session's worker
    assert jobs_to_check(rec, jobs, head_job="1") == ["11", "12", "13", "14", "15"]
    assert jobs_to_check(rec, jobs, head_job="1", settled={"11", "15"}) == ["12", "13", "14"]


@pytest.mark.parametrize("state", [JobState.FAILED, JobState.NODE_FAIL, JobState.CANCELLED, JobState.TIMEOUT,
                                   JobState.PREEMPTED, JobState.OUT_OF_MEMORY, JobState.PENDING,
                                   JobState.BOOT_FAIL, JobState.DEADLINE, JobState.ENDED_UNKNOWN,
                                   JobState.SUSPENDED, JobState.COMPLETING, JobState.COMPLETED])
def test_every_state_but_running_is_checked(state):
    assert jobs_to_check(_rec("10"), _jobs(j10=state), head_job="1") == ["10"]


def test_the_allocation_hosting_the_current_head_is_not_checked():
    rec = _rec("10", "11", hosts_head="10")
    jobs = _jobs(j10=JobState.FAILED, j11=JobState.FAILED)
    assert jobs_to_check(rec, jobs, head_job="10") == ["11"]


@pytest.mark.parametrize("head_state, takes", [(JobState.RUNNING, True), (None, True),
                                               (JobState.CANCELLED, False), (JobState.COMPLETING, False),
                                               (JobState.PENDING, False), (JobState.FAILED, False),
                                               (JobState.ENDED_UNKNOWN, False)])
def test_a_head_whose_job_is_not_running_takes_no_report(head_state, takes):
    listed = _jobs(j11=JobState.FAILED, **({"j1": head_state} if head_state else {}))
    assert head_takes_reports(listed, "1") is takes
    assert head_takes_reports(listed, None) is False


def test_nodes_to_report_are_the_current_heads_node_ids_not_yet_sent():
    states = {
        "n1": node_state("11", "n1", node_id=A, head_job="1"),
        "n2": node_state("11", "n2", node_id=B, head_job="1"),
        "n3": node_state("11", "n3", node_id=C, head_job="0"),                 # joined an older head
        "n4": node_state("11", "n4", "WAITING_FOR_HEAD", node_id=None, head_job="1"),
        "n5": node_state("11", "n5", node_id="not-a-node-id", head_job="1"),
    }
    assert nodes_to_report("11", states, "1", sent=set()) == sorted([A, B])
    assert nodes_to_report("11", states, "1", sent={("11", A)}) == [B]
    assert nodes_to_report("11", states, "1", sent={("11", A), ("11", B)}) == []
    assert nodes_to_report("12", states, "1", sent={("11", A)}) == sorted([A, B])   # sent is per job
    assert nodes_to_report("11", states, None, sent=set()) == []


# ---------------------------------------------------------------- the coordinator's reporter

class FakeHeadAgent:
    """Stands in for ControlClient: records every request, answers like a head agent."""

    def __init__(self, answer=None):
        self.requests: list[tuple[str, str, dict]] = []
        self.answer = answer or (lambda body: {"ok": True, "marked": list(body["node_ids"]), "already_dead": []})

    def __call__(self, endpoint):
        agent = self

        class Client:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return None

            def request(self, kind, body, timeout):
                check_body(kind, body)
                agent.requests.append((endpoint, kind, dict(body)))
                result = agent.answer(body)
                if isinstance(result, Exception):
                    raise result
                return result

        return Client()


@pytest.fixture
def session_dir(tmp_path) -> SessionDir:
    directory = SessionDir.create(tmp_path / "sess", make_info())
    directory.update_allocation(lambda r: _rec("10", "11"))
    directory.write_ray_head("1")
    directory.write_head_endpoint(HeadEndpoint(job_id="1", host="head-1", address="10.0.0.9:6379",
                                               ray_version="2.60.0", started_at=1.0,
                                               ports=MappingProxyType({"control": 4100, "gcs_port": 6379})))
    directory.write_node_state(node_state("1", "head-1", role="head", control="tcp://10.0.0.9:4100"))
    directory.write_node_state(node_state("11", "w-1", node_id=A, head_job="1"))
    directory.write_node_state(node_state("11", "w-2", node_id=B, head_job="1"))
    directory.write_node_state(node_state("10", "w-3", node_id=C, head_job="1"))
    return directory


def test_the_reporter_sends_each_lost_node_once_to_the_head_agent(session_dir):
    head = FakeHeadAgent()
    reporter = LostNodeReporter(session_dir, head)
    listed = _jobs(j1=JobState.RUNNING, j10=JobState.RUNNING, j11=JobState.FAILED)
    reports = reporter.check(listed)
    assert head.requests == [("tcp://10.0.0.9:4100", "mark_dead",
                              {"node_ids": sorted([A, B]), "reason": "slurm job 11 is FAILED"})]
    assert reports[0]["reply"]["marked"] == sorted([A, B])
    assert reporter.check(listed) == [] and len(head.requests) == 1      # once
    assert "11" in reporter.settled                                       # and its files are not read again
    # The other allocation fails later: only its node is sent.
    reporter.check(_jobs(j10=JobState.NODE_FAIL, j11=JobState.FAILED))
    assert [r[2]["node_ids"] for r in head.requests] == [sorted([A, B]), [C]]


def test_a_requeued_allocation_is_reported_and_its_next_run_too(session_dir):
    head = FakeHeadAgent()
    reporter = LostNodeReporter(session_dir, head)
    reporter.check(_jobs(j11=JobState.PENDING))
    assert head.requests[-1][2]["reason"] == "slurm job 11 is PENDING"
    assert "11" not in reporter.settled       # PENDING is not final: it may run again
    reporter.check(_jobs(j11=JobState.RUNNING))
    session_dir.write_node_state(node_state("11", "w-1", node_id=C, head_job="1"))    # joined again, new id
    reporter.check(_jobs(j11=JobState.FAILED))
    assert head.requests[-1][2]["node_ids"] == [C]
    assert len(head.requests) == 2


def test_nothing_is_sent_while_the_head_is_not_published(session_dir):
    (session_dir.job_dir("1") / "head.json").unlink()
    head = FakeHeadAgent()
    reporter = LostNodeReporter(session_dir, head)
    listed = _jobs(j11=JobState.FAILED)
    assert reporter.check(listed) == [] and head.requests == []
    assert "11" not in reporter.settled       # tried again once the head is published


def test_nothing_is_sent_to_a_head_whose_job_the_same_answer_shows_ended(session_dir):
    # The demo's case: a removed allocation's nodes seen after the head was cancelled;
    # a request would have waited out its 20 s timeout, then logged a warning.
    head = FakeHeadAgent()
    reporter = LostNodeReporter(session_dir, head)
    assert reporter.check(_jobs(j1=JobState.CANCELLED, j11=JobState.CANCELLED)) == []
    assert head.requests == [] and "11" not in reporter.settled
    assert reporter.check(_jobs(j1=JobState.RUNNING, j11=JobState.CANCELLED))   # a running head gets it
    assert len(head.requests) == 1


def test_a_failed_report_is_retried_then_given_up(session_dir):
    head = FakeHeadAgent(answer=lambda body: ControlTimeout("no reply"))
    reporter = LostNodeReporter(session_dir, head)
    listed = _jobs(j11=JobState.FAILED)
    for attempt in range(1, 4):
        report = reporter.check(listed)
        assert report and report[0]["reply"]["ok"] is False
        assert len(head.requests) == attempt
    assert reporter.check(listed) == [] and len(head.requests) == 3


def test_a_refusing_head_agent_is_a_failed_report(session_dir):
    head = FakeHeadAgent(answer=lambda body: {"ok": False, "error": "busy: try again"})
    reporter = LostNodeReporter(session_dir, head)
    reporter.check(_jobs(j11=JobState.FAILED))
    assert ("11", A) not in reporter.sent
    head.answer = lambda body: {"ok": True, "marked": [], "already_dead": list(body["node_ids"])}
    reporter.check(_jobs(j11=JobState.FAILED))
    assert {("11", A), ("11", B)} <= reporter.sent


def test_observing_a_query_never_waits_for_the_report(session_dir):
    gate = threading.Event()
    head = FakeHeadAgent(answer=lambda body: (gate.wait(5), {"ok": True, "marked": []})[1])
    reporter = LostNodeReporter(session_dir, head)
    started = time.monotonic()
    reporter.observe(_jobs(j11=JobState.FAILED))
    assert time.monotonic() - started < 1.0
    assert reporter.observe(_jobs(j10=JobState.RUNNING)) is None     # all running: nothing to do
    gate.set()
    deadline = time.monotonic() + 5
    while not reporter.sent and time.monotonic() < deadline:
        time.sleep(0.02)
    reporter.close()
    assert {("11", A), ("11", B)} <= reporter.sent


def test_head_control_endpoint_in_both_layouts(session_dir):
    assert head_control_endpoint(session_dir, "1") == "tcp://10.0.0.9:4100"
    # Hosted head: the first node of a worker allocation publishes both files under its job.
    session_dir.write_head_endpoint(HeadEndpoint(job_id="10", host="w-3", address="10.0.0.3:40001",
                                                 ray_version="2.60.0", started_at=1.0,
                                                 ports=MappingProxyType({"control": 4200})))
    session_dir.write_node_state(node_state("10", "w-3", control="tcp://10.0.0.3:4200", node_id=C))
    assert head_control_endpoint(session_dir, "10") == "tcp://10.0.0.3:4200"
    # Without its node file the endpoint is rebuilt from head.json.
    (session_dir.job_dir("10") / "nodes" / "w-3.json").unlink()
    assert head_control_endpoint(session_dir, "10") == "tcp://10.0.0.3:4200"
    assert head_control_endpoint(session_dir, "77") is None


# ---------------------------------------------------------------- deferred replies

def test_a_deferred_reply_reaches_the_caller():
    held: list[Deferred] = []

    def handler(env):
        held.append(Deferred())
        return held[-1]

    with ControlServer(SECRET, SID, "127.0.0.1") as server:
        answers: list[dict] = []
        client = ControlClient(server.endpoint, SECRET, SID)
        caller = threading.Thread(target=lambda: answers.append(
            client.request("mark_dead", {"node_ids": [A], "reason": "r"}, timeout=5)))
        caller.start()
        deadline = time.monotonic() + 5
        while not held and time.monotonic() < deadline:
            server.handle_ready(handler)
            time.sleep(0.01)
        server.answer(held[0], {"marked": [A]})
        caller.join(5)
        assert answers == [{"ok": True, "marked": [A]}]
        with pytest.raises(ValueError):
            server.answer(held[0], {"marked": [A]})     # one reply per request


# ---------------------------------------------------------------- the head agent's service

def test_the_service_refuses_when_this_agent_does_not_serve_the_head(session_dir):
    service = node_gone.MarkDeadService(session_dir, "1", lambda: False, lambda call: call(),
                                        lambda d, body: None, lambda *a, **k: None)
    reply = service.request({"node_ids": [A], "reason": "r"})
    assert reply["ok"] is False and "does not serve" in reply["error"]


def test_the_service_runs_the_probe_and_answers_later(session_dir, monkeypatch):
    calls = []

    def fake_mark(address, ids, *, message, timeout, env=None):
        calls.append((address, list(ids), message))
        return node_gone.gcs.MarkDeadResult(marked=(A,), already_dead=(B,), still_alive=())

    monkeypatch.setattr(node_gone.gcs, "mark_nodes_dead", fake_mark)
    answered = []
    service = node_gone.MarkDeadService(session_dir, "1", lambda: True, lambda call: call(),
                                        lambda d, body: answered.append(dict(body)), lambda *a, **k: None)
    result = service.request({"node_ids": [A, B], "reason": "slurm job 11 is FAILED"})
    assert isinstance(result, Deferred)
    deadline = time.monotonic() + 5
    while not answered and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls == [("10.0.0.9:6379", [A, B], "slurm job 11 is FAILED")]
    assert answered == [{"marked": [A], "already_dead": [B], "still_alive": []}]


def test_the_service_bounds_its_probes(session_dir, monkeypatch):
    gate = threading.Event()
    monkeypatch.setattr(node_gone.gcs, "mark_nodes_dead",
                        lambda *a, **k: (gate.wait(5), node_gone.gcs.MarkDeadResult((), (), ()))[1])
    service = node_gone.MarkDeadService(session_dir, "1", lambda: True, lambda call: call(),
                                        lambda d, body: None, lambda *a, **k: None)
    body = {"node_ids": [A], "reason": "r"}
    first = [service.request(body) for _ in range(node_gone.MAX_IN_FLIGHT)]
    assert all(isinstance(r, Deferred) for r in first)
    assert service.request(body) == {"ok": False, "error": "busy: try again"}
    gate.set()


# ---------------------------------------------------------------- the worker's own report

def test_a_worker_reports_only_to_the_head_its_node_joined(session_dir, monkeypatch):
    sent = []

    class Client:
        def __init__(self, endpoint, secret, sid):
            self.endpoint = endpoint

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def request(self, kind, body, timeout):
            sent.append((self.endpoint, kind, dict(body), timeout))
            return {"ok": True, "marked": list(body["node_ids"])}

    monkeypatch.setattr(node_gone, "ControlClient", Client)
    reporter = node_gone.GoneReporter(session_dir, SECRET, SID, lambda *a, **k: None)
    reporter.report(A, "10.0.0.9:6379", "agent stopped its Ray node")
    reporter.report(B, "10.0.0.5:6379", "joined an older head")      # not the published head: skipped
    reporter.report(C, None, "never joined")
    reporter.wait()
    assert sent == [("tcp://10.0.0.9:4100", "mark_dead", {"node_ids": [A], "reason": "agent stopped its Ray node"},
                     node_gone.REPORT_TIMEOUT)]


def test_a_worker_report_to_a_silent_head_costs_about_its_timeout(session_dir):
    # Nobody listens on the head's control port: the report gives up after its timeout.
    reporter = node_gone.GoneReporter(session_dir, SECRET, SID, lambda *a, **k: None, timeout=0.3)
    started = time.monotonic()
    reporter.report(A, "10.0.0.9:6379", "r")
    reporter.wait(timeout=0.5)
    assert time.monotonic() - started < 2.0


# ---------------------------------------------------------------- the GCS's own detector

def test_head_health_env_defaults():
    env = health_check.head_health_env({})
    assert env == {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
                   "RAY_health_check_failure_threshold": "4", "RAY_health_check_initial_delay_ms": "3000"}


def test_head_health_env_knobs_and_the_users_own_settings():
    env = health_check.head_health_env(
        {"ELASTIC_AGENT_HEALTH_CHECK_PERIOD_MS": "2000", "RAY_health_check_timeout_ms": "9000"},
        {"RAY_health_check_failure_threshold": "10"})
    assert env["RAY_health_check_period_ms"] == "2000"
    assert "RAY_health_check_timeout_ms" not in env          # the agent's environment reaches Ray as it is
    assert "RAY_health_check_failure_threshold" not in env   # the launcher's env wins


@pytest.mark.parametrize("knob, value", [("ELASTIC_AGENT_HEALTH_CHECK_PERIOD_MS", "fast"),
                                         ("ELASTIC_AGENT_HEALTH_CHECK_TIMEOUT_MS", "10"),
                                         ("ELASTIC_AGENT_HEALTH_CHECK_FAILURE_THRESHOLD", "0"),
                                         ("ELASTIC_AGENT_HEALTH_CHECK_INITIAL_DELAY_MS", "1.5")])
def test_a_bad_health_knob_is_refused_by_name(knob, value):
    with pytest.raises(ValueError, match=knob):
        health_check.head_health_env({knob: value})


def test_the_head_ray_start_gets_the_health_settings(tmp_path, monkeypatch):
    """The env the agent gives the head's (and a hosted head's) `ray start`."""
    from elastic_ray.agent.node import local_ray
    captured = {}

    class Node:
        pid = 1

        @staticmethod
        def start(cmd, log_path):
            captured[cmd.role] = dict(cmd.env)
            raise RuntimeError("stop here")

    monkeypatch.setattr(local_ray, "RayNode", Node)
    monkeypatch.setenv("ELASTIC_AGENT_HEALTH_CHECK_FAILURE_THRESHOLD", "6")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    from elastic_ray.config import SlurmRunAllocationConfig
    from elastic_ray.config.launcher import RayLauncher
    place = local_ray.NodePlace("1", "head-1", "127.0.0.2", 0, "s-1", tmp_path)
    lr = local_ray.LocalRay(place, RayLauncher(), SlurmRunAllocationConfig(partition="cpu", time_limit="10"),
                            lambda *a, **k: None, token_path=str(tmp_path / "token"))
    monkeypatch.setattr(lr, "_make_temp_dir", lambda d: None)
    with pytest.raises(RuntimeError, match="stop here"):
        lr.launch(None, lr.generation, "head")
    assert captured["head"]["RAY_health_check_failure_threshold"] == "6"
    assert captured["head"]["RAY_health_check_period_ms"] == "1000"


def test_the_probe_refuses_mark_dead_without_ids():
    run = subprocess.run([sys.executable, "-m", "elastic_ray.agent.node.gcs_probe", "mark-dead",
                          "--address=127.0.0.1:1"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and '"error":"usage"' in run.stdout and "node-ids" in run.stdout
