"""When an idle agent's loop wakes (issue 11: at most 0.1 % of a core while
head loss is still noticed within 2 s): the sleep to the next deadline, the
periodic work that rides early on a wakeup, the followed head's silence as a
deadline of its own, and the status file written without fsync."""

from __future__ import annotations

import os

import pytest

from elastic_ray import atomic
from elastic_ray.agent import status as st
from elastic_ray.agent import wakeups
from elastic_ray.agent.head.following import HeadFollower
from elastic_ray.agent.head.head_watch import HeadWatch
from elastic_ray.agent.options import AgentOptions
from elastic_ray.protocol.disk.records import HeadEndpoint
from tests.helpers import node_state

ENDPOINT = HeadEndpoint(job_id="10", host="n1", address="10.0.0.1:6379", ray_version="x", started_at=0.0,
                        ports={"heartbeat": 1, "control": 2})


def test_the_loop_sleeps_to_the_earliest_deadline_never_below_zero_nor_above_the_cap():
    assert wakeups.sleep_for(100.0, (100.4, 100.9, wakeups.INF)) == pytest.approx(0.4)
    assert wakeups.sleep_for(100.0, (99.0, 100.5)) == 0.0
    assert wakeups.sleep_for(100.0, (wakeups.INF, 250.0)) == wakeups.MAX_SLEEP
    assert wakeups.sleep_for(100.0, ()) == wakeups.MAX_SLEEP


def test_the_poll_timeout_is_rounded_up_so_the_loop_never_wakes_before_its_deadline():
    assert wakeups.poll_ms(0.9996) == 1000 and wakeups.poll_ms(0.0004) == 1
    assert wakeups.poll_ms(0.0) == 0 and wakeups.poll_ms(1.0) == 1000


def test_periodic_work_is_done_up_to_its_slack_early_and_never_earlier():
    assert not wakeups.due(10.0, 11.0)
    assert wakeups.due(11.0, 11.0)
    assert wakeups.due(10.5, 11.0, slack=0.5)
    assert not wakeups.due(10.49, 11.0, slack=0.5)
    # Less than half an interval early: riding on heartbeat wakeups every
    # 0.5 s, a read is not done at every one (which would double the reads).
    assert wakeups.pointer_slack(1.0) == 0.25
    quarter = wakeups.RAYLET_CHECK_SECONDS / 4
    assert wakeups.raylet_check_due(20.0 - quarter, 20.0)
    assert not wakeups.raylet_check_due(20.0 - quarter - 0.01, 20.0)


def test_work_riding_on_half_second_wakeups_keeps_its_period():
    """Simulated: wakeups every 0.5 s (e.g. a head beating faster than the
    default); the pointer, due every 1 s with its slack, is read once per
    second, not at every wakeup."""
    next_read, reads = 0.0, []
    for k in range(1, 41):
        now = k * 0.5 + 0.003 * (k % 3)    # a little jitter
        if wakeups.due(now, next_read, wakeups.pointer_slack(1.0)):
            next_read = now + 1.0
            reads.append(now)
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert len(reads) in (20, 21) and all(0.75 <= g <= 1.1 for g in gaps)


def test_a_heartbeat_every_second_leaves_two_beats_per_lost_after():
    """One beat may be lost or late before a head counts as silent; the 2 s
    of silence, not the beat, bound how soon a vanished node is seen (a head
    agent that dies on a live node is seen at once: ``protocol.wire.link_watch``)."""
    options = AgentOptions(session=".", job_id="1", role="worker", node="n", node_ip="127.0.0.1")
    assert options.head_lost_after / options.heartbeat_interval == 2
    assert options.head_lost_after <= 2.0


def follower(role: str = "worker", lost_after: float = 2.0) -> HeadFollower:
    return HeadFollower(None, b"k" * 32, "sid", None, role=role, lost_after=lost_after,  # type: ignore[arg-type]
                        log=lambda *a, **k: None, on_loop=lambda call: None)


