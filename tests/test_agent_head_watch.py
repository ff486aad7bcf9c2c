"""What a worker makes of the head it follows: liveness, the silent-head
probe, pointer reads and a head agent's answer, without sockets."""

from __future__ import annotations

import pytest

from elastic_ray.agent.head.head_watch import (
    HEAD_PROBE_TIMEOUT,
    HeadWatch,
    PointerRead,
    answer_counts,
    head_serves,
    read_pointer,
)
from elastic_ray.protocol.disk.records import HeadEndpoint

LOST = 2.0
ENDPOINT = HeadEndpoint(job_id="10", host="n1", address="10.0.0.1:6379", ray_version="x", started_at=0.0,
                        ports={"heartbeat": 1, "control": 2})


def watching(beat=0.0, ok=True, **fields):
    watch = HeadWatch(job="10", endpoint=ENDPOINT, **fields)
    watch.heard(beat, ok)
    return watch


def test_no_endpoint_or_no_beat_or_a_beat_saying_ray_is_down_is_not_live():
    assert not HeadWatch(job="10").is_live(0, LOST)
    assert not HeadWatch(job="10", endpoint=ENDPOINT).is_live(0, LOST)
    assert not watching(ok=False).is_live(0.1, LOST)


def test_a_recent_beat_is_live_and_seen_with_its_address():
    seen = watching(beat=10).seen(10 + LOST, LOST)
    assert (seen.head_job, seen.address, seen.live) == ("10", "10.0.0.1:6379", True)


def test_silence_gives_the_first_probe_time_before_the_head_counts_as_lost():
    watch = watching(beat=0)
    assert watch.silent(LOST + 0.1, LOST)
    assert watch.is_live(LOST + HEAD_PROBE_TIMEOUT + 1.0, LOST)
    assert not watch.is_live(LOST + HEAD_PROBE_TIMEOUT + 1.1, LOST)


def test_a_gcs_that_answers_keeps_a_silent_head_live_for_a_while():
    watch = watching(beat=0)
    watch.probed(at=3, answered=True)
    assert watch.is_live(3 + LOST + HEAD_PROBE_TIMEOUT, LOST)
    assert not watch.is_live(3 + LOST + HEAD_PROBE_TIMEOUT + 0.1, LOST)


def test_a_gcs_that_does_not_answer_loses_the_head_at_once():
    watch = watching(beat=0)
    watch.probed(at=3, answered=False)
    assert not watch.is_live(3.1, LOST)


def test_a_probe_is_due_once_per_silence_interval_and_one_at_a_time():
    watch = watching(beat=0)
    assert not watch.probe_due(LOST, LOST)                 # not silent yet
    assert watch.probe_due(LOST + 0.1, LOST)
    watch.probing, watch.next_probe = True, LOST + 0.1 + LOST
    assert not watch.probe_due(LOST + 0.2, LOST)           # one on its way
    watch.probed(at=LOST + 1, answered=True)
    assert not watch.probe_due(LOST + 1.5, LOST)           # not before next_probe
    assert watch.probe_due(2 * LOST + 0.2, LOST)


def test_no_probe_after_the_gcs_failed_until_a_heartbeat_comes():
    watch = watching(beat=0)
    watch.probed(at=3, answered=False)
    assert not watch.probe_due(100, LOST)
    watch.heard(101, True)
    assert watch.probe_due(101 + LOST + 0.1, LOST)


def test_no_probe_for_a_head_that_said_ray_is_down_or_has_no_endpoint():
    assert not watching(beat=0, ok=False).probe_due(10, LOST)
    assert not HeadWatch(job="10").probe_due(10, LOST)


@pytest.mark.parametrize("watch, job, now, want", [
    (watching(beat=0), None, 1.0, PointerRead.KEEP),                 # a bad read while the head lives
    (watching(beat=0), None, 100.0, PointerRead.NEW),                # ... but not once it is silent too long
    (HeadWatch(), None, 1.0, PointerRead.SAME),
    (HeadWatch(), "10", 1.0, PointerRead.NEW),
    (watching(beat=0), "10", 1.0, PointerRead.SAME),
    (watching(beat=0), "11", 1.0, PointerRead.NEW),
])
def test_read_pointer(watch, job, now, want):
    assert read_pointer(watch, job, now, LOST) is want


@pytest.mark.parametrize("status, serves", [
    ({"role": "head", "state": "JOINED"}, True),
    ({"role": "head", "state": "DRAINING"}, True),
    ({"role": "head", "state": "STARTING"}, False),
    ({"role": "worker", "state": "JOINED"}, False),
    ({"role": "worker", "state": "JOINED", "hosted_head": {"state": "READY"}}, True),
    ({"role": "worker", "state": "JOINED", "hosted_head": {"state": "STARTING"}}, False),
    ({"role": "worker", "hosted_head": None}, False),
])
def test_head_serves(status, serves):
    assert head_serves(status) is serves


def test_an_answer_counts_as_the_first_heartbeat_only():
    serving = {"job_id": "10", "role": "head", "state": "JOINED"}
    assert answer_counts(HeadWatch(job="10", endpoint=ENDPOINT), serving)
    assert not answer_counts(HeadWatch(job="11", endpoint=ENDPOINT), serving)   # another job answered
    assert not answer_counts(watching(beat=0, ok=False), serving)               # a heartbeat came first
