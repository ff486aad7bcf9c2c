"""The effects of the slurmd check (``agent.slurm.slurmd_watch``): the listener probe
against real sockets, and the watch driven through an outage with a fake
clock, probe and scheduler (the real scenario, slurmd killed on a lab node,
is ``integration/test_slurmd_gone_slurm.py::test_agent_leaves_when_slurmd_dies_and_the_job_is_requeued``,
full tier)."""

from __future__ import annotations

import os
import queue
import signal
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from elastic_ray.agent.machine import ShutdownRequested
from elastic_ray.agent.slurm.slurmd_rules import SlurmdConf
from elastic_ray.agent.slurm.slurmd_watch import (
    CHECK_ENV,
    PORT_ENV,
    UNSEEN_LIMIT,
    ListenerProbe,
    SlurmdWatch,
    check_interval,
    load_slurmd_conf,
    slurmd_listening,
)
from elastic_ray.errors import SchedulerError
from elastic_ray.scheduler.base import JobInfo, JobState

LINUX = Path("/proc/net/tcp").exists()


# ------------------------------------------------------------------ the probe, for real

def _closed_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return port


@pytest.mark.skipif(not LINUX, reason="reads /proc/net/tcp")
def test_probe_sees_a_listening_socket_and_not_a_closed_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    try:
        probe = ListenerProbe(port)
        assert probe() is True
        assert probe.tables == ("/proc/net/tcp",)  # from now on only the table it was found in
        assert slurmd_listening(_closed_port()) is False
    finally:
        server.close()
    assert probe() is False   # the listener went away: slurmd killed


@pytest.mark.skipif(not LINUX, reason="reads /proc/net/tcp")
def test_probe_ignores_a_bound_socket_that_does_not_listen_and_a_client_connection():
    bound = socket.socket()
    bound.bind(("127.0.0.1", 0))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        assert slurmd_listening(bound.getsockname()[1]) is False
        assert slurmd_listening(client.getsockname()[1]) is False   # an established socket's port
    finally:
        for sock in (bound, server, client, accepted):
            sock.close()


@pytest.mark.skipif(not (LINUX and socket.has_ipv6 and Path("/proc/net/tcp6").exists()), reason="needs IPv6")
def test_probe_sees_an_ipv6_listener():
    try:
        server = socket.socket(socket.AF_INET6)
        server.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server.listen(1)
    try:
        probe = ListenerProbe(server.getsockname()[1])
        assert probe() is True and probe.tables == ("/proc/net/tcp6",)
    finally:
        server.close()


def test_probe_without_readable_tables_says_it_cannot_tell(tmp_path):
    assert slurmd_listening(6818, (str(tmp_path / "nope"),)) is None


HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _row(n: int, port: int, state: str) -> str:
    return f"{n:4d}: 00000000:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 1\n"


@pytest.mark.parametrize("rows, found", [
    ([_row(0, 22, "0A"), _row(1, 6818, "0A")], True),
    ([_row(0, 22, "0A"), _row(1, 6818, "03"), _row(2, 6818, "0A")], True),    # old kernels: requests among listeners
    ([_row(0, 22, "0A"), _row(1, 6818, "01")], False),                        # a connection is not a listener
    ([_row(0, 22, "0A"), _row(1, 40000, "06"), _row(2, 6818, "0A")], False),  # past the listeners: not read
    (["garbage\n", _row(1, 6818, "0A")], True),
])
def test_probe_reads_the_listening_part_of_a_table(tmp_path, rows, found):
    table = tmp_path / "tcp"
    table.write_text(HEADER + "".join(rows))
    assert slurmd_listening(6818, (str(table),)) is found


# ------------------------------------------------------------------ knobs

def test_check_interval_knob():
    assert check_interval({}) == 20.0
    assert check_interval({CHECK_ENV: "15"}) == 15.0
    assert check_interval({CHECK_ENV: "0"}) == 0.0
    for bad in ("abc", "-1", "0.5", "1e9", "nan"):
        with pytest.raises(ValueError, match=CHECK_ENV):
            check_interval({CHECK_ENV: bad})


