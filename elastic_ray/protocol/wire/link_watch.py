"""Whether a heartbeat subscriber's connection to its publisher still stands.

A head agent that dies, SIGKILL included, has its TCP connections closed
by the kernel: the FIN (or RST) reaches every subscriber at once, long
before a silence of ``lost_after`` would. A ZeroMQ socket monitor reports
that as ``EVENT_DISCONNECTED``; the monitor's socket is readable only when
such an event comes, so watching it costs an idle process no wakeup.

A node that vanishes sends no FIN: its loss is still seen by the silence
of its heartbeat, which this does not replace. And a dropped connection
alone is not read as a lost head for longer than it takes the next beat to
come (``link_dropped``): ZeroMQ reconnects by itself, and a beat heard
after the drop says the head is there.
"""

from __future__ import annotations

import struct

import zmq

EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED


def link_dropped(dropped_at: float | None, last_beat: float | None) -> bool:
    """Is the publisher's connection down since the last beat heard? (pure)

    Beats queued before the drop must be read *before* the drop is taken
    (see ``LinkWatch.read``), or a dead head's last beats would seem newer
    than its death."""
    return dropped_at is not None and (last_beat is None or dropped_at >= last_beat)


class LinkWatch:
    """The monitor of one subscriber socket. Owned by whoever owns that socket."""

    def __init__(self, sock: zmq.Socket):
        self._owner = sock
        self.socket: zmq.Socket | None = sock.get_monitor_socket(EVENTS)
        self.dropped_at: float | None = None

    def read(self, now: float) -> bool:
        """Take the events that came (never blocks); True when one did. A
        drop is dated ``now``: call this after reading the queued beats."""
        came = False
        while self.socket is not None:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            came = True
            if event_of(frames) == zmq.EVENT_DISCONNECTED:
                self.dropped_at = now
        return came

    def close(self) -> None:
        if self.socket is None:
            return
        try:
            self._owner.disable_monitor()
        except zmq.ZMQError:
            pass
        self.socket.close(linger=0)
        self.socket = None


def event_of(frames: list[bytes]) -> int | None:
    """The event number of one monitor message (its first frame starts with it,
    a native-endian uint16). Parsed here rather than with
    ``zmq.utils.monitor``, whose import pulls in asyncio: 13 ms of every
    agent's start-up, on its path to ``ray start``."""
    if not frames or len(frames[0]) < 2:
        return None
    return struct.unpack("=H", frames[0][:2])[0]
