"""The hostile client of tests/test_agent_local.py's fuzz test, as a process of its own.

An attacker is another process: when libzmq itself gives up in this one (pyzmq
25.0's libzmq 4.3.4 once aborted in ``zmq_ctx_term`` after the frames it drops
and disconnects for, in the lowest-versions run of the full tier, 2026-12-02),
the test process and the agent under test go on, and the test still judges the
agent by what it counted and answered.

Protocol (one JSON line each way on stdin/stdout; the secret comes on stdin,
never on a command line): in ``{"endpoint", "secret" (hex), "sid", "head_job",
"seed"}``; out ``{"delivered", "dropped", "sent"}`` once every frame is sent;
in ``"check"`` once the test saw the agent judge them; out ``{"answered"}``
(replies to the bulk socket, which must be 0); then it closes and exits.
"""

from __future__ import annotations

import json
import random
import sys
import time

import msgpack
import zmq

from elastic_ray.protocol.wire import curve
from elastic_ray.protocol.wire.frames import REQUEST_KINDS, seal, sign
from elastic_ray.protocol.wire.sockets import WIRE_PART_LIMIT

FUZZ_FRAMES = 10_000
CURVE_FRAMING = 33   # bytes libzmq adds to a part under CURVE and counts against MAXMSGSIZE


def hostile_frames(rng: random.Random, secret: bytes, sid: str, endpoint: str, captured: list[list[bytes]]):
    """Yield (parts, delivered): 10,000 random or mutated frames; ``delivered``
    is False for those libzmq itself drops (a part above its MAXMSGSIZE).

    They are sent with the session's CURVE key (an insider, or a bug): a
    stranger does not get past the handshake (tests/test_agent_attacks.py).
    Unlike tests/test_channel.py's generator these are sealed with the RUN's
    own secret where they are meant to be authentic-but-wrong, so they reach
    every check behind the MAC: a broken envelope, a wrong version, session or
    destination, a stale timestamp, a replay, a kind an agent does not serve.
    """
    def valid(kind="status", body=None, key=secret, **kw):
        return seal(key, sid, kind, body or {}, to=endpoint if kind in REQUEST_KINDS else None, **kw)

    def body_for(kind, reason="fuzz"):
        return {"drain": {"deadline": time.time() + 60, "reason": reason}, "host_head": {"head_job": "1"},
                "shutdown": {"reason": reason}}.get(kind, {})

    def signed(env):
        packed = msgpack.packb(env, use_bin_type=True)
        return [packed, sign(secret, packed)]

    def envelope(**over):
        env = {"v": 1, "kind": "drain", "ts": time.time(), "nonce": rng.randbytes(16), "sid": sid,
               "body": {"deadline": time.time() + 60}, "to": endpoint}
        env.update(over)
        return env

    mutations = [{"kind": 5}, {"ts": "now"}, {"ts": None}, {"nonce": "n" * 16}, {"nonce": 7}, {"v": "1"},
                 {"v": 1.0}, {"sid": None}, {"to": [endpoint]}, {"body": [1, 2]}, {"body": {"deadline": "soon"}},
                 {"body": {"deadline": True}}, {"body": {"deadline": 1.0, "reason": 5}},
                 {"body": {"deadline": 1.0, "extra": 1}}, {"kind": "follow", "body": {"head_job": 5}},
                 {"v": 2}, {"v": -1}, {"sid": "other-session"}, {"kind": "reboot"}, {"ts": time.time() - 1000},
                 {"ts": time.time() + 1000}, {"to": "tcp://10.9.9.9:1"}, {"kind": "shutdown", "to": None}]
    huge = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff",
            b"\x91" * 5000, b"\x81\xa1k" * 3000, b"\xdc\xff\xff" + b"\xc0" * 100]
    categories = ["random", "random2", "bitflip", "replay", "wrong_secret", "parts", "huge", "types", "kinds"]
    for _ in range(FUZZ_FRAMES):
        category = rng.choice(categories)
        if category == "random":
            size = rng.randrange(0, 100 * 1024)
            yield [rng.randbytes(size)], size + CURVE_FRAMING <= WIRE_PART_LIMIT
        elif category == "random2":
            a, b = rng.randrange(0, 100 * 1024), rng.randrange(0, 64)
            yield [rng.randbytes(a), rng.randbytes(b)], a + CURVE_FRAMING <= WIRE_PART_LIMIT
        elif category == "bitflip":
            kind = rng.choice(["drain", "shutdown", "host_head", "status"])
            parts = valid(kind, body_for(kind, "x" * rng.randrange(0, 200)))
            index = rng.randrange(2)
            flipped = bytearray(parts[index])
            bit = rng.randrange(len(flipped) * 8)
            flipped[bit // 8] ^= 1 << (bit % 8)
            parts[index] = bytes(flipped)
            yield parts, True
        elif category == "replay":
            yield list(rng.choice(captured)), True
        elif category == "wrong_secret":
            kind = rng.choice(["drain", "shutdown", "status", "host_head"])
            yield valid(kind, body_for(kind), key=bytes(range(100, 132))), True
        elif category == "parts":
            parts = valid()
            shape = rng.randrange(4)
            if shape == 0:
                yield [b""], True
            elif shape == 1:
                yield [b"", *parts], True
            elif shape == 2:
                yield [*parts, parts[1]], True
            else:
                yield [b"p"] * rng.randrange(4, 2000), True
        elif category == "huge":
            packed = rng.choice(huge)
            yield [packed, sign(secret, packed)], True
        elif category == "types":
            yield signed(envelope(**rng.choice(mutations))), True
        else:  # authentic frames of kinds an agent must not serve
            if rng.random() < 0.5:
                yield valid("heartbeat", {"src": "pub", "seq": rng.randrange(1000)}), True
            else:
                yield valid("reply", {"ok": True}, re=rng.randbytes(16)), True


def main() -> int:
    job = json.loads(sys.stdin.readline())
    endpoint, secret, sid = job["endpoint"], bytes.fromhex(job["secret"]), job["sid"]
    ctx = zmq.Context()
    socks = []

    def dealer() -> zmq.Socket:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 10_000)
        curve.make_client(sock, secret)   # an insider's key: the frames must reach the checks behind it
        sock.connect(endpoint)
        socks.append(sock)
        return sock

    try:
        setup, bulk, doomed = dealer(), dealer(), dealer()
        captured = []
        for _ in range(20):   # genuine, harmless requests, kept for replaying
            parts = seal(secret, sid, "follow", {"head_job": job["head_job"]}, to=endpoint)
            setup.send_multipart(parts)
            if not setup.poll(5000):
                raise SystemExit("no reply to a genuine request")
            setup.recv_multipart()
            captured.append(parts)
        started = time.monotonic()
        delivered = dropped = 0
        for parts, deliverable in hostile_frames(random.Random(job["seed"]), secret, sid, endpoint, captured):
            if deliverable:
                bulk.send_multipart(parts)
                delivered += 1
            else:
                try:
                    doomed.send_multipart(parts, zmq.NOBLOCK)   # libzmq drops it and disconnects the peer
                except zmq.Again:
                    pass
                dropped += 1
        print(json.dumps({"delivered": delivered, "dropped": dropped, "sent": time.monotonic() - started}),
              flush=True)
        if sys.stdin.readline().strip() == "check":
            print(json.dumps({"answered": bulk.poll(300)}), flush=True)
    finally:
        for sock in socks:
            sock.close()
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
