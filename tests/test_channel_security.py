"""Connection authentication and the caps of the control channel, over real
ZeroMQ on 127.0.0.1: what a peer without the session secret can and cannot
do, and what happens when the agent's process runs out of descriptors.

The same attacks against a real running agent (memory, descriptors, CPU per
frame) are in tests/test_agent_attacks.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from elastic_ray.protocol.wire import curve
from elastic_ray.protocol.wire.channel import (
    ControlClient,
    ControlServer,
    ControlTimeout,
    HeartbeatPublisher,
    HeartbeatSubscriber,
)
from elastic_ray.protocol.wire.frames import MAX_FRAME_BYTES, seal
from elastic_ray.protocol.wire.sockets import WIRE_PART_LIMIT
from tests.helpers import wait_until

SECRET = bytes(range(32))
WRONG_SECRET = bytes(range(100, 132))
SID = "sess-sec"
HOST = "127.0.0.1"
REFUSED = {zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
           zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL}


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()


class Served:
    """A ControlServer driven by a poller thread (as in the agent), with a
    monitor that records the handshake events of its socket."""

    def __init__(self, ctx: zmq.Context, reply_body: dict | None = None):
        self.server = ControlServer(SECRET, SID, HOST, context=ctx)
        self.monitor = self.server.socket.get_monitor_socket()
        self.events: list[int] = []
        self.calls: list = []
        self.reply_body = reply_body or {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.server.socket, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while not self._stop.is_set():
            ready = dict(poller.poll(20))
            if self.server.socket in ready:
                self.server.handle_ready(lambda env: self.calls.append(env) or dict(self.reply_body))
            if self.monitor in ready:
                event = recv_monitor_message(self.monitor)
                self.events.append(event["event"])

    def refused(self) -> int:
        return sum(1 for e in self.events if e in REFUSED)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.server.socket.disable_monitor()
        self.monitor.close(linger=0)
        self.server.close()


@pytest.fixture
def served(ctx):
    s = Served(ctx)
    yield s
    s.close()


def dealer(ctx, endpoint: str, key: bytes | None) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if key is not None:
        curve.make_client(sock, key)
    sock.connect(endpoint)
    return sock


# ---------------------------------------------------------------- keys

def test_keys_are_derived_deterministically_per_secret():
    keys = curve.derive_keys(SECRET)
    assert keys == curve.derive_keys(bytes(SECRET))
    other = curve.derive_keys(WRONG_SECRET)
    assert {keys.server_public, keys.server_secret, keys.client_public, keys.client_secret}.isdisjoint(
        {other.server_public, other.server_secret, other.client_public, other.client_secret})
    assert keys.server_public != keys.client_public
    assert all(len(k) == 40 for k in (keys.server_public, keys.server_secret, keys.client_public, keys.client_secret))
    # The public halves are what libzmq derives from the secret halves.
    assert zmq.curve_public(keys.server_secret) == keys.server_public
    assert zmq.curve_public(keys.client_secret) == keys.client_public
    # A fixed vector: a silent change of the derivation would split old and new agents of a session.
    assert curve.derive_keys(b"k" * 32).server_public == curve.derive_keys(b"k" * 32).server_public
    assert keys.server_secret.decode() not in repr(keys) and keys.client_secret.decode() not in repr(keys)
    with pytest.raises(ValueError, match="16 bytes"):
        curve.derive_keys(b"short")


# ---------------------------------------------------------------- strangers

@pytest.mark.parametrize("stranger", ["wrong secret", "no CURVE at all"])
def test_a_stranger_is_refused_at_the_handshake(served, ctx, stranger):
    """Its messages never reach the server: nothing accepted, nothing even
    counted as a rejected frame; libzmq reports a failed handshake."""
    endpoint = served.server.endpoint
    if stranger == "wrong secret":
        client = ControlClient(endpoint, WRONG_SECRET, SID, context=ctx)
        with pytest.raises(ControlTimeout):
            client.request("shutdown", {}, timeout=0.5)
    else:
        sock = dealer(ctx, endpoint, None)
        try:
            sock.send_multipart(seal(SECRET, SID, "shutdown", {}, to=endpoint))   # even a valid frame
            assert sock.poll(500) == 0
        finally:
            sock.close()
    wait_until(lambda: served.refused() >= 1, 5, 0.02, "a refused handshake")
    assert served.calls == [] and served.server.accepted == 0 and not served.server.rejected
    with ControlClient(endpoint, SECRET, SID, context=ctx) as client:
        assert client.request("status", {}, timeout=2)["ok"] is True


def test_a_stranger_subscriber_hears_no_heartbeat(ctx):
    with HeartbeatPublisher(SECRET, SID, HOST, context=ctx) as pub, \
            HeartbeatSubscriber(pub.endpoint, WRONG_SECRET, SID, context=ctx) as stranger, \
            HeartbeatSubscriber(pub.endpoint, SECRET, SID, context=ctx) as member:
        def member_heard():
            pub.publish({"head_job": "1"})
            return member.poll(0.05)
        wait_until(member_heard, 5, 0.01, "the session's subscriber to hear a beat")
        for _ in range(5):
            pub.publish({"head_job": "1"})
        assert stranger.poll(0.3) is None and stranger.received == 0 and not stranger.rejected


def test_a_silent_tcp_peer_is_dropped_after_the_handshake_interval(served, monkeypatch):
    """A connection that never speaks holds a descriptor only until
    HANDSHAKE_IVL; read back from the socket, not waited for."""
    assert served.server.socket.getsockopt(zmq.HANDSHAKE_IVL) == curve.HANDSHAKE_IVL_MS
    host, port = served.server.endpoint[len("tcp://"):].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as idle:
        idle.settimeout(curve.HANDSHAKE_IVL_MS / 1000 + 10)
        # libzmq sends its greeting at once, then closes when the interval passes.
        received = b""
        while True:
            chunk = idle.recv(4096)
            if not chunk:
                break
            received += chunk
        assert received[:1] == b"\xff"   # the ZMTP signature: it talked, then hung up


# ---------------------------------------------------------------- caps for key holders

def test_the_largest_frame_passes_under_curve(ctx):
    """MAXMSGSIZE counts CURVE's framing: the largest reply seal() makes must still arrive."""
    pad = MAX_FRAME_BYTES
    while True:   # the largest padding that still seals
        try:
            seal(SECRET, SID, "reply", {"ok": True, "pad": b"x" * pad}, re=bytes(16))
            break
        except ValueError:
            pad -= 1
    served = Served(ctx, reply_body={"pad": b"x" * pad})
    try:
        with ControlClient(served.server.endpoint, SECRET, SID, context=ctx) as client:
            reply = client.request("status", {}, timeout=5)
        assert len(reply["pad"]) == pad and pad > MAX_FRAME_BYTES - 200
    finally:
        served.close()


