"""The control channel's sockets: thin shells around ``frames``.

Four pieces, one job each:

- ``ControlServer``: the agent's ROUTER. It never blocks and owns no loop or
  thread; the agent puts ``server.socket`` in its own ``zmq.Poller`` and calls
  ``handle_ready`` when it is readable.
- ``ControlClient``: the coordinator's side. One short-lived DEALER socket per
  request, so a timed-out request leaves nothing behind (no queued message
  that a restarted agent would receive late, no stuck REQ state machine) and
  one client may be used from several threads.
- ``HeartbeatPublisher`` / ``HeartbeatSubscriber``: the head agent's PUB
  socket and its listeners.

Every frame in either direction is sealed (see ``frames``). Invalid frames are
dropped without an answer, so a prober learns nothing, and are counted by
reason.

Connections are authenticated before any message flows: every server socket
(the agent's ROUTER, the head's PUB) is a CURVE server and every client (the
coordinator's DEALER, every SUB) a CURVE client, with keys derived from the
session secret (see ``curve``). A peer without the secret fails the
handshake, so libzmq never buffers a message part from it, and one that
stalls in the handshake is dropped after ``curve.HANDSHAKE_IVL_MS``. This
matters because libzmq receives a whole multipart message before
authentication by HMAC could look at it, and nothing in libzmq caps the
number of parts: without CURVE a stranger could make an agent hold 115 MB
(2000 parts of 60 kB) for as long as it kept the message open.

Caps on what a key holder can send, applied before anything is parsed:
MAXMSGSIZE per part (``WIRE_PART_LIMIT``: the largest envelope plus the
CURVE framing, which libzmq counts), whole messages per peer (high-water
marks), and the number of parts: a message with more parts than a frame has
is read part by part and dropped without keeping them. CURVE also encrypts
the traffic; nothing secret is put in a body all the same.
"""

from __future__ import annotations

import collections
import logging
import math
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import zmq

# Defined in errors (its docstring says why); ``X as X`` keeps it importable from here, for type checkers too.
from ...errors import ControlError as ControlError
from ...errors import ControlTimeout as ControlTimeout
from . import curve
from .link_watch import LinkWatch
from .frames import (
    HEARTBEAT_KIND,
    NONCE_BYTES,
    REPLY_KIND,
    REQUEST_KINDS,
    Envelope,
    FrameRejected,
    ReplayGuard,
    open_frame,
    seal,
)
from .sockets import (
    FRAME_PARTS,
    WIRE_PART_LIMIT,
    RejectionLog,
    TooManyParts,
    bound_socket,
    endpoint_is_ipv6,
    parts_of,
    peer_address,
    recv_capped,
)

log = logging.getLogger(__name__)



class Deferred:
    """What a handler returns to answer later: for a request whose work takes
    seconds (a GCS probe), so the agent's loop is not held up meanwhile. The
    server notes where the reply goes; the owner of the socket later calls
    ``ControlServer.answer(deferred, body)`` from its own thread (ZeroMQ
    sockets are not thread-safe). The caller's timeout still bounds its wait."""

    def __init__(self) -> None:
        self.route: tuple[bytes, bytes, str] | None = None


Handler = Callable[[Envelope], "Mapping[str, Any] | Deferred"]

_HWM = 100            # messages queued per peer; with 64 KiB parts at most ~13 MB per peer
_DRAIN_BATCH = 1000   # messages handled per handle_ready call, so a flood cannot starve the agent
_ERROR_TEXT = 500     # characters of an exception kept in an error reply


# ---------------------------------------------------------------- server

