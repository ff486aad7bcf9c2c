"""Socket plumbing shared by the control channel's pieces (``channel``): a
bound CURVE server socket, a receive that caps the number of parts kept,
and a rejection log that a flood cannot turn into a flood of lines.

Kept apart from ``channel`` so that module holds only the four pieces and
their protocol; nothing here knows about requests, replies or heartbeats.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Mapping
from typing import Any

import zmq

from . import curve
from .frames import MAX_FRAME_BYTES, FrameRejected

WIRE_PART_LIMIT = MAX_FRAME_BYTES + 1024
"""ZMQ_MAXMSGSIZE of every socket: libzmq counts a part with its CURVE framing
(33 bytes), so the largest envelope ``seal`` makes needs this margin."""
FRAME_PARTS = 2
"""Parts of a frame (envelope, tag); a ROUTER adds the peer's identity in front."""


def tcp_endpoint(host: str, port: int | str) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def host_is_ipv6(host: str) -> bool:
    return ":" in host


def endpoint_is_ipv6(endpoint: str) -> bool:
    return "[" in endpoint


def bound_socket(ctx: zmq.Context, kind: int, host: str, port: int, options: Mapping[int, int],
                 secret: bytes) -> zmq.Socket:
    """A CURVE server socket of the session, listening on ``host:port`` (port 0:
    any free port). Raises OSError or zmq.ZMQError (e.g. EMFILE when out of
    descriptors, EADDRINUSE) with nothing left open.

    The listening TCP socket is made here and handed to libzmq (ZMQ_USE_FD)
    instead of letting ``bind`` make it: libzmq 4.3's bind first tries the
    host as an interface name through getifaddrs(), and asserts (aborting
    the whole process) when that fails for lack of a descriptor. Made here,
    running out of descriptors is an ordinary OSError the caller handles.
    """
    sock = ctx.socket(kind)
    try:
        curve.make_server(sock, secret)
        for opt, value in options.items():
            sock.setsockopt(opt, value)
        family = socket.AF_INET6 if host_is_ipv6(host) else socket.AF_INET
        if family == socket.AF_INET6:
            sock.setsockopt(zmq.IPV6, 1)
        with socket.socket(family, socket.SOCK_STREAM) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as libzmq's own listeners
            listener.bind((host, port))
            listener.listen(sock.getsockopt(zmq.BACKLOG))
            listener.setblocking(False)
            sock.setsockopt(zmq.USE_FD, listener.fileno())
            # The address given to bind() is ignored with USE_FD; libzmq reads
            # the bound one from the descriptor (LAST_ENDPOINT).
            sock.bind(tcp_endpoint(host, listener.getsockname()[1]))
            listener.detach()   # libzmq owns and closes the descriptor from here
    except BaseException:
        sock.close(linger=0)
        raise
    return sock


class RejectionLog:
    """Log rejected frames, at most ``burst`` lines per ``period`` seconds.

    A flood of garbage must not become a flood of log lines filling the
    session's disk; the counters stay exact and the next line logged says how
    many were suppressed.
    """

    def __init__(self, logger: logging.Logger, burst: int = 20, period: float = 10.0):
        self._log, self._burst, self._period = logger, burst, period
        self._window_start = -period
        self._logged = 0
        self.suppressed = 0

    def __call__(self, what: str, exc: FrameRejected, peer: str) -> None:
        now = time.monotonic()
        if now - self._window_start >= self._period:
            self._window_start, self._logged = now, 0
        if self._logged >= self._burst:
            self.suppressed += 1
            return
        self._logged += 1
        extra = f" suppressed={self.suppressed}" if self.suppressed else ""
        self.suppressed = 0
        self._log.warning("event=%s reason=%s peer=%s detail=%r%s", what, exc.reason, peer, exc.detail, extra)


class TooManyParts:
    """Stands for the rest of a message that had more parts than expected."""

    def __init__(self, count: int):
        self.count = count


def recv_capped(sock: zmq.Socket, max_parts: int) -> list[Any]:
    """Receive one message, keeping at most ``max_parts`` parts.

    The rest is read and dropped one part at a time: a message with
    thousands of parts (possible only for a key holder) is never held as a
    list, and the last item is then a ``TooManyParts`` with the count.
    Raises zmq.Again when no message is waiting.
    """
    frames: list[Any] = [sock.recv(zmq.NOBLOCK, copy=False)]
    count = 1
    while sock.getsockopt(zmq.RCVMORE):
        part = sock.recv(copy=False)   # the rest of a message already received: never blocks
        count += 1
        if count <= max_parts:
            frames.append(part)
    if count > max_parts:
        frames.append(TooManyParts(count))
    return frames


def parts_of(frames: list[Any]) -> list[bytes]:
    """What ``open_frame`` takes; a message cut by ``recv_capped`` keeps one
    part more than a frame has, so ``open_frame`` refuses it as ``parts``."""
    return [b"" if isinstance(f, TooManyParts) else f.bytes for f in frames]


def peer_address(frames: list[Any]) -> str:
    """The sender's IP from the first part of a message that knows it, or "?".

    Every part carries the connection's metadata, but with pyzmq 25 (libzmq
    4.3.4) the ROUTER's identity part, read on its own by ``recv``, answers
    EINVAL (pyzmq 27 answers); the later parts answer on both.
    """
    for frame in frames:
        try:
            address = frame.get("Peer-Address")
        except (zmq.ZMQError, AttributeError, UnicodeDecodeError):
            continue
        if address:
            return address
    return "?"
