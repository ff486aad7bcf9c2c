"""Sealed frames: every rejection reason, acceptance, and the replay guard.

Pure tests: no sockets, a fixed clock. Bad frames that a key holder could
send (garbage, wrong types) are built by signing arbitrary bytes with the
right secret, so the checks behind the tag are reached.
"""

from __future__ import annotations

import math

import msgpack
import pytest

from elastic_ray.protocol.wire.frames import (
    MAX_FRAME_BYTES,
    REQUEST_KINDS,
    SKEW_WINDOW,
    Envelope,
    FrameRejected,
    ReplayGuard,
    open_frame,
    seal,
    sign,
)

SECRET = bytes(range(32))
OTHER_SECRET = bytes(range(1, 33))
SID = "sess-1"
NOW = 1_700_000_000.0
TO = "tcp://10.0.0.5:41234"
NONCE = b"n" * 16


def envelope(kind: str = "status", body: dict | None = None, **fields) -> dict:
    """A valid envelope as a plain dict; ``fields`` override or (value None) remove keys."""
    env = {"v": 1, "kind": kind, "ts": NOW, "nonce": NONCE, "sid": SID, "body": {} if body is None else body}
    if kind in REQUEST_KINDS or kind is _DROP:
        env["to"] = TO
    if kind == "reply":
        env["re"] = b"r" * 16
    env.update(fields)
    return {key: value for key, value in env.items() if value is not _DROP}


_DROP = object()


def signed(data: bytes | dict, secret: bytes = SECRET) -> list[bytes]:
    packed = data if isinstance(data, bytes) else msgpack.packb(data, use_bin_type=True)
    return [packed, sign(secret, packed)]


def open_(parts, *, guard: ReplayGuard | None = None, now: float = NOW, expect=None, to: str | None = TO):
    guard = guard if guard is not None else ReplayGuard()
    return open_frame(SECRET, SID, parts, guard, now, expect=expect, to=to)


VALID = signed(envelope())


# ---------------------------------------------------------------- rejections

