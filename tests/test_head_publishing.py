"""The head's heartbeat says a change at once (``agent.head.publishing``):
the event loop beats at its interval, and also as soon as what a beat says
(Ray serves, the head drains) differs from the last beat sent, so a
cancelled head's drain reaches drivers and the supervisor without waiting
up to a beat interval. Real ZeroMQ sockets on loopback."""

from __future__ import annotations

import zmq

from elastic_ray.agent.head.publishing import HeadPublishing
from elastic_ray.agent.node.local_ray import NodePlace
from elastic_ray.protocol.wire.channel import HeartbeatSubscriber
from tests.helpers import wait_until

SECRET = bytes(range(32))
SID = "sess-pub"


def _publishing(tmp_path, heartbeat: bool) -> HeadPublishing:
    place = NodePlace("7", "cpu-1", "127.0.0.1", 0, SID, tmp_path)
    return HeadPublishing(None, SECRET, place, zmq.Context.instance(), "tcp://127.0.0.1:1",  # type: ignore[arg-type]
                          lambda *a, **k: None, heartbeat=heartbeat)


def test_a_beat_is_due_at_once_when_what_it_says_changed(tmp_path):
    pub = _publishing(tmp_path, heartbeat=True)
    assert pub.publisher is not None
    try:
        assert pub.changed(True, False), "nothing said yet"
        with HeartbeatSubscriber(pub.publisher.endpoint, SECRET, SID, context=zmq.Context.instance()) as sub:
            heard = wait_until(lambda: (pub.beat(True, False), sub.poll(0.05))[1], 5, 0.001, "a first beat")
            assert heard.body["ray_ok"] is True and heard.body["draining"] is False
            assert not pub.changed(True, False), "the same news again is not a change"
            assert pub.changed(True, True) and pub.changed(False, True) and pub.changed(False, False)
            pub.beat(True, True)
            drained = wait_until(lambda: (b := sub.poll(0.05)) is not None and b.body["draining"] and b, 5, 0.001,
                                 "the draining beat")
            assert drained.body["head_job"] == "7"
            assert not pub.changed(True, True)
    finally:
        pub.publisher.close()


def test_an_agent_that_publishes_no_head_never_has_a_beat_due(tmp_path):
    pub = _publishing(tmp_path, heartbeat=False)
    assert pub.publisher is None
    assert not pub.changed(True, True) and not pub.changed(False, False)