def test_a_worker_wakes_when_the_followed_heads_heartbeat_turns_silent():
    f = follower()
    assert f.silence_at(5.0) == wakeups.INF                 # no head followed yet
    f.watch = HeadWatch(job="10", endpoint=ENDPOINT)
    assert f.silence_at(5.0) == wakeups.INF                 # no beat heard yet
    f.watch.heard(10.0, True)
    at = f.silence_at(10.5)
    assert 12.0 < at <= 12.01
    # At that moment the watch calls the head silent: the GCS probe is asked then.
    assert f.watch.silent(at, 2.0) and not f.watch.silent(at - 0.01, 2.0)
    # Once silent, nothing more to wait for here (the probe's answer wakes the loop).
    assert f.silence_at(at + 0.1) == wakeups.INF
    f.watch.heard(20.0, False)                               # a beat saying Ray is down: lost already
    assert f.silence_at(20.1) == wakeups.INF


def test_a_head_agent_follows_no_heartbeat_so_has_no_silence_to_wait_for():
    f = follower(role="head")
    f.watch = HeadWatch(job="10", endpoint=ENDPOINT)
    f.watch.heard(10.0, True)
    assert f.silence_at(10.5) == wakeups.INF


def test_the_status_file_is_replaced_without_fsync_and_session_files_still_are_synced(tmp_path, monkeypatch):
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    path = tmp_path / "run" / "5.cpu-1.1.json"
    state = node_state("5")
    st.write_status(path, state)
    assert synced == [] and st.read_status(path) == state
    atomic.atomic_write_json(tmp_path / "session.json", {"a": 1})
    assert len(synced) == 2   # the file, then its directory


def test_a_status_refresh_is_well_inside_the_hung_judgement():
    assert st.REFRESH_SECONDS * 3 <= st.HUNG_AFTER_SECONDS   # three missed refreshes before "hung"
    assert st.STATUS_SLACK < st.REFRESH_SECONDS


# ---------------------------------------------------------------- the pointer rides on the beats

def _simulate_head(seconds: float, rides: bool, extra: tuple[float, ...] = ()) -> tuple[int, list[float]]:
    """The loop's wakeup decisions for an agent beating every 1 s and reading
    the pointer every 1 s, with a status write every 20 s (slack 2 s) and
    ``extra`` wakeups (requests) between beats; each wakeup comes 3 ms late.
    Returns the number of wakeups and the times the pointer was read."""
    now, next_beat, next_pointer, next_status = 0.0, 0.0, 0.0, 0.0
    pending = sorted(extra)
    wakeups_seen, reads = 0, []
    while now < seconds:
        deadlines = (wakeups.pointer_deadline(next_pointer, rides), next_beat, next_status)
        wake = now + wakeups.sleep_for(now, deadlines)
        if pending and pending[0] < wake:
            wake = pending.pop(0)
        now = wake + 0.003
        wakeups_seen += 1
        beating = now >= next_beat
        if wakeups.pointer_read_due(now, next_pointer, 1.0, rides, beating):
            next_pointer = now + 1.0
            reads.append(now)
        if beating:
            next_beat = now + 1.0
        if wakeups.due(now, next_status, 2.0):
            next_status = now + 20.0
    return wakeups_seen, reads


def test_a_beating_agent_reads_the_pointer_only_with_its_beats_and_wakes_once_a_second():
    assert wakeups.pointer_rides_on_beat(True, 1.0, 1.0)
    assert wakeups.pointer_rides_on_beat(True, 0.5, 1.0)
    assert not wakeups.pointer_rides_on_beat(True, 2.0, 1.0)   # beats rarer than reads: the pointer keeps its own
    assert not wakeups.pointer_rides_on_beat(False, 1.0, 1.0)  # a plain worker does not beat
    # Requests between beats, within the read's slack before the next beat
    # (or a status write there), no longer pull the pointer out of phase.
    requests = tuple(k + 0.8 for k in range(5, 120, 7))
    count, reads = _simulate_head(120.0, rides=True, extra=requests)
    assert count <= 120 + len(requests) + 8
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert 110 <= len(reads) <= 121 and max(gaps) < 1.1
    # Before: one read between beats shifted the pointer's phase, and the
    # loop then woke twice a second.
    before, _ = _simulate_head(120.0, rides=False, extra=requests)
    assert before > count + 60