REJECTIONS = [
    # (case id, parts, reason)
    ("no parts", [], "parts"),
    ("one part", [VALID[0]], "parts"),
    ("three parts", [b"", *VALID], "parts"),
    ("tag first", [VALID[1], VALID[0]], "bad_tag"),
    ("part not bytes", [VALID[0].decode("latin-1"), VALID[1]], "parts"),
    ("oversized envelope", [b"\x00" * MAX_FRAME_BYTES, VALID[1]], "oversized"),
    ("oversized although signed", signed(envelope(body={"x": "y" * MAX_FRAME_BYTES})), "oversized"),
    ("oversized tag", [VALID[0], b"t" * MAX_FRAME_BYTES], "oversized"),
    ("wrong secret", signed(envelope(), OTHER_SECRET), "bad_tag"),
    ("tag truncated", [VALID[0], VALID[1][:-1]], "bad_tag"),
    ("tag empty", [VALID[0], b""], "bad_tag"),
    ("tag of another envelope", [VALID[0], signed(envelope(ts=NOW + 1))[1]], "bad_tag"),
    ("envelope flipped", [bytes([VALID[0][0] ^ 1]) + VALID[0][1:], VALID[1]], "bad_tag"),
    # Signed with the right key, but not a valid envelope.
    ("empty envelope", signed(b""), "garbage"),
    ("reserved byte", signed(b"\xc1"), "garbage"),
    ("trailing data", signed(msgpack.packb(envelope()) + b"\x00"), "garbage"),
    ("truncated", signed(msgpack.packb(envelope(), use_bin_type=True)[:-3]), "garbage"),
    ("array of 4 billion", signed(b"\xdd\xff\xff\xff\xff"), "garbage"),
    ("map of 4 billion", signed(b"\xdf\xff\xff\xff\xff"), "garbage"),
    ("string of 4 GiB", signed(b"\xdb\xff\xff\xff\xff" + b"x" * 10), "garbage"),
    ("binary of 4 GiB", signed(b"\xc6\xff\xff\xff\xff"), "garbage"),
    ("2000 nested arrays", signed(b"\x91" * 2000 + b"\xc0"), "garbage"),
    ("ext type", signed(b"\xd6\xff\x00\x00\x00\x01"), "garbage"),
    ("integer map key", signed(b"\x81\x01\x02"), "garbage"),
    ("invalid utf-8", signed(b"\xa3\xff\xfe\xfd"), "garbage"),
    ("not a map", signed([1, 2, 3]), "bad_envelope"),
    ("version missing", signed(envelope(v=_DROP)), "bad_envelope"),
    ("version a string", signed(envelope(v="1")), "bad_envelope"),
    ("version a boolean", signed(envelope(v=True)), "bad_envelope"),
    ("version 2", signed(envelope(v=2)), "version"),
    ("version 2, other layout", signed({"v": 2, "anything": [1]}), "version"),
    ("version 0", signed(envelope(v=0)), "version"),
    ("kind missing", signed(envelope(kind=_DROP)), "bad_envelope"),
    ("kind an integer", signed(envelope(kind=5)), "bad_envelope"),
    ("kind unknown", signed(envelope(kind="reboot")), "unknown_kind"),
    ("extra key", signed(envelope(extra=1)), "bad_envelope"),
    ("ts missing", signed(envelope(ts=_DROP)), "bad_envelope"),
    ("ts a string", signed(envelope(ts="now")), "bad_envelope"),
    ("ts a boolean", signed(envelope(ts=True)), "bad_envelope"),
    ("ts NaN", signed(envelope(ts=math.nan)), "bad_envelope"),
    ("ts infinite", signed(envelope(ts=math.inf)), "bad_envelope"),
    ("nonce a string", signed(envelope(nonce="n" * 16)), "bad_envelope"),
    ("nonce too short", signed(envelope(nonce=b"n" * 15)), "bad_envelope"),
    ("nonce too long", signed(envelope(nonce=b"n" * 17)), "bad_envelope"),
    ("sid not a string", signed(envelope(sid=None)), "bad_envelope"),
    ("sid of another session", signed(envelope(sid="sess-2")), "session"),
    ("request without to", signed(envelope(to=_DROP)), "bad_envelope"),
    ("to not a string", signed(envelope(to=5)), "bad_envelope"),
    ("to another agent", signed(envelope(to="tcp://10.0.0.6:41234")), "destination"),
    ("re on a request", signed(envelope(re=b"r" * 16)), "bad_envelope"),
    ("reply without re", signed(envelope("reply", {"ok": True}, re=_DROP)), "bad_envelope"),
    ("re too short", signed(envelope("reply", {"ok": True}, re=b"r")), "bad_envelope"),
    ("re a string", signed(envelope("reply", {"ok": True}, re="r" * 16)), "bad_envelope"),
    ("to on a heartbeat", signed(envelope("heartbeat", {"src": "a", "seq": 1}, to=TO)), "bad_envelope"),
    # Bodies.
    ("body a list", signed(envelope(body=[1])), "bad_body"),
    ("body missing", signed(envelope(body=_DROP)), "bad_envelope"),
    ("body bytes key", signed(envelope(body={b"deadline": 1.0})), "bad_body"),
    ("status with a field", signed(envelope(body={"verbose": True})), "bad_body"),
    ("drain without deadline", signed(envelope("drain", {"reason": "x"})), "bad_body"),
    ("drain deadline a string", signed(envelope("drain", {"deadline": "soon"})), "bad_body"),
    ("drain deadline a boolean", signed(envelope("drain", {"deadline": True})), "bad_body"),
    ("drain deadline negative", signed(envelope("drain", {"deadline": -1.0})), "bad_body"),
    ("drain deadline infinite", signed(envelope("drain", {"deadline": math.inf})), "bad_body"),
    ("drain reason an integer", signed(envelope("drain", {"deadline": NOW, "reason": 3})), "bad_body"),
    ("drain reason too long", signed(envelope("drain", {"deadline": NOW, "reason": "x" * 1025})), "bad_body"),
    ("drain typo", signed(envelope("drain", {"deadline": NOW, "reasons": "x"})), "bad_body"),
    ("follow without head_job", signed(envelope("follow", {})), "bad_body"),
    ("follow head_job an integer", signed(envelope("follow", {"head_job": 42})), "bad_body"),
    ("follow head_job not digits", signed(envelope("follow", {"head_job": "42;rm"})), "bad_body"),
    ("follow head_job empty", signed(envelope("follow", {"head_job": ""})), "bad_body"),
    ("host_head without head_job", signed(envelope("host_head", {})), "bad_body"),
    ("shutdown reason a list", signed(envelope("shutdown", {"reason": ["x"]})), "bad_body"),
    ("reply without ok", signed(envelope("reply", {"value": 1})), "bad_body"),
    ("reply ok a string", signed(envelope("reply", {"ok": "yes"})), "bad_body"),
    ("heartbeat without seq", signed(envelope("heartbeat", {"src": "a"})), "bad_body"),
    ("heartbeat seq negative", signed(envelope("heartbeat", {"src": "a", "seq": -1})), "bad_body"),
    ("heartbeat seq 2**63", signed(envelope("heartbeat", {"src": "a", "seq": 2**63})), "bad_body"),
    ("heartbeat seq a float", signed(envelope("heartbeat", {"src": "a", "seq": 1.0})), "bad_body"),
    ("heartbeat src empty", signed(envelope("heartbeat", {"src": "", "seq": 1})), "bad_body"),
    ("heartbeat head_job bad", signed(envelope("heartbeat", {"src": "a", "seq": 1, "head_job": "x"})),
     "bad_body"),
    # Clock.
    ("31 s old", signed(envelope(ts=NOW - SKEW_WINDOW - 1)), "skew"),
    ("31 s ahead", signed(envelope(ts=NOW + SKEW_WINDOW + 1)), "skew"),
    ("a day old", signed(envelope(ts=NOW - 86400)), "skew"),
]


