"""A garbage ``ray_head`` reads as "unknown" on both sides and is put back
by the coordinator; a persistent error is logged once, not every cycle; an
agent's failed session write is retried, not fatal."""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import replace

import pytest
import zmq

from elastic_ray.agent.head.following import HeadFollower
from elastic_ray.agent.head.hosted import HostSettings, Hosting
from elastic_ray.agent.head.publishing import RetriedWrite
from elastic_ray.coordinator.head.headwatch import HeadWatch
from elastic_ray.coordinator.head.supervise import HeadSupervisor, RepeatedError
from elastic_ray.errors import CorruptFileError
from elastic_ray.protocol.disk.records import AllocationRecord, ElectionClaim, SessionInfo
from elastic_ray.protocol.disk.recovery import pointer_to_restore
from elastic_ray.protocol.disk.session_dir import SessionDir
from tests.helpers import node_state


@pytest.fixture
def session(tmp_path):
    info = SessionInfo(session_id="s-1", job_name="er-ptr", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu"}, worker_allocation=None, launcher={})
    return SessionDir.create(tmp_path / "sess", info)


# ------------------------------------------------------------------ ray_head

@pytest.mark.parametrize("damaged, record, now, expected", [
    (True, AllocationRecord(head_job="7"), 0.0, "7"),
    (False, AllocationRecord(head_job="7"), 0.0, None),             # nothing to put back
    (True, AllocationRecord(), 0.0, None),                          # no head recorded
    (True, AllocationRecord(head_job="7", election=ElectionClaim("x", 0.0, 120.0)), 60.0, None),  # elector moves it
    (True, AllocationRecord(head_job="7", election=ElectionClaim("x", 0.0, 120.0)), 121.0, "7"),  # expired claim
])
def test_which_head_a_damaged_pointer_gets_back(damaged, record, now, expected):
    assert pointer_to_restore(damaged, record, now) == expected


def test_a_damaged_pointer_is_unknown_not_absent_and_logged_once(session, caplog):
    assert session.ray_head_state() == (None, False)
    session.ray_head_file.write_bytes(b"12; rm -rf /\n")
    with caplog.at_level(logging.WARNING):
        for _ in range(5):
            assert session.ray_head_state() == (None, True)
    assert sum("event=ray_head_invalid" in r.getMessage() for r in caplog.records) == 1


def test_the_coordinator_keeps_its_head_and_puts_the_pointer_back(session, caplog):
    session.update_allocation(lambda r: replace(r, head_job="41"))
    session.write_ray_head("41")
    watch = HeadWatch(session, b"k" * 32, "s-1")
    try:
        assert watch.observe().job == "41"
        session.ray_head_file.write_bytes(b"\x00\xffgarbage")
        with caplog.at_level(logging.WARNING):
            observation = watch.observe()
        assert observation.job == "41"           # unknown: still the head it followed, no "lost" from a pointer
        assert session.read_ray_head() == "41"   # and the pointer is back
        assert any("event=ray_head_restored" in r.getMessage() and "head_job=41" in r.getMessage()
                   for r in caplog.records)
    finally:
        watch.close()


def test_an_agent_keeps_its_head_when_the_pointer_is_garbage(session):
    session.write_ray_head("41")
    events: list[str] = []
    for role in ("head", "worker"):
        follower = HeadFollower(session, b"k" * 32, "s-1", zmq.Context.instance(), role=role, lost_after=2.0,
                                log=lambda event, **_: events.append(event), on_loop=lambda call: None)
        hosting = Hosting(HostSettings("50", role, 0, True, "random"))
        follower.refresh(time.time(), hosting)
        assert follower.watch.job == "41"
        session.ray_head_file.write_bytes(b"not a job")
        follower.refresh(time.time(), hosting)
        follower.refresh(time.time(), hosting)
        assert follower.watch.job == "41", role
        session.write_ray_head("41")
        follower.subscribe(None)
    assert events.count("head_pointer_missing") == 2      # once per streak and agent, not once per read


# ------------------------------------------------------------------ persistent errors

def test_a_persistent_error_is_logged_when_it_starts_then_slowly(caplog):
    errors = RepeatedError("er-x", interval=300.0)
    with caplog.at_level(logging.INFO):
        logged = [errors.failed("disk full", now) for now in range(0, 700, 1)]
        errors.failed("another", 700.0)
        errors.cleared(701.0)
    assert [i for i, was in enumerate(logged) if was] == [0, 300, 600]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("event=supervisor_error " in m for m in messages) == 2      # "disk full", then "another"
    assert sum("event=supervisor_error_persists" in m and "times=" in m for m in messages) == 2
    assert any("event=supervisor_error_cleared" in m for m in messages)


class _BrokenSession:
    job_name = "er-broken"

    def observe_head(self, wait=0.0):
        time.sleep(0.01)
        raise CorruptFileError("/s/allocation.json", "not valid JSON")


def test_the_supervisor_does_not_log_a_damaged_record_every_cycle(caplog):
    supervisor = HeadSupervisor(_BrokenSession(), interval=0.01)   # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="elastic_ray.coordinator"):
        supervisor.start()
        time.sleep(1.0)
        supervisor.stop()
    lines = [r.getMessage() for r in caplog.records if "supervisor_error" in r.getMessage()]
    assert len(lines) == 1 and "allocation.json" in lines[0]


# ------------------------------------------------------------------ an agent's writes

def test_a_failed_node_file_write_is_retried_and_logged_once(session):
    events: list[tuple[str, dict]] = []
    writes = RetriedWrite("node_file", lambda event, **fields: events.append((event, fields)))
    full = [True, True, True, False]

    def write():
        if full.pop(0):
            raise OSError(errno.ENOSPC, "No space left on device", "/s/jobs/5/nodes/cpu-1.json")
        session.write_node_state(node_state("5", "cpu-1"))

    assert [writes.run(write) for _ in range(4)] == [False, False, False, True]
    assert not writes.due
    assert [e for e, _ in events] == ["node_file_write_failed", "node_file_written"]
    assert "cpu-1.json" in events[0][1]["error"] and events[1][1]["failed_tries"] == 3
    assert "cpu-1" in session.read_node_states("5")
