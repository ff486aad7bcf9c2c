"""Sealed control-channel frames: what goes on the wire, and what we accept.

Pure: no sockets, no clocks of its own (the caller passes ``now``), so every
rejection rule is tested exhaustively without a network.

Wire layout
-----------
A frame is exactly two ZeroMQ message parts::

    part 0   envelope   msgpack map (see below), at most 64 KiB with the tag
    part 1   tag        32 bytes: HMAC-SHA256(session secret, part 0)

The tag covers the exact envelope bytes as sent, so nothing is ever
re-encoded before it is checked. Keeping the tag in its own part means the
receiver never has to parse anything to find it, and the envelope is never
given to msgpack before the tag has matched: bytes from someone without the
secret only ever reach a length check and a constant-time compare.

The envelope is a map with exactly these keys::

    v      int    protocol version, 1
    kind   str    request ("status", "drain", "follow", "host_head",
                  "standby_head", "drop_standby", "shutdown", "mark_dead"),
                  "reply" or "heartbeat"
    ts     float  the sender's unix time when sealing
    nonce  bytes  16 random bytes, never reused
    sid    str    session id (a key shared by two sessions by mistake
                  still cannot cross them)
    body   map    per kind, checked against ``BODY_SCHEMAS``
    to     str    requests only: the endpoint the request is meant for
    re     bytes  replies only: the nonce of the request being answered

``to`` exists because every agent of a session holds the same secret: a
request overheard on its way to one agent could otherwise be replayed to
another agent within the clock window (each agent's replay guard only knows
its own nonces). An agent accepts only requests addressed to its own
published endpoint. ``re`` ties a reply to one request, so a reply cannot be
replayed to another caller or another call.

The sockets (``channel``) add ZeroMQ CURVE: connections are authenticated
and encrypted with keys derived from the same secret (``curve``). This tag
stays as a second, independent check, and is what binds a frame to its
session, destination and nonce. Nothing secret is ever put in a body.

Replay and clocks
-----------------
A frame is accepted only if ``|ts - now| <= 30 s`` (the receiver's clock)
and its nonce has not been seen. ``ReplayGuard`` remembers each accepted
nonce until ``ts + 30 s``; after that the timestamp check alone refuses the
frame, so the guard can forget it. Its memory is capped: when it is full of
unexpired nonces it *refuses* new frames (reason ``guard_full``) rather than
forgetting a nonce early, which would reopen a replay. Only frames that
passed the tag check reach the guard, so only holders of the secret can fill
it. The guard assumes the receiver's clock does not step back by more than
the window; a large backward step could let a frame captured before the step
through once more.
"""

from __future__ import annotations

import heapq
import hmac
import math
import secrets
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import msgpack

from ...config.slurm_values import is_job_id
# Defined in errors (its docstring says why); ``X as X`` keeps it importable from here, for type checkers too.
from ...errors import FrameRejected as FrameRejected

VERSION = 1
MAX_FRAME_BYTES = 64 * 1024
"""Upper bound on the sum of both parts. The sockets' ZMQ_MAXMSGSIZE is this plus
the CURVE framing (``channel.WIRE_PART_LIMIT``)."""
TAG_BYTES = 32
NONCE_BYTES = 16
SKEW_WINDOW = 30.0
"""Seconds a frame's timestamp may differ from the receiver's clock, either way."""
DEFAULT_GUARD_CAPACITY = 8192
"""About 2 MB when full; allows ~270 accepted frames per second sustained."""

REQUEST_KINDS = frozenset({"status", "drain", "follow", "host_head", "standby_head", "drop_standby", "shutdown",
                           "mark_dead"})
REPLY_KIND = "reply"
HEARTBEAT_KIND = "heartbeat"
ALL_KINDS = REQUEST_KINDS | {REPLY_KIND, HEARTBEAT_KIND}

# Limits handed to msgpack. A declared length is checked against these before
# msgpack allocates anything, so a 6-byte "array of 4 billion items" costs
# nothing. Strings and binaries cannot be longer than the frame anyway.
_UNPACK_LIMITS = dict(
    raw=False,
    strict_map_key=True,
    use_list=True,
    max_str_len=MAX_FRAME_BYTES,
    max_bin_len=MAX_FRAME_BYTES,
    max_array_len=1024,
    max_map_len=256,
    max_ext_len=0,
)

_MAX_SESSION_ID = 128
_MAX_TEXT = 1024
RAY_NODE_ID_HEX = 56
"""A Ray node id is 28 bytes, written as 56 lowercase hex digits."""
MAX_MARK_DEAD_IDS = 128
"""Node ids per ``mark_dead`` request (about 7 KiB); a caller with more sends several."""


