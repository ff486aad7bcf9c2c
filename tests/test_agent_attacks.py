"""Strangers against a real running agent (real Ray, local scheduler): the
trickle attack, hundreds of idle connections, a flood of garbage.

The attacker holds no session secret. Before connections were authenticated
(CURVE), a stranger's DEALER could make an agent buffer a 2000-part message
(+115 MB) for as long as it kept the message open; now it fails the
handshake, and whatever it sends is dropped before a message part is
buffered. Each test checks that the agent still answers an authenticated
``status``, stays JOINED with the same Ray node, and prints the figures for
the operations note. Speed is printed, never asserted.
"""

from __future__ import annotations

import inspect
import random
import socket
import struct
import time

import psutil
import pytest
import zmq

from elastic_ray import SlurmRunAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.session import Session
from elastic_ray.protocol.wire.channel import ControlClient

from tests.helpers import wait_until

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]

NO_SUPERVISOR = {"supervise": False} if "supervise" in inspect.signature(Session.create).parameters else {}
MB = 1024 * 1024


@pytest.fixture(scope="module")
def head(tmp_path_factory):
    """One head agent with its Ray node, shared by the attacks below."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    session = Session.create(tmp_path_factory.mktemp("attacks") / "s", scheduler="local",
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="30", mem="2G"),
                             launcher=RayLauncher(object_store_memory=100_000_000), **NO_SUPERVISOR)
    try:
        session.wait_for_head(timeout=90)
        job = session.dir.read_ray_head()
        state = wait_until(lambda: _joined(session, job), 60, 0.5, "the head agent to be JOINED")
        yield session, job, state
    finally:
        session.teardown()
        wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                   message="session jobs did not end after teardown")
        mp.undo()


def _joined(session: Session, job: str) -> dict | None:
    state = next(iter(session.node_states(job).values()), None)
    return state.to_dict() if state is not None and state.state.value == "JOINED" else None


def _host_port(endpoint: str) -> tuple[str, int]:
    host, port = endpoint[len("tcp://"):].rsplit(":", 1)
    return host, int(port)


def still_serving(session: Session, before: dict) -> dict:
    """An authenticated status answers: same agent, same Ray node, JOINED."""
    client = ControlClient(before["control"], session.dir.secret(), session.info.session_id)
    status = client.request("status", {}, timeout=10)["status"]
    assert status["pid"] == before["pid"] and status["state"] == "JOINED", status
    assert status["node_id"] == before["node_id"], status
    return status


def zmtp_greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting (64 bytes) offering ``mechanism``, as a client."""
    return b"\xff" + b"\0" * 8 + b"\x7f" + b"\x03\x00" + mechanism.ljust(20, b"\0") + b"\x00" + b"\0" * 31


def null_ready_then_huge_message_head() -> bytes:
    """After a NULL greeting: READY, then the header of a 60 kB part with MORE
    set, the start of the multipart message that used to be buffered."""
    props = b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
    ready = b"\x05READY" + props
    return bytes([0x04, len(ready)]) + ready + bytes([0x03]) + struct.pack(">Q", 60_000)


# ---------------------------------------------------------------- the trickle attack

@pytest.mark.timeout(120)
def test_trickle_attack_keeps_agent_memory_bounded(head):
    session, _job, before = head
    agent = psutil.Process(before["pid"])
    host, port = _host_port(before["control"])
    baseline = agent.memory_info().rss
    peak = baseline
    rng = random.Random(7)
    sent = refused = 0
    ctx = zmq.Context()
    strangers = []
    try:
        # The original attack with a ZeroMQ peer: no key (NULL) and a made-up CURVE key.
        plain = ctx.socket(zmq.DEALER)
        made_up = ctx.socket(zmq.DEALER)
        public, secret = zmq.curve_keypair()
        server_guess, _ = zmq.curve_keypair()
        made_up.setsockopt(zmq.CURVE_SERVERKEY, server_guess)
        made_up.setsockopt(zmq.CURVE_PUBLICKEY, public)
        made_up.setsockopt(zmq.CURVE_SECRETKEY, secret)
        for sock in (plain, made_up):
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, 4000)
            sock.connect(before["control"])
            strangers.append(sock)
            try:
                sock.send_multipart([rng.randbytes(60_000)] * 2000, zmq.NOBLOCK, copy=False)
            except zmq.Again:
                pass
        # And by hand, on raw TCP: greetings followed by an endless message, a few kB at a time.
        deadline = time.monotonic() + 20
        conns: list[socket.socket] = []
        while time.monotonic() < deadline:
            while len(conns) < 20:
                conn = socket.create_connection((host, port), timeout=5)
                conn.setblocking(False)
                mechanism = b"NULL" if len(conns) % 2 else b"CURVE"
                head_bytes = zmtp_greeting(mechanism)
                if mechanism == b"NULL":
                    head_bytes += null_ready_then_huge_message_head()
                try:
                    conn.send(head_bytes)
                except OSError:
                    pass
                conns.append(conn)
            for conn in list(conns):
                try:
                    sent += conn.send(rng.randbytes(4096))
                except BlockingIOError:
                    pass
                except OSError:   # the agent hung up on us: dial again
                    refused += 1
                    conn.close()
                    conns.remove(conn)
            peak = max(peak, agent.memory_info().rss)
            time.sleep(0.05)
        for conn in conns:
            conn.close()
        status = still_serving(session, before)
        peak = max(peak, agent.memory_info().rss)
    finally:
        for sock in strangers:
            sock.close()
        ctx.term()
    growth = (peak - baseline) / MB
    print(f"\ntrickle: agent RSS {baseline / MB:.1f} MB -> peak {peak / MB:.1f} MB (+{growth:.1f} MB) over 20 s; "
          f"{sent / MB:.1f} MB trickled on raw TCP, {refused} connections closed by the agent; "
          f"rejected frames counted: {status['requests']['rejected']}")
    assert growth < 20, f"agent RSS grew by {growth:.1f} MB"
    assert status["requests"]["rejected"] == before["requests"]["rejected"]   # nothing even reached the checks


