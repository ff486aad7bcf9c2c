"""When a hosted head counts as ready for workers (agent.join.wait_gcs_open).

A joining `ray start` reads the session name the head's `ray start` writes
into the GCS right after the GCS opens, and sleeps 2 s before each retry when
it is missing; the head's raylet starts only after that write. So ready means
the GCS port accepts AND the head's raylet runs.
"""

from __future__ import annotations

import socket
import time

from elastic_ray.agent import join


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