class ControlServer:
    """The agent's request socket: a ROUTER bound on the node.

    ``host`` must be the node's concrete address (not ``0.0.0.0``): the bound
    endpoint is what gets published and what requests are addressed to.

    Options and why:
    - CURVE server (see ``curve``): a peer without the session secret
      never gets past the handshake, so nothing it sends is buffered.
    - MAXMSGSIZE ``WIRE_PART_LIMIT``: libzmq drops an oversized part and
      disconnects that peer before we allocate it (it applies per part;
      ``open_frame`` checks the total).
    - LINGER 0: closing never waits for replies to vanished clients.
    - RCVHWM/SNDHWM 100: bounds what one peer can queue.
    - ROUTER_HANDOVER stays off: peers never choose routing ids here (libzmq
      assigns them), and with handover off a peer announcing an id already in
      use is refused instead of taking over another caller's replies.
    - ROUTER_MANDATORY stays off: a reply to a caller that already gave up
      is dropped silently instead of raising in the agent's loop.
    """

    def __init__(self, secret: bytes, session_id: str, host: str, port: int = 0, *,
                 context: zmq.Context | None = None, log: logging.Logger = log,
                 guard: ReplayGuard | None = None, clock: Callable[[], float] = time.time):
        seal(secret, session_id, "reply", {"ok": True}, re=bytes(NONCE_BYTES))  # validates the key now
        self._secret = secret
        self._session_id = session_id
        self._log = log
        self._guard = guard if guard is not None else ReplayGuard()
        self._clock = clock
        self._reject_log = RejectionLog(log)
        self._socket: zmq.Socket | None = bound_socket(
            context or zmq.Context.instance(), zmq.ROUTER, host, port,
            {zmq.LINGER: 0, zmq.MAXMSGSIZE: WIRE_PART_LIMIT, zmq.RCVHWM: _HWM, zmq.SNDHWM: _HWM}, secret)
        self._endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.accepted = 0
        self.rejected: collections.Counter[str] = collections.Counter()
        self.handler_errors = 0
        self.replies_dropped = 0

    @property
    def endpoint(self) -> str:
        """The bound endpoint, e.g. ``tcp://10.0.0.5:41234``: publish exactly this
        string; clients address their requests to it and the server checks that."""
        return self._endpoint

    @property
    def socket(self) -> zmq.Socket:
        """For the owner's poller (POLLIN). Do not read from it directly."""
        if self._socket is None:
            raise ValueError("ControlServer is closed")
        return self._socket

    def handle_ready(self, handler: Handler, max_messages: int = _DRAIN_BATCH) -> int:
        """Serve the messages already waiting, without blocking; return how many.

        Stops after ``max_messages`` so that other event sources of the
        agent's loop get their turn; the poller reports the socket again.
        The reply body is the handler's dict, with ``ok: True`` added unless
        the handler set ``ok`` itself.
        """
        sock = self.socket
        handled = 0
        while handled < max_messages:
            try:
                frames = recv_capped(sock, 1 + FRAME_PARTS)
            except zmq.Again:
                break
            handled += 1
            self._serve_one(frames, handler)
        return handled

    def _serve_one(self, frames: list[zmq.Frame], handler: Handler) -> None:
        identity = frames[0].bytes
        try:
            if isinstance(frames[-1], TooManyParts):
                raise FrameRejected("parts", f"expected 2 parts, got {frames[-1].count - 1}")
            parts = [f.buffer for f in frames[1:]]
            request = open_frame(self._secret, self._session_id, parts, self._guard, self._clock(),
                                 expect=REQUEST_KINDS, to=self._endpoint)
        except FrameRejected as exc:
            self.rejected[exc.reason] += 1
            self._reject_log("frame_rejected", exc, peer_address(frames))
            return
        self.accepted += 1
        try:
            result = handler(request)
            if isinstance(result, Deferred):
                result.route = (identity, request.nonce, request.kind)
                return
            if not isinstance(result, Mapping):
                raise TypeError(f"handler returned {type(result).__name__}, not a dict")
            body = {"ok": True, **result}
        except Exception as exc:
            self.handler_errors += 1
            self._log.error("event=handler_failed kind=%s error=%r", request.kind, exc)
            self._log.debug("handler traceback", exc_info=True)
            body = {"ok": False, "error": _error_text(exc)}
        self._send_reply(identity, request.nonce, request.kind, body)

    def answer(self, deferred: "Deferred", result: Mapping[str, Any]) -> None:
        """Send the reply a handler deferred (on the thread that owns the socket)."""
        if deferred.route is None:
            raise ValueError("this Deferred was never returned by a handler")
        identity, nonce, kind = deferred.route
        deferred.route = None  # one reply per request
        self._send_reply(identity, nonce, kind, {"ok": True, **result})

    def _send_reply(self, identity: bytes, nonce: bytes, kind: str, body: Mapping[str, Any]) -> None:
        try:
            reply = seal(self._secret, self._session_id, REPLY_KIND, body, re=nonce)
        except (ValueError, TypeError) as exc:
            self.handler_errors += 1
            self._log.error("event=reply_unsealable kind=%s error=%r", kind, exc)
            reply = seal(self._secret, self._session_id, REPLY_KIND,
                         {"ok": False, "error": "reply could not be sealed: " + _error_text(exc)}, re=nonce)
        try:
            self.socket.send_multipart([identity, *reply], zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # Again (peer's queue full); the peer may also be gone
            self.replies_dropped += 1
            self._log.warning("event=reply_dropped kind=%s error=%s", kind, exc)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def __enter__(self) -> "ControlServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= _ERROR_TEXT else text[:_ERROR_TEXT] + "..."


# ---------------------------------------------------------------- client

class ControlClient:
    """Sends requests to one agent and authenticates its replies.

    ``endpoint`` must be the string the agent published (its
    ``ControlServer.endpoint``): it is sealed into each request as the
    destination, and the agent refuses requests addressed elsewhere.

    Each request uses its own DEALER socket, closed with LINGER 0 when the
    call returns. A request that timed out was perhaps delivered and run
    anyway; requests are designed to be safe to repeat (drain, follow,
    shutdown are idempotent on the agent's side).
    """

    def __init__(self, endpoint: str, secret: bytes, session_id: str, *, context: zmq.Context | None = None,
                 clock: Callable[[], float] = time.time):
        if not endpoint.startswith("tcp://"):
            raise ValueError(f"endpoint {endpoint!r} is not a tcp:// endpoint")
        seal(secret, session_id, "status", {}, to=endpoint)  # validates the key now
        self.endpoint = endpoint
        self._secret = secret
        self._session_id = session_id
        self._ctx = context or zmq.Context.instance()
        self._clock = clock
        self._guard = ReplayGuard()
        self._lock = threading.Lock()
        self._closed = False

    def request(self, kind: str, body: Mapping[str, Any] | None = None, timeout: float = 5.0) -> dict[str, Any]:
        """Send one request and return the reply's body (``ok`` tells success).

        Raises ValueError for a request that does not fit its schema,
        ControlTimeout when no authentic reply came within ``timeout``
        seconds, ControlError when the reply was forged or answers something
        else.
        """
        if self._closed:
            raise ValueError("ControlClient is closed")
        if kind not in REQUEST_KINDS:
            raise ValueError(f"{kind!r} is not a request kind ({sorted(REQUEST_KINDS)})")
        nonce = secrets.token_bytes(NONCE_BYTES)
        parts = seal(self._secret, self._session_id, kind, body or {}, self._clock(), nonce=nonce,
                     to=self.endpoint)
        deadline = time.monotonic() + timeout
        sock = self._ctx.socket(zmq.DEALER)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, WIRE_PART_LIMIT)
            curve.make_client(sock, self._secret)
            if endpoint_is_ipv6(self.endpoint):
                sock.setsockopt(zmq.IPV6, 1)
            sock.connect(self.endpoint)
            # The pipe exists as soon as connect() returns, so this queues
            # even before the TCP connection is up; it never blocks.
            sock.send_multipart(parts, zmq.NOBLOCK)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ControlTimeout(f"{kind} to {self.endpoint}: no reply within {timeout:g} s")
                if sock.poll(math.ceil(remaining * 1000), zmq.POLLIN):
                    return self._check_reply(kind, parts_of(recv_capped(sock, FRAME_PARTS)), nonce)
        finally:
            sock.close(linger=0)

    def _check_reply(self, kind: str, frames: list[bytes], nonce: bytes) -> dict[str, Any]:
        try:
            with self._lock:
                reply = open_frame(self._secret, self._session_id, frames, self._guard, self._clock(),
                                   expect=(REPLY_KIND,))
        except FrameRejected as exc:
            log.warning("event=reply_rejected endpoint=%s kind=%s reason=%s detail=%r",
                        self.endpoint, kind, exc.reason, exc.detail)
            raise ControlError(f"{kind} to {self.endpoint}: reply refused ({exc})") from None
        if reply.re != nonce:
            raise ControlError(f"{kind} to {self.endpoint}: reply answers another request")
        return dict(reply.body)

    def close(self) -> None:
        """Nothing stays open between requests; this only marks the client unusable."""
        self._closed = True

    def __enter__(self) -> "ControlClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- heartbeat

