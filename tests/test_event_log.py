"""The event log: the line format (a table) and the appends and reads (real files, real processes)."""

from __future__ import annotations

import json
import re
import multiprocessing
import os
import threading
import time

import pytest

from elastic_ray.protocol.disk import event_log, paths
from elastic_ray.protocol.disk.events import (
    EVENTS_VERSION,
    MAX_LINE_BYTES,
    Event,
    EventKind,
    EventSource,
    Skipped,
    decode,
    describe,
    encode,
)

A, C = EventSource.AGENT, EventSource.COORDINATOR


def test_an_event_goes_to_one_line_and_back():
    event = Event(at=1764620000.1234, kind=EventKind.NODE_JOINED, by=A, job="12", node="n1",
                  reason="raylet registered", details={"ray_node_id": "ab" * 28, "gpus": 2, "hosted": False})
    line = encode(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    data = json.loads(line)
    assert data["v"] == EVENTS_VERSION and data["kind"] == "node_joined" and data["at"] == 1764620000.123
    back = decode(line)
    assert back == Event(at=1764620000.123, kind=EventKind.NODE_JOINED, by=A, job="12", node="n1",
                         reason="raylet registered", details={"ray_node_id": "ab" * 28, "gpus": 2, "hosted": False})
    assert describe(back) == f"node_joined job=12 node=n1 'raylet registered' ray_node_id={'ab' * 28} gpus=2 hosted=False"


def test_absent_fields_are_left_out_of_the_line():
    assert json.loads(encode(Event(at=1.0, kind=EventKind.SESSION_CREATED, by=C))) == {
        "v": 1, "at": 1.0, "kind": "session_created", "by": "coordinator"}


@pytest.mark.parametrize("line, why", [
    (b'{"v": 1, "at": 1, "kind": "node_jo', Skipped.DAMAGED),            # torn by a crash mid-write
    (b"[1, 2]", Skipped.DAMAGED),
    (b'{"at": 1, "kind": "removed", "by": "agent"}', Skipped.DAMAGED),   # no version
    (b'{"v": true, "at": 1, "kind": "removed", "by": "agent"}', Skipped.DAMAGED),
    (b'{"v": 2, "at": 1, "kind": "removed", "by": "agent"}', Skipped.NEWER),
    (b'{"v": 1, "at": 1, "kind": "teleported", "by": "agent"}', Skipped.UNKNOWN_KIND),
    (b'{"v": 1, "at": 1, "kind": 7, "by": "agent"}', Skipped.DAMAGED),
    (b'{"v": 1, "at": 1, "kind": "removed", "by": "martian"}', Skipped.DAMAGED),
    (b'{"v": 1, "at": "noon", "kind": "removed", "by": "agent"}', Skipped.DAMAGED),
    (b'{"v": 1, "at": 1, "kind": "removed", "by": "agent", "job": 12}', Skipped.DAMAGED),
    (b'{"v": 1, "at": 1, "kind": "removed", "by": "agent", "details": {"a": [1]}}', Skipped.DAMAGED),
    (b"\xff\xfe", Skipped.DAMAGED),
])
def test_lines_a_reader_skips(line, why):
    assert decode(line) is why


@pytest.mark.parametrize("kwargs, names", [
    ({"at": float("nan")}, "at"),
    ({"at": True}, "at"),
    ({"kind": "removed"}, "kind"),
    ({"by": "agent"}, "by"),
    ({"job": 12}, "job"),
    ({"details": {"x": object()}}, "details['x']"),
    ({"details": {"": 1}}, "details"),
])
def test_a_bad_event_names_its_field(kwargs, names):
    fields = {"at": 1.0, "kind": EventKind.REMOVED, "by": C, **kwargs}
    with pytest.raises(ValueError, match=re.escape(f"event {names}")):
        Event(**fields)


def test_a_long_event_is_cut_to_one_bounded_line():
    event = Event(at=1.0, kind=EventKind.FAILED, by=C, job="9", reason="x" * 5000,
                  details={f"k{i}": "y" * 500 for i in range(40)})
    line = encode(event)
    assert len(line) <= MAX_LINE_BYTES
    back = decode(line)
    assert isinstance(back, Event) and back.job == "9" and back.kind is EventKind.FAILED
    assert len(back.reason) <= 300


def _append_many(session: str, writer: int, count: int, max_bytes: int) -> None:
    for i in range(count):
        assert event_log.append(session, Event(at=time.time(), kind=EventKind.STARTED, by=A, job=str(writer),
                                               node=f"n{i}", reason="r" * 100), max_bytes=max_bytes)


def test_processes_appending_at_once_lose_no_line_and_tear_none(tmp_path):
    writers, count = 4, 250
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, count, 10_000_000)) for w in range(writers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    reading = event_log.read(tmp_path)
    assert reading.skipped == {}
    assert sorted((e.job, e.node) for e in reading.events) == sorted(
        (str(w), f"n{i}") for w in range(writers) for i in range(count))
    for w in range(writers):      # each writer's own lines stay in its order
        mine = [int(e.node[1:]) for e in reading.events if e.job == str(w)]
        assert mine == sorted(mine)
    assert oct(os.stat(paths.events_file(tmp_path)).st_mode & 0o777) == "0o600"


def test_the_log_is_bounded_and_keeps_the_newest_events(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, 300, 20_000)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    current, rotated = paths.events_file(tmp_path), paths.events_rotated_file(tmp_path)
    assert current.stat().st_size <= 20_000 and rotated.stat().st_size <= 20_000
    reading = event_log.read(tmp_path)
    assert reading.skipped == {} and 0 < len(reading.events) < 900
    kept = 0
    for w in range(3):            # what is left of each writer is its newest lines, in order, none lost between
        mine = [int(e.node[1:]) for e in reading.events if e.job == str(w)]
        assert mine == list(range(300 - len(mine), 300))
        kept += len(mine)
    assert kept == len(reading.events)


def test_a_reader_skips_a_torn_last_line_and_a_newer_one(tmp_path):
    event_log.append(tmp_path, Event(at=5.0, kind=EventKind.SUBMITTED, by=C, job="1"))
    with open(paths.events_file(tmp_path), "ab") as f:
        f.write(b'{"v": 9, "at": 6, "kind": "warp", "by": "agent"}\n{"v": 1, "at": 7, "ki')
    reading = event_log.read(tmp_path)
    assert [e.job for e in reading.events] == ["1"]
    assert reading.skipped == {Skipped.NEWER: 1, Skipped.DAMAGED: 1}
    assert event_log.read(tmp_path, since=5.5).events == ()


def test_an_unwritable_log_returns_false_and_does_not_raise(tmp_path):
    missing = tmp_path / "gone"
    assert event_log.append(missing, Event(at=1.0, kind=EventKind.REMOVED, by=C)) is False


def test_follow_yields_what_is_appended_and_survives_a_move_aside(tmp_path):
    event_log.append(tmp_path, Event(at=1.0, kind=EventKind.SUBMITTED, by=C, job="1"))
    seen: list[Event] = []
    done = threading.Event()

    def consume() -> None:
        for event in event_log.follow(tmp_path, interval=0.02, stop=done.is_set):
            seen.append(event)

    reader = threading.Thread(target=consume)
    reader.start()
    try:
        for i in range(2, 40):
            event_log.append(tmp_path, Event(at=float(i), kind=EventKind.STARTED, by=A, job=str(i),
                                             reason="z" * 200), max_bytes=3000)
            time.sleep(0.005)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not seen or seen[-1].job != "39"):
            time.sleep(0.02)
    finally:
        done.set()
        reader.join(10)
    jobs = [int(e.job) for e in seen]
    assert jobs[0] == 1 and jobs[-1] == 39 and jobs == sorted(jobs)
    assert paths.events_rotated_file(tmp_path).exists()     # the bound moved the file aside meanwhile