def test_slurmd_conf_from_slurm_conf_and_the_port_override(tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmdPort=7000\nSlurmdTimeout=20\nNodeName=cpu-2 Port=7002\n")
    assert load_slurmd_conf({"SLURM_CONF": str(conf)}, "cpu-1") == SlurmdConf(7000, 20.0)
    assert load_slurmd_conf({"SLURM_CONF": str(conf)}, "cpu-2") == SlurmdConf(7002, 20.0)
    assert load_slurmd_conf({"SLURM_CONF": str(conf), PORT_ENV: "7777"}, "cpu-2") == SlurmdConf(7777, 20.0)
    assert load_slurmd_conf({"SLURM_CONF": str(tmp_path / "missing")}, "cpu-1") == SlurmdConf()
    for bad in ("0", "70000", "x", "-1"):
        with pytest.raises(ValueError, match=PORT_ENV):
            load_slurmd_conf({"SLURM_CONF": str(conf), PORT_ENV: bad}, "cpu-1")


def _agent_bits(kind: str):
    info = SimpleNamespace(scheduler={"kind": kind, "state_dir": None}, job_name="er-run")
    options = SimpleNamespace(job_id="123", node="cpu-2")
    return info, options


@pytest.mark.parametrize("kind, env, off", [
    ("local", {}, "the local scheduler has no slurmd"),
    ("slurm", {CHECK_ENV: "0"}, f"{CHECK_ENV}=0"),
    ("slurm", {}, None),
])
def test_for_agent_turns_the_check_on_only_on_slurm(tmp_path, kind, env, off):
    info, options = _agent_bits(kind)
    env = {**env, "SLURM_CONF": str(tmp_path / "none")}
    watch = SlurmdWatch.for_agent(info, options, lambda *a, **k: None, lambda call: None, lambda e: None, env)
    assert watch.off == off
    assert watch.job_id == "123" and watch.node == "cpu-2"


# ------------------------------------------------------------------ the watch through an outage

class Harness:
    """A watch with a scripted probe and scheduler; lookups run on the real thread."""

    def __init__(self, *, answers=(), interval=20.0, timeout=20.0):
        self.up: bool | None = True
        self.answers = list(answers)
        self.lookups = 0
        self.logs: list[tuple[str, dict]] = []
        self.fed: list = []
        self.posted: "queue.Queue" = queue.Queue()
        self.watch = SlurmdWatch(job_id="123", node="cpu-2", interval=interval, conf=SlurmdConf(6818, timeout),
                                 probe=lambda: self.up, lookup=self._lookup, log=self._log,
                                 post=self.posted.put, feed=self.fed.append)

    def _lookup(self) -> JobInfo | None:
        self.lookups += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _log(self, event: str, **fields) -> None:
        self.logs.append((event, fields))

    def check(self, now: float) -> None:
        """One loop turn; a lookup started by it is answered before this returns."""
        before = self.lookups
        self.watch.check(now)
        if self.watch._busy:
            self.posted.get(timeout=10)()
        assert self.lookups - before <= 1

    def events(self) -> list[str]:
        return [event for event, _ in self.logs]


def _info(state: JobState, nodes=("cpu-1", "cpu-2"), reason="") -> JobInfo:
    return JobInfo(job_id="123", name="er-run", state=state, nodes=nodes, reason=reason)


def test_healthy_slurmd_never_costs_a_lookup():
    h = Harness()
    for t in range(0, 3600, 1):
        h.check(float(t))
    assert h.lookups == 0 and h.fed == []
    assert h.events() == []


def test_requeued_job_makes_the_agent_leave_with_the_reason():
    h = Harness(answers=[_info(JobState.RUNNING), _info(JobState.PENDING, (), "BeginTime")])
    h.check(0.0)                      # slurmd seen: the check applies here
    h.up = False
    for t in range(1, 200):
        h.check(float(t))
    # gone at the look of t=20; first lookup 20 s later (SlurmdTimeout); still RUNNING;
    # the next 10 s later says PENDING: leave, once.
    assert h.lookups == 2
    assert h.events() == ["slurmd_not_listening", "job_checked", "job_gone"]
    assert [type(e) for e in h.fed] == [ShutdownRequested]
    reason = h.fed[0].reason
    assert reason.startswith("job 123 is PENDING in Slurm") and "cpu-2" in reason and reason.endswith("leaving")
    gone = dict(h.logs[-1][1])
    assert gone == {"job_state": "PENDING", "reason": reason}


def test_unreachable_scheduler_keeps_serving_and_keeps_asking_slowly():
    h = Harness(answers=[SchedulerError("squeue did not finish within 10 s")] * 10, timeout=20.0)
    h.check(0.0)
    h.up = False
    for t in range(1, 400):
        h.check(float(t))
    assert h.fed == []
    assert h.events().count("job_lookup_failed") == h.lookups
    assert h.events().count("job_checked") == h.lookups
    assert 4 <= h.lookups <= 9          # asks at 40, 50, 70, 100, 160, 220, 280, 340
    assert "squeue did not finish" in h.logs[1][1]["error"]


def test_slurmd_coming_back_resets_the_outage():
    h = Harness(answers=[_info(JobState.RUNNING)] * 5)
    h.check(0.0)
    h.up = False
    for t in range(1, 45):
        h.check(float(t))
    assert h.lookups == 1
    h.up = True
    for t in range(45, 300):
        h.check(float(t))
    assert h.lookups == 1
    assert h.events() == ["slurmd_not_listening", "job_checked", "slurmd_listening_again"]
    h.up = False
    for t in range(300, 330):
        h.check(float(t))
    assert h.lookups == 1               # a new outage waits the full SlurmdTimeout again


def test_a_slurmd_never_seen_turns_the_check_off_without_asking():
    h = Harness(answers=[])
    h.up = False
    for t in range(0, 3600, 5):
        h.check(float(t))
    assert h.lookups == 0 and h.fed == []
    assert h.events() == ["slurmd_check_off"]
    assert "port 6818" in h.logs[0][1]["reason"]
    assert h.watch.off is not None and h.watch._unseen == UNSEEN_LIMIT


def test_unreadable_tables_turn_the_check_off():
    h = Harness()
    h.up = None
    h.check(0.0)
    assert h.events() == ["slurmd_check_off"] and h.watch.off is not None


def test_no_second_lookup_while_one_is_on_its_way():
    h = Harness(answers=[_info(JobState.RUNNING)])
    h.check(0.0)
    h.up = False
    h.watch.check(20.0)
    h.watch.check(40.0)               # starts the lookup; its answer is not handled yet
    assert h.watch._busy
    for t in range(41, 200):
        h.watch.check(float(t))
    h.posted.get(timeout=10)()
    assert h.lookups == 1


def test_start_logs_the_setup_and_a_sigcont_is_logged(monkeypatch):
    h = Harness()
    previous = signal.getsignal(signal.SIGCONT)
    try:
        h.watch.start()
        assert h.logs[0] == ("slurmd_check", {"every": "20s", "port": 6818, "slurmd_timeout": "20s"})
        os.kill(os.getpid(), signal.SIGCONT)
        h.check(0.0)
    finally:
        signal.signal(signal.SIGCONT, previous)
    assert ("signal_received", {"signal": "SIGCONT"}) in h.logs


def test_an_off_watch_logs_why_and_does_nothing():
    h = Harness()
    h.watch.off = "the local scheduler has no slurmd"
    previous = signal.getsignal(signal.SIGCONT)
    try:
        h.watch.start()
    finally:
        signal.signal(signal.SIGCONT, previous)
    h.up = False
    for t in range(0, 1000, 10):
        h.check(float(t))
    assert h.events() == ["slurmd_check_off"] and h.lookups == 0


@pytest.mark.skipif(not LINUX, reason="reads /proc/net/tcp")
def test_for_agent_wires_the_real_probe_and_one_scheduler_lookup(tmp_path, monkeypatch):
    """A real listener stands in for slurmd; the scheduler lookup is the one the
    agent makes (its session's job name, its own job id), answered here."""
    import elastic_ray.agent.slurm.slurmd_watch as watch_module

    asked: list[tuple] = []

    def fake_own_job_info(scheduler, job_name, job_id, timeout):
        asked.append((scheduler["kind"], job_name, job_id, timeout))
        return _info(JobState.PENDING, (), "BeginTime")

    monkeypatch.setattr(watch_module, "own_job_info", fake_own_job_info)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmdTimeout=0\n")
    env = {"SLURM_CONF": str(conf), PORT_ENV: str(server.getsockname()[1]), CHECK_ENV: "5"}
    posted: "queue.Queue" = queue.Queue()
    fed: list = []
    info, options = _agent_bits("slurm")
    watch = SlurmdWatch.for_agent(info, options, lambda *a, **k: None, posted.put, fed.append, env)
    assert watch.off is None and watch.interval == 5.0
    watch.check(0.0)
    server.close()                    # slurmd killed
    for t in range(1, 30):
        watch.check(float(t))
    posted.get(timeout=10)()
    assert asked == [("slurm", "er-run", "123", watch_module.LOOKUP_TIMEOUT)]
    assert len(fed) == 1 and "PENDING" in fed[0].reason
