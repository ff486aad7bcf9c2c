"""When a hosted head counts as ready for workers (agent.node.join.wait_gcs_open).

A joining `ray start` reads the session name the head's `ray start` writes
into the GCS right after the GCS opens, and sleeps 2 s before each retry when
it is missing; the head's raylet starts only after that write. So ready means
the GCS port accepts AND the head's raylet runs.
"""

from __future__ import annotations

import socket
import time

from elastic_ray.agent.node import join


class _Node:
    def __init__(self, raylet: int | None = None, exited: int | None = None):
        self.raylet = raylet
        self.exited = exited

    def poll_exit(self):
        return self.exited

    def raylet_pid(self):
        return self.raylet


def _listening():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    return srv, f"127.0.0.1:{srv.getsockname()[1]}"


def test_an_open_gcs_without_the_heads_raylet_is_not_ready_yet():
    srv, address = _listening()
    try:
        assert join.wait_gcs_open(_Node(raylet=None), address, time.time() + 0.5, lambda: False) is False
    finally:
        srv.close()


def test_an_open_gcs_with_the_heads_raylet_running_is_ready():
    srv, address = _listening()
    try:
        assert join.wait_gcs_open(_Node(raylet=4242), address, time.time() + 5, lambda: False) is True
    finally:
        srv.close()


def test_a_raylet_without_an_open_gcs_is_not_ready():
    srv, address = _listening()
    srv.close()   # nothing listens there any more
    assert join.wait_gcs_open(_Node(raylet=4242), address, time.time() + 0.5, lambda: False) is False


def test_a_head_whose_ray_start_ended_is_not_ready_and_a_cancelled_wait_says_none():
    srv, address = _listening()
    try:
        assert join.wait_gcs_open(_Node(raylet=None, exited=1), address, time.time() + 5, lambda: False) is False
        assert join.wait_gcs_open(_Node(raylet=None), address, time.time() + 5, lambda: True) is None
    finally:
        srv.close()


# ------------------------------------------------------------- the head's raylet registered (issue 26)
#
# A joining `ray start` asks the GCS for the head node and sleeps 2 s when it
# is not listed yet: a standby counts as ready, and the hosting node's worker
# starts, only once the head's raylet registered (join.wait_head_registered).

class _Registering(_Node):
    def __init__(self, after_looks: int | None, exited: int | None = None):
        super().__init__(raylet=4242, exited=exited)
        self.after_looks = after_looks
        self.looks = 0

    def registered_node_id(self):
        self.looks += 1
        if self.after_looks is not None and self.looks > self.after_looks:
            return "ab" * 28
        return None


def test_the_wait_ends_once_the_heads_raylet_registered():
    node = _Registering(after_looks=3)
    assert join.wait_head_registered(node, 5.0, cancelled=lambda: False) is True
    assert node.looks == 4


def test_a_head_that_never_registers_is_waited_for_only_up_to_the_timeout():
    t0 = time.monotonic()
    assert join.wait_head_registered(_Registering(after_looks=None), 0.3, cancelled=lambda: False) is False
    assert time.monotonic() - t0 < 2.0   # not Ray's own pause, and no hang


def test_an_ended_head_a_cancelled_wait_and_a_wait_no_longer_needed():
    assert join.wait_head_registered(_Registering(after_looks=None, exited=1), 5.0, cancelled=lambda: False) is False
    assert join.wait_head_registered(_Registering(after_looks=None), 5.0, cancelled=lambda: True) is None
    assert join.wait_head_registered(_Registering(after_looks=None), 5.0, cancelled=lambda: False,
                                     still_needed=lambda: False) is False


class _Local:
    def __init__(self, hosted, current: bool = True):
        self.hosted = hosted
        self._current = current

    def current(self, generation):
        return self._current


class _Handle:
    def __init__(self, node):
        self.node = node


def test_the_hosting_nodes_worker_waits_for_its_heads_registration_and_says_so():
    logged = []
    node = _Registering(after_looks=2)
    assert join.hosted_head_registered(_Local(_Handle(node)), 1, lambda event, **f: logged.append(event)) is True
    assert node.looks == 3 and logged == ["hosted_head_registered"]


def test_a_node_hosting_no_head_starts_at_once_and_a_superseded_start_stops():
    assert join.hosted_head_registered(_Local(None), 1, lambda *a, **k: None) is True
    assert join.hosted_head_registered(_Local(_Handle(_Registering(None)), current=False), 1,
                                       lambda *a, **k: None) is False
