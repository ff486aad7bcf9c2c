"""The ``random`` strategy's ports: drawn below the kernel's ephemeral range (``port_window.random_port_window``
by table; ``ray_node.free_port`` and ``ephemeral_range`` for real)."""

from __future__ import annotations

import socket

import pytest

from elastic_ray.agent.node import ray_node
from elastic_ray.agent.node.port_window import RANDOM_PORT_LOW, random_port_window


@pytest.mark.parametrize("ephemeral, window", [
    ((32768, 60999), (RANDOM_PORT_LOW, 32767)),      # Linux's default
    ((49152, 65535), (RANDOM_PORT_LOW, 49151)),      # the IANA range some sites set
    ((10900, 60999), None),                           # fewer than 1,000 ports below it
    ((1024, 65535), None),                            # everything ephemeral: ask the kernel
    ((11000, 10000), None),                           # nonsense
    ((0, 60999), None),
])
def test_the_window_lies_below_the_ephemeral_range(ephemeral, window):
    assert random_port_window(ephemeral) == window


def test_the_ephemeral_range_is_read_from_the_file_or_defaults(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ray_node.ephemeral_range(f) == (40000, 50000)
    f.write_text("garbage\n")
    assert ray_node.ephemeral_range(f) == (32768, 60999)
    assert ray_node.ephemeral_range(tmp_path / "missing") == (32768, 60999)


def test_a_free_port_is_outside_the_hosts_ephemeral_range_and_binds():
    low, high = ray_node.ephemeral_range()
    window = random_port_window((low, high))
    for _ in range(20):
        port = ray_node.free_port()
        if window is not None:
            assert window[0] <= port <= window[1] and not low <= port <= high
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("", port))        # still free: nothing kept it


def test_a_taken_port_is_never_returned(monkeypatch):
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("", 0))
    held.listen()
    taken = held.getsockname()[1]
    try:
        monkeypatch.setattr(ray_node, "random_port_window", lambda _e: (taken, taken))
        port = ray_node.free_port(tries=3)     # every draw is the taken one: the kernel's pick instead
        assert port != taken
    finally:
        held.close()


def test_without_a_window_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(ray_node, "ephemeral_range", lambda: (1024, 65535))
    port = ray_node.free_port()
    assert 1024 <= port <= 65535
