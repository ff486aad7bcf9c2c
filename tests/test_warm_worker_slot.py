"""``LocalRay``'s warm-worker slot (``agent.head.standby_worker``): who may take it,
when a take-over is refused, and what its `ray start` is given. No Ray here:
the node is a stand-in that records the command (unit tests of the slot's rules)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from elastic_ray import SlurmWorkerAllocationConfig
from elastic_ray.agent.node import local_ray
from elastic_ray.config.launcher import RayLauncher


def make(tmp_path, monkeypatch, cpus: str = "2"):
    started = []

    class Node:
        pid = 4242

        @staticmethod
        def start(cmd, log_path):
            started.append((cmd, str(log_path)))
            return SimpleNamespace(pid=4242, cmd=cmd)

    monkeypatch.setattr(local_ray, "RayNode", Node)
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", cpus)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    lr = local_ray.LocalRay(local_ray.NodePlace("7", "gpua-1", "127.0.0.2", 0, "s-1", tmp_path), RayLauncher(),
                            SlurmWorkerAllocationConfig(), lambda *a, **k: None, token_path=str(tmp_path / "token"))
    monkeypatch.setattr(lr, "_make_temp_dir", lambda d: None)
    return lr, started


def test_a_warm_launch_fills_its_own_slot_and_log_and_prestarts(tmp_path, monkeypatch):
    lr, started = make(tmp_path, monkeypatch)
    handle = lr.launch("127.0.0.2:7000", None, "worker", warm=True)
    assert lr.warm is handle and lr.ray is None and lr.hosted is None
    cmd, log = started[0]
    assert log.endswith("ray-7-gpua-1-worker-hosted.log")
    assert "--address=127.0.0.2:7000" in cmd.argv
    assert cmd.env["RAY_enable_worker_prestart"] == "1"
    # The node's own worker gets no prestart.
    lr.launch("127.0.0.2:6379", lr.generation, "worker")
    assert "RAY_enable_worker_prestart" not in started[1][0].env


def test_no_prestart_on_a_node_with_many_cpus(tmp_path, monkeypatch):
    lr, started = make(tmp_path, monkeypatch, cpus=str(local_ray.WARM_PRESTART_MAX_CPUS + 1))
    lr.launch("127.0.0.2:7000", None, "worker", warm=True)
    assert "RAY_enable_worker_prestart" not in started[0][0].env


def test_a_take_over_needs_the_current_generation_and_the_same_handle(tmp_path, monkeypatch):
    lr, _ = make(tmp_path, monkeypatch)
    handle = lr.launch("127.0.0.2:7000", None, "worker", warm=True)
    gen, _ = lr.supersede()
    assert not lr.adopt_warm(handle, gen - 1)            # a start superseded meanwhile
    other = lr.launch("127.0.0.2:7000", None, "worker", warm=True)
    assert lr.warm is other
    assert not lr.adopt_warm(handle, gen)                # not the warm worker any more
    assert lr.adopt_warm(other, gen)
    assert lr.ray is other and lr.warm is None and other.generation == gen


def test_nothing_is_taken_over_once_the_agent_stops(tmp_path, monkeypatch):
    lr, _ = make(tmp_path, monkeypatch)
    handle = lr.launch("127.0.0.2:7000", None, "worker", warm=True)
    lr.stop_launching()
    assert not lr.adopt_warm(handle, lr.generation)
    assert handle in lr.take_all() and lr.warm is None


@pytest.mark.parametrize("given", [None, "same", "other"])
def test_take_warm_takes_only_the_named_handle(tmp_path, monkeypatch, given):
    lr, _ = make(tmp_path, monkeypatch)
    handle = lr.launch("127.0.0.2:7000", None, "worker", warm=True)
    named = {None: None, "same": handle, "other": object()}[given]
    taken = lr.take_warm(named)
    assert (taken is handle) == (given != "other")
    assert (lr.warm is None) == (given != "other")