@dataclass(frozen=True)
class Envelope:
    """An authenticated, validated frame. ``body`` is read-only."""

    kind: str
    body: Mapping[str, Any]
    ts: float
    nonce: bytes
    session_id: str
    version: int = VERSION
    to: str | None = None
    re: bytes | None = None


# ---------------------------------------------------------------- body schemas
#
# A field checker returns None when the value is fine, else a short description
# of what is wrong. Each kind lists its fields as name -> (checker, required);
# ``open`` kinds accept further keys (replies carry whatever the handler
# returned; heartbeats whatever the head publishes), closed kinds do not.

def _number(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be a number, got {type(value).__name__}"
    if not math.isfinite(value):
        return "must be finite"
    return None


def _positive_number(value: Any) -> str | None:
    return _number(value) or (None if value > 0 else "must be > 0")


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, got {type(value).__name__}"
    return None if len(value) <= _MAX_TEXT else f"longer than {_MAX_TEXT} characters"


def _short_id(value: Any) -> str | None:
    if not isinstance(value, str) or not 1 <= len(value) <= 64:
        return "must be a string of 1 to 64 characters"
    return None


def _job_id(value: Any) -> str | None:
    if not is_job_id(value):
        return "must be a Slurm job id (a string of digits)"
    return None


def is_ray_node_id(value: Any) -> bool:
    """A Ray node id as the GCS and our node files write it (56 lowercase hex digits)."""
    return (isinstance(value, str) and len(value) == RAY_NODE_ID_HEX
            and all(c in "0123456789abcdef" for c in value))


def _node_ids(value: Any) -> str | None:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_MARK_DEAD_IDS:
        return f"must be a list of 1 to {MAX_MARK_DEAD_IDS} Ray node ids"
    for item in value:
        if not is_ray_node_id(item):
            return f"must hold Ray node ids ({RAY_NODE_ID_HEX} lowercase hex digits), got {_clip(repr(item), 70)}"
    if len(set(value)) != len(value):
        return "must not repeat a node id"
    return None


def _boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else f"must be a boolean, got {type(value).__name__}"


def _counter(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        return "must be an integer in [0, 2**63)"
    return None


@dataclass(frozen=True)
class BodySchema:
    fields: Mapping[str, tuple[Callable[[Any], str | None], bool]]
    open: bool = False


BODY_SCHEMAS: Mapping[str, BodySchema] = MappingProxyType({
    # Requests: closed, so a typo in a field name is an error, not a no-op.
    "status": BodySchema({}),
    # deadline: unix time (the coordinator's clock) by which the node must have left.
    "drain": BodySchema({"deadline": (_positive_number, True), "reason": (_text, False)}),
    "follow": BodySchema({"head_job": (_job_id, True)}),
    "host_head": BodySchema({"head_job": (_job_id, True)}),
    # A warm standby head on the allocation ``job`` (the agent's own), or its end.
    "standby_head": BodySchema({"job": (_job_id, True)}),
    "drop_standby": BodySchema({"job": (_job_id, True)}),
    "shutdown": BodySchema({"reason": (_text, False)}),
    # To the agent serving the run's head: mark these Ray nodes DEAD in its GCS now.
    "mark_dead": BodySchema({"node_ids": (_node_ids, True), "reason": (_text, True)}),
    # Replies: whatever the handler returned, plus a mandatory verdict.
    "reply": BodySchema({"ok": (_boolean, True), "error": (_text, False)}, open=True),
    # Heartbeats: src names one publisher instance, seq strictly increases per src.
    "heartbeat": BodySchema({"src": (_short_id, True), "seq": (_counter, True),
                             "head_job": (_job_id, False)}, open=True),
})


def check_body(kind: str, body: Any) -> None:
    """Raise FrameRejected unless ``body`` fits the schema of ``kind``."""
    schema = BODY_SCHEMAS.get(kind)
    if schema is None:
        raise FrameRejected("unknown_kind", f"unknown kind {_clip(kind)!r}")
    if not isinstance(body, dict):
        raise FrameRejected("bad_body", f"{kind}: body must be a map, got {type(body).__name__}")
    for key in body:
        if not isinstance(key, str):
            raise FrameRejected("bad_body", f"{kind}: body keys must be strings, got {type(key).__name__}")
        if not schema.open and key not in schema.fields:
            raise FrameRejected("bad_body", f"{kind}: unexpected field {_clip(key)!r}")
    for name, (checker, required) in schema.fields.items():
        if name not in body:
            if required:
                raise FrameRejected("bad_body", f"{kind}: missing field {name!r}")
            continue
        problem = checker(body[name])
        if problem:
            raise FrameRejected("bad_body", f"{kind}.{name} {problem}")


# ---------------------------------------------------------------- replay guard

class ReplayGuard:
    """Nonces seen within the clock window, with bounded memory.

    Not thread-safe: one guard per receiving socket, or a lock around it.
    """

    def __init__(self, window: float = SKEW_WINDOW, capacity: int = DEFAULT_GUARD_CAPACITY):
        if window <= 0 or capacity < 1:
            raise ValueError("window and capacity must be positive")
        self.window = float(window)
        self.capacity = int(capacity)
        self._expiry: dict[bytes, float] = {}
        self._heap: list[tuple[float, bytes]] = []  # (expiry, nonce), soonest first

    def __len__(self) -> int:
        return len(self._expiry)

    def forget_expired(self, now: float) -> None:
        """Drop nonces whose frames the timestamp check would refuse by now."""
        heap = self._heap
        while heap and heap[0][0] < now:
            _, nonce = heapq.heappop(heap)
            del self._expiry[nonce]

    def admit(self, nonce: bytes, ts: float, now: float) -> None:
        """Remember ``nonce`` or raise FrameRejected (``replay`` or ``guard_full``).

        The caller has already checked that ``ts`` is within the window of ``now``.
        """
        self.forget_expired(now)
        if nonce in self._expiry:
            raise FrameRejected("replay", "nonce already seen")
        if len(self._expiry) >= self.capacity:
            raise FrameRejected("guard_full", f"{self.capacity} unexpired nonces remembered")
        expiry = ts + self.window
        self._expiry[nonce] = expiry
        heapq.heappush(self._heap, (expiry, nonce))


# ---------------------------------------------------------------- seal / open

def sign(secret: bytes, envelope: bytes | memoryview) -> bytes:
    """The tag of an envelope: HMAC-SHA256 keyed by the session secret."""
    return hmac.digest(secret, envelope, "sha256")   # one C call: the same tag as hmac.new(...).digest()


def _check_key(secret: bytes, session_id: str) -> None:
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError("secret must be at least 16 bytes")
    if not isinstance(session_id, str) or not 1 <= len(session_id) <= _MAX_SESSION_ID:
        raise ValueError(f"session_id must be a string of 1 to {_MAX_SESSION_ID} characters")


def seal(secret: bytes, session_id: str, kind: str, body: Mapping[str, Any], now: float | None = None,
         *, nonce: bytes | None = None, to: str | None = None, re: bytes | None = None) -> list[bytes]:
    """Build the two parts of a frame.

    The body is checked against the same schema the receiver applies, so a
    sender's mistake fails here with the field named, not silently over
    there. ``to`` is required for requests, ``re`` for replies. Raises
    ValueError (bad arguments, frame too large) or TypeError (a body value
    msgpack cannot encode).
    """
    _check_key(secret, session_id)
    body = dict(body)
    try:
        check_body(kind, body)
    except FrameRejected as exc:
        raise ValueError(str(exc)) from None
    nonce = secrets.token_bytes(NONCE_BYTES) if nonce is None else nonce
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
    envelope: dict[str, Any] = {
        "v": VERSION,
        "kind": kind,
        "ts": float(time.time() if now is None else now),
        "nonce": nonce,
        "sid": session_id,
        "body": body,
    }
    if kind in REQUEST_KINDS:
        if not isinstance(to, str) or not to:
            raise ValueError(f"a {kind} request needs 'to' (the endpoint it is sent to)")
        envelope["to"] = to
    elif to is not None:
        raise ValueError(f"'to' is only for requests, not {kind}")
    if kind == REPLY_KIND:
        if not isinstance(re, bytes) or len(re) != NONCE_BYTES:
            raise ValueError(f"a reply needs 're' (the request's {NONCE_BYTES}-byte nonce)")
        envelope["re"] = re
    elif re is not None:
        raise ValueError(f"'re' is only for replies, not {kind}")
    packed = msgpack.packb(envelope, use_bin_type=True)
    if len(packed) + TAG_BYTES > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(packed) + TAG_BYTES} bytes exceeds {MAX_FRAME_BYTES}")
    return [packed, sign(secret, packed)]


_Bytes = (bytes, bytearray, memoryview)
_BASE_KEYS = frozenset({"v", "kind", "ts", "nonce", "sid", "body"})


def open_frame(secret: bytes, session_id: str, parts: Sequence[bytes | bytearray | memoryview],
               guard: ReplayGuard, now: float, *, expect: Collection[str] | None = None,
               to: str | None = None) -> Envelope:
    """Authenticate and validate a received frame, or raise FrameRejected.

    ``expect`` limits the kinds this receiver takes (a server takes requests
    only, so an overheard heartbeat or reply sent to it is refused). ``to``
    is this receiver's own endpoint; requests addressed elsewhere are
    refused. The order of checks matters: cheap, key-free checks first;
    nothing is parsed before the tag matches; the replay guard is consulted
    last so that only fully valid frames take up its memory.
    """
    _check_key(secret, session_id)
    if len(parts) != 2:
        raise FrameRejected("parts", f"expected 2 parts, got {len(parts)}")
    packed, tag = parts
    if not isinstance(packed, _Bytes) or not isinstance(tag, _Bytes):
        raise FrameRejected("parts", "parts must be bytes")
    size = memoryview(packed).nbytes + memoryview(tag).nbytes
    if size > MAX_FRAME_BYTES:
        raise FrameRejected("oversized", f"{size} bytes > {MAX_FRAME_BYTES}")
    if memoryview(tag).nbytes != TAG_BYTES:
        raise FrameRejected("bad_tag", f"tag has {memoryview(tag).nbytes} bytes")
    if not hmac.compare_digest(sign(secret, packed), bytes(tag)):
        raise FrameRejected("bad_tag", "tag does not match")

    # Authentic from here on: a holder of the secret sent it. Still validate
    # everything, since that holder may run another version or have a bug.
    try:
        env = msgpack.unpackb(packed, **_UNPACK_LIMITS)
    except Exception as exc:  # msgpack raises several ValueError subclasses, UnicodeDecodeError...
        raise FrameRejected("garbage", f"{type(exc).__name__}: {_clip(str(exc))}") from None
    if not isinstance(env, dict):
        raise FrameRejected("bad_envelope", f"envelope must be a map, got {type(env).__name__}")
    version = env.get("v")
    if isinstance(version, bool) or not isinstance(version, int):
        raise FrameRejected("bad_envelope", "v must be an integer")
    if version != VERSION:
        raise FrameRejected("version", f"unknown version {version}")

    kind = env.get("kind")
    if not isinstance(kind, str):
        raise FrameRejected("bad_envelope", "kind must be a string")
    if kind not in ALL_KINDS:
        raise FrameRejected("unknown_kind", f"unknown kind {_clip(kind)!r}")
    allowed = set(_BASE_KEYS)
    if kind in REQUEST_KINDS:
        allowed.add("to")
    if kind == REPLY_KIND:
        allowed.add("re")
    if set(env) != allowed:
        missing, extra = sorted(allowed - set(env)), sorted(map(str, set(env) - allowed))
        raise FrameRejected("bad_envelope", f"{kind}: missing {missing}, unexpected {_clip(str(extra))}")
    ts, nonce, sid = env["ts"], env["nonce"], env["sid"]
    if _number(ts) is not None:
        raise FrameRejected("bad_envelope", "ts must be a finite number")
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise FrameRejected("bad_envelope", f"nonce must be {NONCE_BYTES} bytes")
    if not isinstance(sid, str):
        raise FrameRejected("bad_envelope", "sid must be a string")
    if sid != session_id:
        raise FrameRejected("session", f"session {_clip(sid)!r} is not {session_id!r}")
    dest = env.get("to")
    if dest is not None and not isinstance(dest, str):
        raise FrameRejected("bad_envelope", "to must be a string")
    reply_to = env.get("re")
    if reply_to is not None and (not isinstance(reply_to, bytes) or len(reply_to) != NONCE_BYTES):
        raise FrameRejected("bad_envelope", f"re must be {NONCE_BYTES} bytes")

    if expect is not None and kind not in expect:
        raise FrameRejected("unexpected_kind", f"{kind} is not accepted here")
    if to is not None and dest is not None and dest != to:
        raise FrameRejected("destination", f"addressed to {_clip(dest)!r}, this is {to!r}")
    check_body(kind, env["body"])
    if abs(ts - now) > guard.window:
        raise FrameRejected("skew", f"timestamp off by {ts - now:+.1f} s")
    guard.admit(nonce, float(ts), now)
    return Envelope(kind=kind, body=MappingProxyType(env["body"]), ts=float(ts), nonce=nonce,
                    session_id=sid, version=version, to=dest, re=reply_to)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