def test_a_pointer_read_asked_for_at_once_still_wakes_the_loop():
    assert wakeups.pointer_deadline(0.0, True) == 0.0
    assert wakeups.pointer_deadline(12.0, True) == wakeups.INF
    assert wakeups.pointer_deadline(12.0, False) == 12.0
    assert wakeups.pointer_read_due(5.0, 0.0, 1.0, True, beating_now=False)
    assert not wakeups.pointer_read_due(11.9, 12.0, 1.0, True, beating_now=False)
    assert wakeups.pointer_read_due(11.9, 12.0, 1.0, True, beating_now=True)
    assert not wakeups.pointer_read_due(11.5, 12.0, 1.0, True, beating_now=True)   # more than a quarter early
    assert wakeups.pointer_read_due(11.9, 12.0, 1.0, False, beating_now=False)


# ---------------------------------------------------------------- a follower's reaction to a moved head

def _reaction(beats: bool, move_at: float, nudge_after: float | None, beat_interval: float = 1.0,
              poll_interval: float = 1.0, extra: tuple[float, ...] = ()) -> tuple[float, int]:
    """The agent loop's decisions (``wakeups.LoopClock``, as ``Agent._loop``
    takes them) on a fake clock: the head moves at ``move_at``; a ``follow``
    nudge reaches the control socket ``nudge_after`` seconds later (None: no
    nudge, only the pointer read sees it); ``extra`` wakeups (status
    requests) come between. Every wakeup is 3 ms late. Returns the fake
    seconds from the move to the pointer read that sees it, and the number
    of wakeups in between (that read's own included)."""
    clock = wakeups.LoopClock(beat_interval, poll_interval)
    now, wakes = 0.0, 0
    arrivals = sorted([*extra, *(() if nudge_after is None else (move_at + nudge_after,))])
    nudge_at = None if nudge_after is None else move_at + nudge_after
    while now < move_at + 30:
        wake = now + clock.timeout(now, beats)
        request = arrivals[0] if arrivals and arrivals[0] < wake else None
        if request is not None:
            wake = arrivals.pop(0)
        now = wake + 0.003
        if now >= move_at:
            wakes += 1
        if request is not None and request == nudge_at:
            clock.read_pointer_soon()          # Agent._read_pointer_now, from the follow request
        if clock.read_pointer(now, beats) and now >= move_at:
            return now - move_at, wakes
        clock.beat(now, beats)
        if wakeups.due(now, clock.next_status, st.STATUS_SLACK):
            clock.next_status = now + st.REFRESH_SECONDS
    raise AssertionError(f"the follower never read the moved pointer (beats={beats}, move at {move_at})")


@pytest.mark.parametrize("beats", [False, True], ids=["plain worker", "worker hosting the head"])
@pytest.mark.parametrize("beat_interval", [1.0, 0.5])
def test_a_follower_reads_a_moved_pointer_within_its_period_plus_a_margin(beats, beat_interval):
    """Without a nudge the move is seen at the next pointer read: never more
    than one period (the beat's, when the read rides on it) plus the read's
    slack, whatever the move's phase, also with requests between beats."""
    period = max(beat_interval, 1.0) if beats else 1.0
    margin = wakeups.pointer_slack(1.0) + 0.01
    requests = tuple(k + 0.8 for k in range(3, 60, 7))
    for k in range(40):
        move = 20.0 + k * 0.025 * period
        seconds, wakes = _reaction(beats, move, None, beat_interval=beat_interval, extra=requests)
        assert seconds <= period + margin, (beats, move, seconds)
        assert wakes <= 3, (beats, move, wakes)   # the read's own wakeup, at most a beat and a request before it


@pytest.mark.parametrize("beats", [False, True], ids=["plain worker", "worker hosting the head"])
def test_a_follow_nudge_is_acted_on_at_the_wakeup_it_causes(beats):
    """A ``follow`` nudge reads the pointer at the very wakeup its request
    causes, not at the next beat or planned read (a beating follower, whose
    reads ride on its beats, included)."""
    for k in range(40):
        move = 20.0 + k * 0.025
        seconds, wakes = _reaction(beats, move, nudge_after=0.05)
        assert wakes <= 2, (beats, move, seconds, wakes)   # the nudge's own, and at most one planned just before
        assert seconds <= 0.05 + 0.01, (beats, move, seconds)