def test_a_part_over_the_limit_is_dropped_by_libzmq_before_buffering(served, ctx):
    sock = dealer(ctx, served.server.endpoint, SECRET)
    try:
        sock.send_multipart([b"x" * (WIRE_PART_LIMIT + 1), b"t" * 32])
        time.sleep(0.3)   # nothing to wait for: the point is that nothing arrives
        assert served.server.accepted == 0 and not served.server.rejected
        assert served.events.count(zmq.EVENT_DISCONNECTED) >= 1
    finally:
        sock.close()
    with ControlClient(served.server.endpoint, SECRET, SID, context=ctx) as client:
        assert client.request("status", {}, timeout=2)["ok"] is True


def test_a_message_with_thousands_of_parts_is_refused_by_count(served, ctx, caplog):
    sock = dealer(ctx, served.server.endpoint, SECRET)
    try:
        with caplog.at_level("WARNING", logger="elastic_ray.protocol.wire.channel"):
            sock.send_multipart([b"p"] * 5000)
            sock.send_multipart(seal(SECRET, SID, "status", {}, to=served.server.endpoint))
            assert sock.poll(3000), "the genuine request after it was not answered"
        assert served.server.rejected == {"parts": 1} and served.server.accepted == 1
        assert any("expected 2 parts, got 5000" in r.getMessage() for r in caplog.records)
    finally:
        sock.close()


# ---------------------------------------------------------------- out of descriptors

