"""The head-moved nudges: in the background, several at once, bounded (coordinator.head.nudges)."""

from __future__ import annotations

import contextlib
import threading
import time

from elastic_ray.coordinator.head import nudges
from elastic_ray.protocol.wire.channel import ControlError


class _Agents:
    """Control clients that take ``delay`` per request; ``refuse`` endpoints raise ControlError."""

    def __init__(self, delay: float = 0.0, refuse: frozenset[str] = frozenset()):
        self.delay = delay
        self.refuse = refuse
        self.got: list[tuple[str, str, dict]] = []
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0

    @contextlib.contextmanager
    def control(self, endpoint: str):
        agents = self

        class Client:
            def request(self, kind, body, timeout):
                with agents.lock:
                    agents.in_flight += 1
                    agents.most_in_flight = max(agents.most_in_flight, agents.in_flight)
                try:
                    time.sleep(agents.delay)
                    if endpoint in agents.refuse:
                        raise ControlError(f"{endpoint} does not answer")
                    with agents.lock:
                        agents.got.append((endpoint, kind, body))
                    return {"ok": True}
                finally:
                    with agents.lock:
                        agents.in_flight -= 1

        yield Client()


def test_every_agent_gets_one_follow_for_the_new_head_and_the_caller_does_not_wait():
    agents = _Agents(delay=0.1)
    endpoints = [f"tcp://10.0.0.{i}:4000" for i in range(48)] + ["tcp://10.0.0.1:4000"]   # one twice
    t0 = time.monotonic()
    thread = nudges.nudge(endpoints, "42", agents.control)
    assert time.monotonic() - t0 < 0.05          # returned before any request finished
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert sorted(e for e, _, _ in agents.got) == sorted(set(endpoints))
    assert {(k, b["head_job"]) for _, k, b in agents.got} == {("follow", "42")}
    assert 1 < agents.most_in_flight <= nudges.PARALLEL


def test_an_agent_that_does_not_answer_costs_the_others_nothing():
    agents = _Agents(refuse=frozenset({"tcp://a:1"}))
    thread = nudges.nudge(["tcp://a:1", "tcp://b:1", "tcp://c:1"], "7", agents.control)
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert sorted(e for e, _, _ in agents.got) == ["tcp://b:1", "tcp://c:1"]


def test_nudges_not_sent_by_the_deadline_are_dropped():
    agents = _Agents(delay=0.3)
    t0 = time.monotonic()
    thread = nudges.nudge([f"tcp://x:{i}" for i in range(20)], "7", agents.control, parallel=2, deadline=0.5)
    thread.join(timeout=5)
    took = time.monotonic() - t0
    assert not thread.is_alive()
    assert took < 2.0
    assert 0 < len(agents.got) < 20


def test_no_agents_no_work():
    agents = _Agents()
    thread = nudges.nudge([], "7", agents.control)
    thread.join(timeout=1)
    assert not thread.is_alive()
    assert agents.got == [] and agents.most_in_flight == 0
