"""The control channel over real sockets on 127.0.0.1.

The server runs in a thread of the test, driven by a zmq.Poller exactly as
the agent's loop will drive it. Hostile peers are raw ZeroMQ sockets.
"""

from __future__ import annotations

import collections
import random
import socket
import threading
import time

import msgpack
import pytest
import zmq

from elastic_ray.protocol.wire.channel import (
    ControlClient,
    ControlError,
    ControlServer,
    ControlTimeout,
    HeartbeatPublisher,
    HeartbeatSubscriber,
)
from elastic_ray.protocol.wire import curve
from elastic_ray.protocol.wire.frames import MAX_FRAME_BYTES, REQUEST_KINDS, seal, sign
from elastic_ray.protocol.wire.sockets import WIRE_PART_LIMIT
from tests.helpers import wait_until

SECRET = bytes(range(32))
WRONG_SECRET = bytes(range(100, 132))
SID = "sess-chan"
HOST = "127.0.0.1"


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()  # hangs if any socket was left open: every test must close what it opens


class ServerThread:
    """A ControlServer served by a poller loop in a thread, as in the agent."""

    def __init__(self, ctx: zmq.Context):
        self.server = ControlServer(SECRET, SID, HOST, context=ctx)
        self.calls: list = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="control-server", daemon=True)
        self._thread.start()

    def handler(self, env):
        self.calls.append(env)
        if env.body.get("reason") == "boom":
            raise RuntimeError("boom")
        if env.body.get("reason") == "not a dict":
            return ["x"]
        if env.body.get("reason") == "unsealable":
            return {"value": object()}
        return {"kind": env.kind, "echo": dict(env.body)}

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.server.socket, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(20):
                    self.server.handle_ready(self.handler)
        except BaseException as exc:  # recorded: the test asserts there were none
            self.errors.append(exc)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        assert not self._thread.is_alive()
        self.server.close()


@pytest.fixture
def served(ctx):
    st = ServerThread(ctx)
    yield st
    st.stop()
    assert st.errors == []


