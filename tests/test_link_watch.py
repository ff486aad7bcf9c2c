"""A head whose agent dies is seen at once, with no heartbeat to wait for, and
an idle worker takes the head's beats without waking per beat (issue 11).

The dating of a beat taken late (``beat_time``) and the judgement of a
dropped link (``link_dropped``) are pure; the socket monitor is tried on a
real publisher and subscriber over TCP on the loopback."""

from __future__ import annotations

import types

import pytest
import zmq

from elastic_ray.agent.head.following import HeadFollower
from elastic_ray.agent.head.head_watch import HeadWatch, beat_time
from elastic_ray.protocol.wire.channel import HeartbeatPublisher, HeartbeatSubscriber
from elastic_ray.protocol.wire.link_watch import link_dropped
from elastic_ray.protocol.disk.records import HeadEndpoint
from tests.helpers import wait_until

SECRET = bytes(range(32))
SID = "sess-link"
ENDPOINT = HeadEndpoint(job_id="10", host="n1", address="10.0.0.1:6379", ray_version="x", started_at=0.0,
                        ports={"heartbeat": 1, "control": 2})


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.term()  # hangs if a socket was left open


def test_a_beat_taken_late_is_dated_by_its_send_time_within_the_window_it_came_in():
    # Sent at 10.2, taken at 10.9 after a take at 10.0: it came at 10.2, not 10.9.
    assert beat_time(10.2, 10.0, 10.9) == 10.2
    # A head clock that runs ahead or behind moves it no further than the window.
    assert beat_time(50.0, 10.0, 10.9) == 10.9
    assert beat_time(3.0, 10.0, 10.9) == 10.0
    # The first take after subscribing has no lower bound but ``now``.
    assert beat_time(9.0, None, 10.9) == 9.0 and beat_time(12.0, None, 10.9) == 10.9
    # After an answer of the head's agent counted as a beat at 10.5, a beat sent before it is not older.
    assert beat_time(10.2, 10.0, 10.9, heard_before=10.5) == 10.5
    assert beat_time(10.7, 10.0, 10.9, heard_before=10.5) == 10.7


def test_a_dropped_link_counts_until_a_beat_is_heard_after_it():
    assert not link_dropped(None, 5.0)
    assert link_dropped(6.0, 5.0)          # dropped after the last beat: the head agent is gone
    assert link_dropped(6.0, None)
    assert link_dropped(6.0, 6.0)          # the dead head's last beat, read in the same take as its drop
    assert not link_dropped(6.0, 6.5)      # ZeroMQ reconnected and the head beats again


class FakeSubscriber:
    """Beats queued for a worker that did not wake for them."""

    link = None

    def __init__(self, beats):
        self.beats = list(beats)

    def poll(self, timeout=0.0):
        return self.beats.pop(0) if self.beats else None

    def close(self):
        pass


def beat(ts: float, job: str = "10", ok: bool = True):
    return types.SimpleNamespace(ts=ts, body={"head_job": job, "ray_ok": ok, "draining": False})


def test_a_worker_dates_the_beats_it_takes_at_a_later_wakeup_by_when_they_came():
    f = HeadFollower(None, SECRET, SID, None, role="worker", lost_after=2.0,  # type: ignore[arg-type]
                     log=lambda *a, **k: None, on_loop=lambda call: None)
    f.watch = HeadWatch(job="10", endpoint=ENDPOINT)
    f.subscribe(FakeSubscriber([beat(100.0)]))        # type: ignore[arg-type]
    f.read_heartbeats(100.3)
    assert f.watch.last_beat == 100.0
    f.subscriber.beats = [beat(100.5), beat(101.0, job="other"), beat(101.02)]  # type: ignore[union-attr]
    f.read_heartbeats(101.9)                           # the pointer read's wakeup, 0.9 s after the beat came
    assert f.watch.last_beat == 101.02 and f.watch.beat_ok
    # Taken at the silence deadline with nothing queued: the head is silent then.
    f.read_heartbeats(103.03)
    assert f.watch.last_beat == 101.02
    assert f.watch.silent(103.03, 2.0)


def test_the_link_watch_sees_a_publisher_that_goes_away_at_once(ctx):
    pub = HeartbeatPublisher(SECRET, SID, "127.0.0.1", context=ctx)
    sub = HeartbeatSubscriber(pub.endpoint, SECRET, SID, context=ctx, watch_link=True)
    try:
        assert sub.link is not None and sub.link.socket is not None
        wait_until(lambda: (pub.publish({"head_job": "1"}), sub.poll(0.05))[1], 5, 0.01, "a first beat")
        sub.link.read(1.0)
        assert sub.link.dropped_at is None      # connected and beating: nothing dropped
        pub.close()                             # what the kernel does for a SIGKILLed agent: close its sockets
        assert sub.link.socket.poll(5000, zmq.POLLIN)   # the drop wakes a waiter, no beat needed
        assert sub.link.read(2.0) and sub.link.dropped_at == 2.0
        assert link_dropped(sub.link.dropped_at, 1.5)
    finally:
        sub.close()
        pub.close()
    assert sub.link.socket is None


def test_a_subscriber_without_a_link_watch_has_none(ctx):
    pub = HeartbeatPublisher(SECRET, SID, "127.0.0.1", context=ctx)
    with pub, HeartbeatSubscriber(pub.endpoint, SECRET, SID, context=ctx) as sub:
        assert sub.link is None


def test_event_of_reads_the_event_number_of_a_monitor_message():
    import struct

    import zmq

    from elastic_ray.protocol.wire.link_watch import event_of

    frame = struct.pack("=HI", zmq.EVENT_DISCONNECTED, 7)
    assert event_of([frame, b"tcp://10.0.0.1:4000"]) == zmq.EVENT_DISCONNECTED
    assert event_of([struct.pack("=HI", zmq.EVENT_CONNECTED, 9)]) == zmq.EVENT_CONNECTED
    assert event_of([]) is None and event_of([b"\x01"]) is None
