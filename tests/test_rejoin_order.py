"""Who restarts Ray first after the head moved (agent.head.rejoin_order).

The decision (:func:`turn`) is pure and tried over every combination of its
inputs; the waiting shell is run with a host that joins late, never, or at
once; the session-directory reader with real files.
"""

from __future__ import annotations

import itertools
import threading
import time
from types import MappingProxyType

import pytest

from elastic_ray.agent.head.rejoin_order import ORDERS, RejoinTurn, host_in, read_boot_id, turn
from elastic_ray.protocol.disk.records import HeadEndpoint
from elastic_ray.protocol.disk.session_dir import SessionDir

from tests.helpers import node_state
from tests.test_session_dir import make_info

BOOT = "11111111-2222-3333-4444-555555555555"
OTHER = "99999999-2222-3333-4444-555555555555"


def _turn(**kw):
    args = dict(order="host-first", own_node="w-2", own_boot_id=BOOT, head_job="7", host_node="w-1",
                host_boot_id=BOOT, host_joined=False, waited=0.0, host_has_worker=True, max_wait=4.0)
    args.update(kw)
    return turn(**args)


def test_a_worker_on_the_hosting_nodes_machine_waits_for_its_worker():
    t = _turn()
    assert not t.go and "w-1" in t.why and "same machine" in t.why


@pytest.mark.parametrize("order,own_node,own_boot,host_node,host_boot,joined,waited,has_worker", list(itertools.product(
    ORDERS, ["w-1", "w-2"], [BOOT, ""], ["w-1", None], [BOOT, OTHER, ""], [False, True], [0.0, 3.99, 4.0],
    [True, False])))
def test_every_combination(order, own_node, own_boot, host_node, host_boot, joined, waited, has_worker):
    t = _turn(order=order, own_node=own_node, own_boot_id=own_boot, host_node=host_node, host_boot_id=host_boot,
              host_joined=joined, waited=waited, host_has_worker=has_worker)
    waits = (order == "host-first" and host_node is not None and own_node != host_node and own_boot != ""
             and host_boot == own_boot and has_worker and not joined and waited < 4.0)
    assert t.go is (not waits)
    assert t.why


def test_an_unknown_order_is_refused_naming_it():
    with pytest.raises(ValueError, match="'first-come'"):
        _turn(order="first-come")
    with pytest.raises(ValueError, match="'first-come'"):
        RejoinTurn("first-come", "w-2", lambda j: (None, "", True, False), lambda *a, **k: None)


def test_the_boot_id_of_this_kernel_is_read_and_a_missing_one_is_empty(tmp_path):
    assert len(read_boot_id()) >= 32
    assert read_boot_id(tmp_path / "none") == ""


class _Host:
    """A host node whose worker joins after ``joins_after`` seconds (None: never)."""

    def __init__(self, joins_after, boot=BOOT):
        self.t0 = time.monotonic()
        self.joins_after = joins_after
        self.boot = boot
        self.looks = 0

    def __call__(self, job):
        self.looks += 1
        joined = self.joins_after is not None and time.monotonic() - self.t0 >= self.joins_after
        return "w-1", self.boot, True, joined


def _logs():
    out = []
    return out, lambda event, **fields: out.append((event, fields))


def test_the_wait_ends_when_the_hosts_worker_joins():
    logs, log = _logs()
    host = _Host(0.3)
    t0 = time.monotonic()
    assert RejoinTurn("host-first", "w-2", host, log, boot_id=BOOT).wait("7", lambda: True)
    took = time.monotonic() - t0
    assert 0.3 <= took < 3.0
    assert [e for e, _ in logs] == ["rejoin_waits", "rejoin_turn"]
    assert "joined head 7" in logs[-1][1]["why"]


def test_the_wait_never_outlasts_max_wait():
    logs, log = _logs()
    t0 = time.monotonic()
    assert RejoinTurn("host-first", "w-2", _Host(None), log, max_wait=0.4, boot_id=BOOT).wait("7", lambda: True)
    assert 0.4 <= time.monotonic() - t0 < 3.0
    assert "waited" in logs[-1][1]["why"]


def test_a_superseded_start_stops_waiting_and_is_not_started():
    logs, log = _logs()
    wanted = threading.Event()
    wanted.set()
    threading.Timer(0.2, wanted.clear).start()
    t0 = time.monotonic()
    assert not RejoinTurn("host-first", "w-2", _Host(None), log, boot_id=BOOT).wait("7", wanted.is_set)
    assert time.monotonic() - t0 < 2.0


@pytest.mark.parametrize("order,node,boot", [("all", "w-2", BOOT), ("host-first", "w-1", BOOT),
                                             ("host-first", "w-2", OTHER), ("host-first", "w-2", "")])
def test_who_starts_at_once_does_not_wait_or_log(order, node, boot):
    logs, log = _logs()
    t0 = time.monotonic()
    assert RejoinTurn(order, node, _Host(None), log, boot_id=boot).wait("7", lambda: True)
    assert time.monotonic() - t0 < 0.5 and logs == []


def test_no_head_job_means_no_wait():
    assert RejoinTurn("host-first", "w-2", _Host(None), lambda *a, **k: None, boot_id=BOOT).wait(None, lambda: True)


@pytest.fixture
def session_dir(tmp_path) -> SessionDir:
    return SessionDir.create(tmp_path / "sess", make_info())


def _endpoint(job="7", host="w-1", boot=BOOT):
    return HeadEndpoint(job_id=job, host=host, address="10.0.0.9:6379", ray_version="2.60.0", started_at=1.0,
                        ports=MappingProxyType({"gcs_port": 6379}), boot_id=boot)


def test_host_in_reads_the_endpoint_and_the_hosts_published_state(session_dir):
    host_of = host_in(session_dir)
    assert host_of("7") == (None, "", True, False)            # no endpoint yet: unknown host
    session_dir.write_head_endpoint(_endpoint())
    assert host_of("7") == ("w-1", BOOT, True, False)          # its state not published yet
    session_dir.write_node_state(node_state("7", "w-1", state="STARTING", head_job="7"))
    assert host_of("7") == ("w-1", BOOT, True, False)
    session_dir.write_node_state(node_state("7", "w-1", state="JOINED", head_job="3"))
    assert host_of("7") == ("w-1", BOOT, True, False)          # joined, but the old head
    session_dir.write_node_state(node_state("7", "w-1", state="JOINED", head_job="7"))
    assert host_of("7") == ("w-1", BOOT, True, True)


def test_host_in_a_head_allocation_has_no_worker_to_wait_for(session_dir):
    session_dir.write_head_endpoint(_endpoint("1", "cpu-1"))
    session_dir.write_node_state(node_state("1", "cpu-1", role="head", state="JOINED"))
    assert host_in(session_dir)("1") == ("cpu-1", BOOT, False, False)


def test_the_endpoint_carries_the_boot_id_and_reads_without_one():
    ep = _endpoint()
    assert HeadEndpoint.from_dict(ep.to_dict()) == ep
    old = _endpoint(boot="").to_dict()
    assert "boot_id" not in old and HeadEndpoint.from_dict(old).boot_id == ""
    with pytest.raises((ValueError, TypeError), match="boot_id"):
        HeadEndpoint.from_dict({**ep.to_dict(), "boot_id": 5})