def client_for(st: ServerThread, ctx, **kw) -> ControlClient:
    return ControlClient(st.server.endpoint, SECRET, SID, context=ctx, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- request / reply

def test_round_trip(served, ctx):
    assert served.server.endpoint.startswith(f"tcp://{HOST}:")
    with client_for(served, ctx) as client:
        assert client.request("status", {}, timeout=2) == {"ok": True, "kind": "status", "echo": {}}
        deadline = time.time() + 60
        reply = client.request("drain", {"deadline": deadline, "reason": "removed"}, timeout=2)
        assert reply["echo"] == {"deadline": deadline, "reason": "removed"}
        assert client.request("follow", {"head_job": "4242"}, timeout=2)["echo"] == {"head_job": "4242"}
    assert [c.kind for c in served.calls] == ["status", "drain", "follow"]
    assert served.server.accepted == 3 and not served.server.rejected


def test_handler_failures_become_error_replies(served, ctx):
    client = client_for(served, ctx)
    assert client.request("shutdown", {"reason": "boom"}, timeout=2) == {"ok": False, "error": "RuntimeError: boom"}
    reply = client.request("shutdown", {"reason": "not a dict"}, timeout=2)
    assert reply["ok"] is False and "handler returned list" in reply["error"]
    reply = client.request("shutdown", {"reason": "unsealable"}, timeout=2)
    assert reply["ok"] is False and "could not be sealed" in reply["error"]
    assert client.request("status", timeout=2)["ok"] is True  # still serving
    assert served.server.handler_errors == 3


def test_bad_request_refused_before_sending(served, ctx):
    client = client_for(served, ctx)
    with pytest.raises(ValueError, match=r"drain\.deadline"):
        client.request("drain", {"deadline": "soon"}, timeout=1)
    with pytest.raises(ValueError, match="not a request kind"):
        client.request("heartbeat", {}, timeout=1)
    assert served.calls == []


def test_concurrent_clients_from_threads(served, ctx):
    client = client_for(served, ctx)
    results: list = []

    def call(i: int) -> None:
        for _ in range(20):
            results.append(client.request("follow", {"head_job": str(i)}, timeout=5)["echo"]["head_job"])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert sorted(collections.Counter(results).items()) == [(str(i), 20) for i in range(4)]


@pytest.mark.parametrize("target", ["closed port", "silent tcp listener", "server not polling"])
def test_timeout_is_bounded(ctx, target):
    listener = server = None
    if target == "closed port":
        endpoint = f"tcp://{HOST}:{free_port()}"
    elif target == "silent tcp listener":  # accepts TCP, never speaks ZMTP
        listener = socket.socket()
        listener.bind((HOST, 0))
        listener.listen(8)
        endpoint = f"tcp://{HOST}:{listener.getsockname()[1]}"
    else:  # alive and bound, but its owner never calls handle_ready
        server = ControlServer(SECRET, SID, HOST, context=ctx)
        endpoint = server.endpoint
    try:
        client = ControlClient(endpoint, SECRET, SID, context=ctx)
        for _ in range(3):
            start = time.monotonic()
            with pytest.raises(ControlTimeout, match="no reply within 0.3 s"):
                client.request("status", {}, timeout=0.3)
            elapsed = time.monotonic() - start
            assert 0.3 <= elapsed < 1.0, elapsed
    finally:
        if listener:
            listener.close()
        if server:
            server.close()


def test_timeout_is_also_a_timeout_error():
    assert issubclass(ControlTimeout, TimeoutError) and issubclass(ControlTimeout, ControlError)


class FakeAgent:
    """A raw ROUTER that answers each request with ``make_reply(request_parts)``."""

    def __init__(self, ctx, make_reply, key=SECRET):
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        curve.make_server(self.sock, key)   # the session's CURVE key; ``make_reply`` decides the seal
        self.sock.bind(f"tcp://{HOST}:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.make_reply = make_reply
        self.last_reply = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            if self.sock.poll(20):
                identity, *parts = self.sock.recv_multipart()
                request = msgpack.unpackb(parts[0])
                reply = self.make_reply(request)
                self.last_reply = reply
                self.sock.send_multipart([identity, *reply])

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def genuine(request):
    return seal(SECRET, SID, "reply", {"ok": True}, re=request["nonce"])


@pytest.mark.parametrize("make_reply, match", [
    (lambda req: seal(WRONG_SECRET, SID, "reply", {"ok": True}, re=req["nonce"]), "bad_tag"),
    (lambda req: seal(SECRET, "other-session", "reply", {"ok": True}, re=req["nonce"]), "session"),
    (lambda req: seal(SECRET, SID, "reply", {"ok": True}, re=b"x" * 16), "answers another request"),
    (lambda req: seal(SECRET, SID, "heartbeat", {"src": "a", "seq": 1}), "unexpected_kind"),
    (lambda req: seal(SECRET, SID, "reply", {"ok": True}, time.time() - 3600, re=req["nonce"]), "skew"),
    (lambda req: [b"garbage"], "parts"),
    (lambda req: [b"x" * 40, b"y" * 32], "bad_tag"),
], ids=["wrong secret", "wrong session", "wrong re", "heartbeat as reply", "stale", "one part", "random"])
def test_forged_reply_refused(ctx, make_reply, match):
    agent = FakeAgent(ctx, make_reply)
    try:
        client = ControlClient(agent.endpoint, SECRET, SID, context=ctx)
        with pytest.raises(ControlError, match=match) as info:
            client.request("status", {}, timeout=2)
        assert not isinstance(info.value, ControlTimeout)
    finally:
        agent.close()


def test_replayed_reply_refused(ctx):
    """A genuine reply to an earlier call does not answer a later one."""
    agent = FakeAgent(ctx, genuine)
    try:
        client = ControlClient(agent.endpoint, SECRET, SID, context=ctx)
        assert client.request("status", {}, timeout=2) == {"ok": True}
        captured = agent.last_reply
        agent.make_reply = lambda req: captured
        with pytest.raises(ControlError):
            client.request("status", {}, timeout=2)
    finally:
        agent.close()


def test_request_from_wrong_secret_gets_no_answer(served, ctx):
    """Another secret means other CURVE keys: refused at the handshake, so the
    request never reaches the server's frame checks (nothing counted)."""
    client = ControlClient(served.server.endpoint, WRONG_SECRET, SID, context=ctx)
    with pytest.raises(ControlTimeout):
        client.request("status", {}, timeout=0.3)
    assert served.calls == [] and served.server.rejected == {} and served.server.accepted == 0


def test_right_curve_key_but_wrong_hmac_secret_is_refused_by_the_tag(served, ctx):
    """The per-message HMAC is a second, independent check behind CURVE."""
    dealer = raw_dealer(ctx, served.server.endpoint)
    try:
        dealer.send_multipart(seal(WRONG_SECRET, SID, "shutdown", {}, to=served.server.endpoint))
        wait_until(lambda: served.server.rejected["bad_tag"] == 1, 5, 0.01, "the bad_tag rejection")
        assert served.calls == [] and dealer.poll(100) == 0
    finally:
        dealer.close()


def test_an_impostor_on_the_agents_port_gets_no_request_through(ctx):
    """A server without the session's keys (another session's agent reusing
    the port, or a squatter) cannot complete the handshake: the client
    times out and never reads a byte from it."""
    agent = FakeAgent(ctx, genuine, key=WRONG_SECRET)
    try:
        client = ControlClient(agent.endpoint, SECRET, SID, context=ctx)
        with pytest.raises(ControlTimeout):
            client.request("status", {}, timeout=0.5)
        assert agent.last_reply is None
    finally:
        agent.close()


def test_request_addressed_to_another_agent_refused(served, ctx):
    """The destination is the published endpoint string, compared exactly."""
    port = served.server.endpoint.rsplit(":", 1)[1]
    client = ControlClient(f"tcp://localhost:{port}", SECRET, SID, context=ctx)
    with pytest.raises(ControlTimeout):
        client.request("status", {}, timeout=0.3)
    assert served.calls == [] and served.server.rejected == {"destination": 1}


def raw_dealer(ctx, endpoint: str, key: bytes = SECRET) -> zmq.Socket:
    """A hostile peer that holds the session's CURVE keys (an insider, or a bug):
    what it sends reaches the frame checks."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    curve.make_client(sock, key)
    sock.setsockopt(zmq.SNDTIMEO, 5000)
    sock.connect(endpoint)
    return sock


def test_replayed_request_runs_once(served, ctx):
    dealer = raw_dealer(ctx, served.server.endpoint)
    try:
        request = seal(SECRET, SID, "shutdown", {}, to=served.server.endpoint)
        dealer.send_multipart(request)
        assert dealer.poll(2000)
        dealer.recv_multipart()
        dealer.send_multipart(request)
        beat = seal(SECRET, SID, "heartbeat", {"src": "a", "seq": 1})
        dealer.send_multipart(beat)  # an overheard heartbeat is not a request
        wait_until(lambda: sum(served.server.rejected.values()) == 2, 5, 0.01, "two rejections")
        assert served.server.rejected == {"replay": 1, "unexpected_kind": 1}
        assert len(served.calls) == 1
        assert dealer.poll(100) == 0  # rejected frames get no reply
    finally:
        dealer.close()


def test_rejections_are_logged_with_peer(served, ctx, caplog):
    dealer = raw_dealer(ctx, served.server.endpoint)
    try:
        with caplog.at_level("WARNING", logger="elastic_ray.protocol.wire.channel"):
            dealer.send_multipart([b"hello"])
            wait_until(lambda: served.server.rejected["parts"] == 1, 5, 0.01, "the 'parts' rejection")
        lines = [r.getMessage() for r in caplog.records]
        assert any(line.startswith("event=frame_rejected reason=parts peer=127.0.0.1") for line in lines), lines
    finally:
        dealer.close()


def test_server_close_is_idempotent(ctx):
    with ControlServer(SECRET, SID, HOST, context=ctx) as server:
        pass
    server.close()
    with pytest.raises(ValueError, match="closed"):
        server.socket


def test_explicit_port(ctx):
    port = free_port()
    with ControlServer(SECRET, SID, HOST, port, context=ctx) as server:
        assert server.endpoint == f"tcp://{HOST}:{port}"


# ---------------------------------------------------------------- fuzz

FUZZ_FRAMES = 10_000
CURVE_FRAMING = 33   # bytes libzmq adds to a part under CURVE and counts against MAXMSGSIZE


def reaches_server(part: bytes) -> bool:
    return len(part) + CURVE_FRAMING <= WIRE_PART_LIMIT


def fuzz_cases(rng: random.Random, endpoint: str, captured: list[list[bytes]]):
    """Yield (parts, expected rejection reason or None if libzmq drops it).

    Frames are sealed when yielded, so their timestamps are fresh.
    """
    def valid(kind="status", body=None, secret=SECRET, **kw):
        return seal(secret, SID, kind, body or {}, to=endpoint if kind in REQUEST_KINDS else None, **kw)

    def signed_env(env):
        packed = msgpack.packb(env, use_bin_type=True)
        return [packed, sign(SECRET, packed)]

    def envelope(**over):
        env = {"v": 1, "kind": "drain", "ts": time.time(), "nonce": rng.randbytes(16), "sid": SID,
               "body": {"deadline": time.time() + 60}, "to": endpoint}
        env.update(over)
        return env

    type_mutations = [
        ({"kind": 5}, "bad_envelope"), ({"ts": "now"}, "bad_envelope"), ({"ts": None}, "bad_envelope"),
        ({"nonce": "n" * 16}, "bad_envelope"), ({"nonce": 7}, "bad_envelope"), ({"v": "1"}, "bad_envelope"),
        ({"v": 1.0}, "bad_envelope"), ({"sid": None}, "bad_envelope"), ({"to": [endpoint]}, "bad_envelope"),
        ({"body": [1, 2]}, "bad_body"), ({"body": {"deadline": "soon"}}, "bad_body"),
        ({"body": {"deadline": True}}, "bad_body"), ({"body": {"deadline": 1.0, "reason": 5}}, "bad_body"),
        ({"body": {"deadline": 1.0, "extra": 1}}, "bad_body"), ({"kind": "follow", "body": {"head_job": 5}}, "bad_body"),
        ({"v": 2}, "version"), ({"v": -1}, "version"), ({"sid": "other"}, "session"),
        ({"kind": "reboot"}, "unknown_kind"), ({"ts": time.time() - 1000}, "skew"),
        ({"to": "tcp://10.9.9.9:1"}, "destination"),
    ]
    huge = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
            b"\x91" * 5000, b"\x81\xa1k" * 3000, b"\xdc\xff\xff" + b"\xc0" * 100]
    categories = ["random", "random2", "bitflip", "replay", "wrong_secret", "parts", "huge", "types", "kinds"]
    for _ in range(FUZZ_FRAMES):
        category = rng.choice(categories)
        if category == "random":
            part = rng.randbytes(rng.randrange(0, 100 * 1024))
            yield [part], ("parts" if reaches_server(part) else None)
        elif category == "random2":
            a, b = rng.randrange(0, 100 * 1024), rng.randrange(0, 64)
            if not reaches_server(bytes(a)):
                yield [rng.randbytes(a), rng.randbytes(b)], None
            else:
                yield [rng.randbytes(a), rng.randbytes(b)], ("oversized" if a + b > MAX_FRAME_BYTES else "bad_tag")
        elif category == "bitflip":
            parts = valid("drain", {"deadline": time.time() + 60, "reason": "x" * rng.randrange(0, 200)})
            index = rng.randrange(2)
            flipped = bytearray(parts[index])
            bit = rng.randrange(len(flipped) * 8)
            flipped[bit // 8] ^= 1 << (bit % 8)
            parts[index] = bytes(flipped)
            yield parts, "bad_tag"
        elif category == "replay":
            yield list(rng.choice(captured)), "replay"
        elif category == "wrong_secret":
            yield valid(rng.choice(sorted(REQUEST_KINDS - {"drain", "follow", "host_head", "standby_head",
                                                           "drop_standby", "mark_dead"})),
                        secret=WRONG_SECRET), "bad_tag"
        elif category == "parts":
            parts = valid()
            shape = rng.randrange(4)
            if shape == 0:
                yield [b""], "parts"
            elif shape == 1:
                yield [b"", *parts], "parts"  # what a REQ socket would send
            elif shape == 2:
                yield [*parts, parts[1]], "parts"
            else:
                yield [b"p"] * rng.randrange(4, 2000), "parts"
        elif category == "huge":
            packed = rng.choice(huge)
            yield [packed, sign(SECRET, packed)], "garbage"
        elif category == "types":
            over, reason = rng.choice(type_mutations)
            yield signed_env(envelope(**over)), reason
        else:  # authentic frames of kinds a server must not take
            if rng.random() < 0.5:
                yield valid("heartbeat", {"src": "pub", "seq": rng.randrange(1000)}), "unexpected_kind"
            else:
                yield valid("reply", {"ok": True}, re=rng.randbytes(16)), "unexpected_kind"


@pytest.mark.timeout(60)  # ~3 s on an idle 2-core box; a wall-clock assert would flake under load
def test_fuzz_nothing_accepted_server_survives(served, ctx):
    endpoint = served.server.endpoint
    start = time.monotonic()
    # Genuine requests first, so that their exact copies can be replayed.
    setup = raw_dealer(ctx, endpoint)
    bulk = raw_dealer(ctx, endpoint)            # every part <= 64 KiB: each must reach the server
    doomed = raw_dealer(ctx, endpoint)          # a part > 64 KiB: libzmq drops it and disconnects us
    try:
        captured = []
        for i in range(20):
            parts = seal(SECRET, SID, "follow", {"head_job": str(i)}, to=endpoint)
            setup.send_multipart(parts)
            assert setup.poll(2000)
            setup.recv_multipart()
            captured.append(parts)
        assert len(served.calls) == 20
        served.calls.clear()

        expected: collections.Counter[str] = collections.Counter()
        dropped_by_libzmq = 0
        for parts, reason in fuzz_cases(random.Random(20240601), endpoint, captured):
            if reason is None:
                try:
                    doomed.send_multipart(parts, zmq.NOBLOCK)
                except zmq.Again:  # reconnecting after the previous one; never mind
                    pass
                dropped_by_libzmq += 1
            else:
                bulk.send_multipart(parts)
                expected[reason] += 1
        sent = time.monotonic()
        wait_until(lambda: sum(served.server.rejected.values()) >= sum(expected.values()), 15, 0.01,
                   "every bad frame to be rejected")
        assert dict(served.server.rejected) == dict(expected)
        assert served.calls == [] and served.server.accepted == 20
        assert bulk.poll(200) == 0, "a rejected frame was answered"
        assert served.alive and served.errors == []

        with client_for(served, ctx) as client:
            assert client.request("status", {}, timeout=2)["ok"] is True
        total = time.monotonic() - start
        print(f"\nfuzz: {FUZZ_FRAMES} frames, {sum(expected.values())} delivered, "
              f"{dropped_by_libzmq} dropped by libzmq (part > 64 KiB); "
              f"send {sent - start:.2f} s, total {total:.2f} s; {dict(expected)}")
    finally:
        for sock in (setup, bulk, doomed):
            sock.close()


# ---------------------------------------------------------------- heartbeats

def receive_first(sub: HeartbeatSubscriber, send, timeout: float = 3.0):
    """PUB/SUB joins late: keep sending until the subscriber hears one."""
    def sent_and_heard():
        send()
        return sub.poll(0.05)   # listening is the pause between sends
    return wait_until(sent_and_heard, timeout, 0.001, "a heartbeat to be received")


def test_heartbeat_round_trip(ctx):
    with HeartbeatPublisher(SECRET, SID, HOST, context=ctx) as pub, \
            HeartbeatSubscriber(pub.endpoint, SECRET, SID, context=ctx) as sub:
        first = receive_first(sub, lambda: pub.publish({"head_job": "42"}))
        assert first.kind == "heartbeat" and first.body["head_job"] == "42"
        assert first.body["src"] == pub.source and 1 <= first.body["seq"] <= pub.seq
        assert sub.last is first and sub.last_seen is not None
        for _ in range(3):
            pub.publish({"head_job": "42"})
        wait_until(lambda: (sub.poll(0.05) or sub.last).body["seq"] == pub.seq, 2, 0.01, "the last heartbeat")
        assert not sub.rejected
        with pytest.raises(ValueError, match="set by the publisher"):
            pub.publish({"seq": 1})
        # The head goes away: polls come back empty, and the age of the last one grows.
        pub.close()
        assert sub.poll(0.2) is None
        assert time.monotonic() - sub.last_seen >= 0.2


class RawPublisher:
    def __init__(self, ctx):
        self.sock = ctx.socket(zmq.PUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        curve.make_server(self.sock, SECRET)
        self.sock.bind(f"tcp://{HOST}:*")
        self.endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.seq = 0

    def beat(self, secret=SECRET, sid=SID, seq=None, src="raw"):
        if seq is None:
            self.seq += 1
            seq = self.seq
        return seal(secret, sid, "heartbeat", {"src": src, "seq": seq})

    def send(self, parts):
        self.sock.send_multipart(parts)

    def close(self):
        self.sock.close()


@pytest.fixture
def raw_pub(ctx):
    pub = RawPublisher(ctx)
    yield pub
    pub.close()


def sync_then(sub, raw_pub, frames):
    """Join, send ``frames``, then one valid sentinel. Return the heartbeats
    that poll yielded up to the sentinel, and the sentinel's parts. PUB/SUB
    keeps order on one connection, so by then every frame was judged."""
    receive_first(sub, lambda: raw_pub.send(raw_pub.beat()))
    for parts in frames:
        raw_pub.send(parts)
    sentinel = raw_pub.beat()
    raw_pub.send(sentinel)
    seen = []
    deadline = time.monotonic() + 5
    while not seen or seen[-1].body["seq"] != raw_pub.seq:
        assert time.monotonic() < deadline, "sentinel heartbeat not received"
        beat = sub.poll(0.05)
        if beat is not None:
            seen.append(beat)
    return seen, sentinel


def test_forged_heartbeats_ignored(ctx, raw_pub):
    with HeartbeatSubscriber(raw_pub.endpoint, SECRET, SID, context=ctx) as sub:
        forged = [
            raw_pub.beat(secret=WRONG_SECRET, seq=10**6),
            raw_pub.beat(sid="other", seq=10**6),
            seal(SECRET, SID, "status", {}, to="tcp://x:1"),
            [b"garbage"],
            [b"x" * 50, b"y" * 32],
        ]
        seen, _ = sync_then(sub, raw_pub, forged)
        assert [b.body["seq"] for b in seen] == [raw_pub.seq]
        assert sub.rejected == {"bad_tag": 2, "session": 1, "unexpected_kind": 1, "parts": 1}


def test_replayed_heartbeats_ignored(ctx, raw_pub):
    with HeartbeatSubscriber(raw_pub.endpoint, SECRET, SID, context=ctx) as sub:
        _, accepted = sync_then(sub, raw_pub, [])
        assert sub.received >= 1 and not sub.rejected
        # Exact copies of an accepted heartbeat, and a freshly sealed one that reuses an old seq.
        seen, _ = sync_then(sub, raw_pub, [accepted, accepted, raw_pub.beat(seq=1)])
        assert [b.body["seq"] for b in seen] == [raw_pub.seq]
        assert sub.rejected == {"replay": 2, "stale_seq": 1}


def test_new_publisher_instance_starts_again(ctx, raw_pub):
    with HeartbeatSubscriber(raw_pub.endpoint, SECRET, SID, context=ctx) as sub:
        sync_then(sub, raw_pub, [])
        assert raw_pub.seq > 1
        raw_pub.send(raw_pub.beat(seq=1, src="restarted"))  # an agent restarted: new src, seq 1
        beat = sub.poll(2)
        assert beat is not None and (beat.body["src"], beat.body["seq"]) == ("restarted", 1)
        assert not sub.rejected