# ---------------------------------------------------------------- idle connections

@pytest.mark.timeout(120)
def test_300_idle_connections_change_nothing(head):
    session, _job, before = head
    agent = psutil.Process(before["pid"])
    host, port = _host_port(before["control"])
    fds_before = agent.num_fds()
    conns = []
    try:
        for _ in range(300):
            conns.append(socket.create_connection((host, port), timeout=5))
        fds_held = wait_until(lambda: agent.num_fds() >= fds_before + 300 and agent.num_fds(), 20, 0.1,
                              "the agent to accept the 300 connections")
        still_serving(session, before)
        # They never finish a handshake: the agent hangs up on each after HANDSHAKE_IVL
        # while we keep our ends open.
        fds_reaped = wait_until(lambda: agent.num_fds() <= fds_before + 5 and agent.num_fds(), 60, 0.5,
                                "the agent to drop the idle connections")
        closed_by_agent = sum(1 for c in conns if _closed_by_peer(c))
        status = still_serving(session, before)
    finally:
        for conn in conns:
            conn.close()
    assert _joined(session, before["job_id"]) is not None
    print(f"\nidle connections: agent descriptors {fds_before} -> {fds_held} with 300 idle peers -> "
          f"{fds_reaped} after the handshake interval ({closed_by_agent}/300 closed by the agent); "
          f"status answered, state {status['state']}")
    assert closed_by_agent == 300


def _closed_by_peer(conn: socket.socket) -> bool:
    conn.settimeout(1)
    try:
        while True:
            chunk = conn.recv(4096)   # the agent's greeting, then EOF
            if not chunk:
                return True
    except OSError:   # reset also means closed
        return True


# ---------------------------------------------------------------- a flood of garbage

FLOOD = 2000


@pytest.mark.timeout(180)
def test_garbage_flood_cost_per_rejected_frame(head):
    session, _job, before = head
    agent = psutil.Process(before["pid"])
    host, port = _host_port(before["control"])
    rng = random.Random(11)

    def cpu() -> float:
        t = agent.cpu_times()
        return t.user + t.system

    idle_start, idle_cpu = time.monotonic(), cpu()
    time.sleep(3)
    idle_rate = (cpu() - idle_cpu) / (time.monotonic() - idle_start)

    start, cpu_start = time.monotonic(), cpu()
    deadline = start + 120
    frames = failed = 0
    while frames < FLOOD and time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=5) as conn:
                shape = frames % 3
                if shape == 0:     # pure noise
                    payload = rng.randbytes(rng.randrange(1, 4096))
                elif shape == 1:   # a CURVE greeting, then a forged HELLO-sized command
                    payload = zmtp_greeting(b"CURVE") + bytes([0x04, 200]) + b"\x05HELLO" + rng.randbytes(194)
                else:              # a NULL greeting and READY, then a message part
                    payload = zmtp_greeting(b"NULL") + null_ready_then_huge_message_head() + rng.randbytes(1000)
                conn.sendall(payload)
            frames += 1
        except OSError:
            failed += 1
    elapsed = time.monotonic() - start
    # Let the agent finish with the last ones before reading its clock.
    status = still_serving(session, before)
    spent = cpu() - cpu_start - idle_rate * (time.monotonic() - start)
    print(f"\ngarbage flood: {frames} frames on {frames} connections ({failed} failed to connect) in {elapsed:.2f} s; "
          f"agent CPU "
          f"{spent * 1000:.0f} ms beyond idle ({idle_rate * 1000:.1f} ms/s) = {spent / frames * 1e6:.0f} us "
          f"per rejected frame; rejected frames counted {status['requests']['rejected']} (none reached the checks)")
    assert frames >= 100, "the flood hardly started"
    assert status["requests"]["rejected"] == before["requests"]["rejected"]