class HeartbeatPublisher:
    """The head agent's heartbeat: a PUB socket; the agent calls ``publish``
    from its timer (every ``heartbeat_interval``, 1 s).

    Each heartbeat carries ``src`` (random, one per publisher instance) and
    ``seq`` (1, 2, 3... per instance). Subscribers refuse a seq that is not
    larger than the last one seen from that src, which stops replays and
    reordering even beyond what a replay guard remembers; a restarted agent
    is a new src and starts again at 1.
    """

    def __init__(self, secret: bytes, session_id: str, host: str, port: int = 0, *,
                 context: zmq.Context | None = None, clock: Callable[[], float] = time.time):
        seal(secret, session_id, HEARTBEAT_KIND, {"src": "x", "seq": 0})  # validates the key now
        self._secret = secret
        self._session_id = session_id
        self._clock = clock
        self.source = uuid.uuid4().hex[:16]
        self.seq = 0
        # SNDHWM small: a slow subscriber loses old heartbeats, which are worthless anyway.
        self._socket: zmq.Socket | None = bound_socket(
            context or zmq.Context.instance(), zmq.PUB, host, port,
            {zmq.LINGER: 0, zmq.SNDHWM: 16, zmq.MAXMSGSIZE: WIRE_PART_LIMIT}, secret)
        self._endpoint = self._socket.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def endpoint(self) -> str:
        return self._endpoint

    def publish(self, body: Mapping[str, Any] | None = None) -> int:
        """Seal and send one heartbeat; return its seq. Never blocks."""
        if self._socket is None:
            raise ValueError("HeartbeatPublisher is closed")
        body = dict(body or {})
        if "src" in body or "seq" in body:
            raise ValueError("'src' and 'seq' are set by the publisher")
        self.seq += 1
        parts = seal(self._secret, self._session_id, HEARTBEAT_KIND,
                     {**body, "src": self.source, "seq": self.seq}, self._clock())
        try:
            self._socket.send_multipart(parts, zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # PUB drops rather than blocks; a lost beat is replaced by the next
            log.debug("event=heartbeat_not_sent seq=%d error=%s", self.seq, exc)
        return self.seq

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def __enter__(self) -> "HeartbeatPublisher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HeartbeatSubscriber:
    """Listens to one head's heartbeats.

    ``poll`` returns the newest valid heartbeat that arrived, or None.
    ``last`` and ``last_seen`` (time.monotonic of its arrival) keep the newest
    one, so that a caller can decide "head lost" as ``monotonic() -
    last_seen > 2``. ``socket`` may go in the caller's poller instead of
    calling ``poll`` with a timeout.
    """

    _MAX_SOURCES = 16

    def __init__(self, endpoint: str, secret: bytes, session_id: str, *, context: zmq.Context | None = None,
                 clock: Callable[[], float] = time.time, watch_link: bool = False):
        seal(secret, session_id, HEARTBEAT_KIND, {"src": "x", "seq": 0})  # validates the key now
        self.endpoint = endpoint
        self.link: LinkWatch | None = None   # with watch_link: a dead publisher's FIN is seen at once
        self._secret = secret
        self._session_id = session_id
        self._clock = clock
        self._guard = ReplayGuard(capacity=1024)
        self._last_seq: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.rejected: collections.Counter[str] = collections.Counter()
        self.received = 0
        self.last: Envelope | None = None
        self.last_seen: float | None = None
        self._reject_log = RejectionLog(log)
        sock = (context or zmq.Context.instance()).socket(zmq.SUB)
        try:
            curve.make_client(sock, secret)
            for opt, value in {zmq.LINGER: 0, zmq.MAXMSGSIZE: WIRE_PART_LIMIT, zmq.RCVHWM: 64,
                               zmq.RECONNECT_IVL: 100, zmq.RECONNECT_IVL_MAX: 1000}.items():
                sock.setsockopt(opt, value)
            if endpoint_is_ipv6(endpoint):
                sock.setsockopt(zmq.IPV6, 1)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            if watch_link:
                self.link = LinkWatch(sock)
            sock.connect(endpoint)
        except BaseException:
            if self.link is not None:
                self.link.close()
            sock.close(linger=0)
            raise
        self._socket: zmq.Socket | None = sock

    @property
    def socket(self) -> zmq.Socket:
        if self._socket is None:
            raise ValueError("HeartbeatSubscriber is closed")
        return self._socket

    def poll(self, timeout: float = 0.0, max_messages: int = _DRAIN_BATCH) -> Envelope | None:
        """Wait up to ``timeout`` seconds for a valid heartbeat; then take
        what is already queued (at most ``max_messages``, so a flood cannot
        hold the caller: it may then return before ``timeout``) and return
        the newest valid one, or None. Invalid ones are dropped and counted in
        ``rejected``."""
        sock = self.socket
        deadline = time.monotonic() + timeout
        newest: Envelope | None = None
        for _ in range(max_messages):
            try:
                parts = parts_of(recv_capped(sock, FRAME_PARTS))
            except zmq.Again:
                if newest is not None:
                    return newest
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                sock.poll(math.ceil(remaining * 1000), zmq.POLLIN)
                continue
            beat = self._accept(parts)
            if beat is not None:
                newest = beat
        return newest

    def _accept(self, parts: list[bytes]) -> Envelope | None:
        try:
            beat = open_frame(self._secret, self._session_id, parts, self._guard, self._clock(),
                              expect=(HEARTBEAT_KIND,))
            src, seq = beat.body["src"], beat.body["seq"]
            last = self._last_seq.get(src)
            if last is not None and seq <= last:
                raise FrameRejected("stale_seq", f"seq {seq} after {last} from {src}")
        except FrameRejected as exc:
            self.rejected[exc.reason] += 1
            self._reject_log("heartbeat_rejected", exc, self.endpoint)
            return None
        self._last_seq[src] = seq
        self._last_seq.move_to_end(src)
        while len(self._last_seq) > self._MAX_SOURCES:
            self._last_seq.popitem(last=False)
        self.received += 1
        self.last, self.last_seen = beat, time.monotonic()
        return beat

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        if self._socket is not None:
            self._socket.close(linger=0)
            self._socket = None

    def __enter__(self) -> "HeartbeatSubscriber":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