@pytest.mark.parametrize("parts, reason", [c[1:] for c in REJECTIONS], ids=[c[0] for c in REJECTIONS])
def test_rejected(parts, reason):
    with pytest.raises(FrameRejected) as info:
        open_(parts)
    assert info.value.reason == reason, str(info.value)


def test_unexpected_kind():
    beat = signed(envelope("heartbeat", {"src": "a", "seq": 1}))
    reply = signed(envelope("reply", {"ok": True}))
    for parts in (beat, reply):
        with pytest.raises(FrameRejected) as info:
            open_(parts, expect=REQUEST_KINDS)
        assert info.value.reason == "unexpected_kind"


def test_every_single_bit_flip_is_rejected():
    parts = seal(SECRET, SID, "drain", {"deadline": NOW + 60, "reason": "walltime"}, NOW, to=TO)
    for index in (0, 1):
        original = parts[index]
        for bit in range(len(original) * 8):
            flipped = bytearray(original)
            flipped[bit // 8] ^= 1 << (bit % 8)
            mutated = list(parts)
            mutated[index] = bytes(flipped)
            with pytest.raises(FrameRejected) as info:
                open_(mutated)
            assert info.value.reason == "bad_tag"


def test_rejection_message_names_the_field():
    with pytest.raises(FrameRejected, match=r"drain\.deadline must be a number"):
        open_(signed(envelope("drain", {"deadline": "soon"})))
    with pytest.raises(FrameRejected, match="unknown kind 'reboot'"):
        open_(signed(envelope(kind="reboot")))


# ---------------------------------------------------------------- acceptance

ACCEPTED = [
    ("status", {}, {}),
    ("drain", {"deadline": NOW + 60}, {}),
    ("drain integer deadline", {"deadline": int(NOW) + 60, "reason": "removed"}, {}),
    ("follow", {"head_job": "123456"}, {}),
    ("host_head", {"head_job": "77"}, {}),
    ("shutdown", {}, {}),
    ("shutdown with reason", {"reason": "teardown"}, {}),
    ("reply", {"ok": True, "state": "JOINED", "nodes": [1, 2], "nested": {"a": None}}, {"re": b"r" * 16}),
    ("reply error", {"ok": False, "error": "RuntimeError: x"}, {"re": b"r" * 16}),
    ("heartbeat", {"src": "abc", "seq": 1, "head_job": "12", "ray": "10.0.0.5:6379"}, {}),
]


@pytest.mark.parametrize("kind, body, extra", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_accepted(kind, body, extra):
    kind = kind.split()[0]
    to = TO if kind in REQUEST_KINDS else None
    parts = seal(SECRET, SID, kind, body, NOW, nonce=NONCE, to=to, **extra)
    assert len(parts) == 2 and len(parts[1]) == 32
    env = open_(parts)
    assert env == Envelope(kind=kind, body=body, ts=NOW, nonce=NONCE, session_id=SID, to=to,
                           re=extra.get("re"))
    with pytest.raises(TypeError):
        env.body["x"] = 1  # type: ignore[index]


@pytest.mark.parametrize("offset", [-SKEW_WINDOW, SKEW_WINDOW, -29.9, 0.0])
def test_clock_window_edges_accepted(offset):
    open_(seal(SECRET, SID, "status", {}, NOW + offset, to=TO))


def test_memoryview_parts_accepted():
    parts = seal(SECRET, SID, "status", {}, NOW, to=TO)
    assert open_([memoryview(p) for p in parts]).kind == "status"


def test_destination_not_checked_when_receiver_has_none():
    assert open_(signed(envelope(to="tcp://elsewhere:1")), to=None).to == "tcp://elsewhere:1"


# ---------------------------------------------------------------- seal refuses what open would refuse

@pytest.mark.parametrize("kind, body, kwargs, match", [
    ("drain", {"deadline": "soon"}, {"to": TO}, r"drain\.deadline"),
    ("drain", {}, {"to": TO}, "missing field 'deadline'"),
    ("status", {"x": 1}, {"to": TO}, "unexpected field 'x'"),
    ("reboot", {}, {"to": TO}, "unknown kind"),
    ("status", {}, {}, "needs 'to'"),
    ("reply", {"ok": True}, {}, "needs 're'"),
    ("heartbeat", {"src": "a", "seq": 1}, {"to": TO}, "only for requests"),
    ("status", {}, {"to": TO, "re": NONCE}, "only for replies"),
    ("status", {}, {"to": TO, "nonce": b"short"}, "nonce must be"),
    ("reply", {"ok": True, "blob": "x" * MAX_FRAME_BYTES}, {"re": NONCE}, "exceeds"),
])
def test_seal_refuses(kind, body, kwargs, match):
    with pytest.raises(ValueError, match=match):
        seal(SECRET, SID, kind, body, NOW, **kwargs)


@pytest.mark.parametrize("secret, sid", [(b"short", SID), ("x" * 32, SID), (SECRET, ""), (SECRET, "s" * 129)])
def test_bad_keys_are_programming_errors(secret, sid):
    with pytest.raises(ValueError):
        seal(secret, sid, "status", {}, NOW, to=TO)
    with pytest.raises(ValueError):
        open_frame(secret, sid, VALID, ReplayGuard(), NOW)


def test_fresh_nonce_per_seal():
    a = open_(seal(SECRET, SID, "status", {}, NOW, to=TO))
    b = open_(seal(SECRET, SID, "status", {}, NOW, to=TO))
    assert a.nonce != b.nonce and len(a.nonce) == 16


# ---------------------------------------------------------------- replay guard

def test_replay_within_window_rejected():
    guard = ReplayGuard()
    parts = seal(SECRET, SID, "drain", {"deadline": NOW + 60}, NOW, to=TO)
    open_(parts, guard=guard, now=NOW)
    for later in (NOW, NOW + 1, NOW + SKEW_WINDOW):
        with pytest.raises(FrameRejected) as info:
            open_(parts, guard=guard, now=later)
        assert info.value.reason == "replay"


def test_replay_after_window_refused_by_clock_and_nonce_forgotten():
    guard = ReplayGuard()
    parts = seal(SECRET, SID, "status", {}, NOW, to=TO)
    open_(parts, guard=guard, now=NOW)
    assert len(guard) == 1
    guard.forget_expired(NOW + SKEW_WINDOW)  # still needed at the window's edge
    assert len(guard) == 1
    guard.forget_expired(NOW + SKEW_WINDOW + 0.001)
    assert len(guard) == 0
    with pytest.raises(FrameRejected) as info:
        open_(parts, guard=guard, now=NOW + SKEW_WINDOW + 0.001)
    assert info.value.reason == "skew"


def test_future_dated_nonce_kept_until_its_own_window_ends():
    guard = ReplayGuard()
    parts = seal(SECRET, SID, "status", {}, NOW + 20, to=TO)
    open_(parts, guard=guard, now=NOW)
    with pytest.raises(FrameRejected, match="replay"):
        open_(parts, guard=guard, now=NOW + 45)  # ts + 30 = NOW + 50 not yet passed


def test_guard_refuses_when_full_rather_than_forgetting_early():
    guard = ReplayGuard(capacity=3)
    frames = [seal(SECRET, SID, "status", {}, NOW + i, to=TO) for i in range(4)]
    for parts in frames[:3]:
        open_(parts, guard=guard, now=NOW)
    with pytest.raises(FrameRejected) as info:
        open_(frames[3], guard=guard, now=NOW + 1)
    assert info.value.reason == "guard_full"
    # Nothing was forgotten to make room: the admitted frames are still replays.
    for parts in frames[:3]:
        with pytest.raises(FrameRejected, match="replay"):
            open_(parts, guard=guard, now=NOW + 1)
    # The oldest expires at NOW + 30: then there is room again, and the
    # refused frame (never remembered) goes through.
    open_(frames[3], guard=guard, now=NOW + SKEW_WINDOW + 0.5)
    assert len(guard) == 3


def test_guard_memory_stays_bounded_under_steady_traffic():
    guard = ReplayGuard(capacity=100)
    for i in range(5000):  # 10 frames per second for 500 s: about 300 alive at once...
        now = NOW + i / 10
        try:
            open_(seal(SECRET, SID, "status", {}, now, to=TO), guard=guard, now=now)
        except FrameRejected as exc:
            assert exc.reason == "guard_full"
        assert len(guard) <= 100
        assert len(guard._heap) == len(guard)


def test_rejected_frames_do_not_use_guard_memory():
    guard = ReplayGuard()
    for parts, _ in [c[1:] for c in REJECTIONS]:
        with pytest.raises(FrameRejected):
            open_(parts, guard=guard)
    assert len(guard) == 0


def test_guard_arguments():
    with pytest.raises(ValueError):
        ReplayGuard(window=0)
    with pytest.raises(ValueError):
        ReplayGuard(capacity=0)