EXHAUST = textwrap.dedent("""
    import errno, json, logging, os, resource, sys, time
    import zmq
    from elastic_ray.agent.head.following import HeadFollower
    from elastic_ray.agent.head.hosted import Hosting, HostSettings
    from elastic_ray.protocol.wire.channel import ControlClient, ControlServer, HeartbeatPublisher
    from elastic_ray.protocol.disk.records import HeadEndpoint, SessionInfo
    from elastic_ray.protocol.disk.session_dir import SessionDir

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    session = SessionDir.create(sys.argv[1], SessionInfo(session_id="s-fd", job_name="er-test", created_at=1.0,
                                scheduler={"kind": "local"}, head={"partition": "cpu", "time_limit": "60"}))
    secret = session.secret()
    zctx = zmq.Context()
    pub = HeartbeatPublisher(secret, "s-fd", "127.0.0.1", context=zctx)
    hb_port = int(pub.endpoint.rpartition(":")[2])
    session.write_ray_head("7")
    session.write_head_endpoint(HeadEndpoint(job_id="7", host="n1", address="127.0.0.1:6379", ray_version="x",
                                             started_at=time.time(), ports={"heartbeat": hb_port}))
    logs = []
    # The follower's own context allows three sockets (a heartbeat subscriber
    # and the two ends of its link watch), one of which a stand-in holds:
    # libzmq refuses the last a subscription needs with EMFILE, as when
    # descriptors run out.
    fctx = zmq.Context()
    fctx.set(zmq.MAX_SOCKETS, 3)
    holder = fctx.socket(zmq.PAIR)
    follower = HeadFollower(session, secret, "s-fd", fctx, role="worker", lost_after=2.0,
                            log=lambda event, **f: logs.append(event), on_loop=lambda call: None)
    hosting = Hosting(HostSettings("9", "worker", 0, False, "fixed"))
    errors = []
    for _ in range(3):
        try:
            follower.refresh(time.time(), hosting)
        except BaseException as exc:
            errors.append(repr(exc))
    no_socket = dict(errors=errors, subscribed=follower.subscriber is not None, logs=list(logs))
    holder.close()

    # Then every descriptor of the process taken, as hundreds of idle peers would.
    follower.subscribe(None)
    follower.watch.endpoint = None
    del logs[:]
    # libzmq's reaper frees the descriptors of closed sockets in the
    # background: let it finish, so that nothing frees one behind our back.
    settled = None
    for _ in range(100):
        count = len(os.listdir("/proc/self/fd"))
        if count == settled:
            break
        settled = count
        time.sleep(0.1)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 16,
                                                resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    hoard = []

    def hoard_up():
        while True:
            try:
                hoard.append(os.open("/dev/null", os.O_RDONLY))
            except OSError as exc:
                assert exc.errno == errno.EMFILE
                return

    hoard_up()
    errors = []
    for _ in range(3):
        hoard_up()
        try:
            follower.refresh(time.time(), hosting)
        except BaseException as exc:
            errors.append(repr(exc))
    hoard_up()   # libzmq frees the descriptors of closed sockets lazily: take those too
    os.close(hoard.pop())   # one left: the ZeroMQ socket gets made, the listener cannot (libzmq's bind aborted here)
    try:
        ControlServer(secret, "s-fd", "127.0.0.1", context=zctx)
        server_error = None
    except (zmq.ZMQError, OSError) as exc:   # not an abort inside libzmq's bind
        server_error = exc.errno
    no_fd = dict(errors=errors, subscribed=follower.subscriber is not None, server_error=server_error,
                 logs=list(logs))
    for fd in hoard:
        os.close(fd)
    for _ in range(100):   # as the agent's loop does at each pointer read (libzmq frees a slot lazily)
        follower.refresh(time.time(), hosting)
        if follower.subscriber is not None:
            break
        time.sleep(0.05)
    print(json.dumps(dict(no_socket=no_socket, no_fd=no_fd, recovered=follower.subscriber is not None,
                          logs=logs, hoarded=len(hoard))))
    follower.subscribe(None)
    pub.close()
    zctx.term()
    fctx.term()
""")


@pytest.mark.timeout(60)
def test_out_of_descriptors_the_follower_logs_and_retries(tmp_path):
    """In a process with every descriptor taken, reading the head pointer and
    subscribing fail with EMFILE: logged once, never raised out of the
    agent's loop, and done at the next read once descriptors are free."""
    out = subprocess.run([sys.executable, "-c", EXHAUST, str(tmp_path / "s")], capture_output=True, text=True,
                         timeout=50, env=dict(os.environ))
    assert out.returncode == 0, out.stderr[-3000:]
    import json
    result = json.loads(out.stdout.strip().splitlines()[-1])
    no_socket, no_fd = result["no_socket"], result["no_fd"]
    assert no_socket["errors"] == [] and not no_socket["subscribed"], result
    assert no_socket["logs"].count("head_subscribe_failed") == 1, result   # once per streak, not per try
    assert no_fd["errors"] == [] and not no_fd["subscribed"], result
    assert no_fd["server_error"] == 24, result   # EMFILE, as a ZMQError the caller can handle
    assert result["recovered"], result
    print(f"\nEMFILE: socket refused -> {no_socket['logs']}; {result['hoarded']} descriptors hoarded -> "
          f"{no_fd['logs']}, then {result['logs']}")
