"""elastic_ray.polling.wait_for, on a fake clock: no test here sleeps for real.

Each test records when the probe looked (fake seconds since the start) so
the timing contract is checked exactly: the first look at once, pauses of
``interval`` (growing with ``backoff`` up to ``max_interval``), the last look
at the deadline, never one past it.
"""

from __future__ import annotations

import threading

import pytest

from elastic_ray.polling import WaitTimeout, wait_for
from tests.helpers import stays, wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.sleeps.append(seconds)
        self.now += seconds


class FakeEvent:
    """A wake-up event on the fake clock; ``set_at`` makes it fire during a pause."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.flag = False
        self.set_at: float | None = None
        self.waits: list[float] = []

    def is_set(self) -> bool:
        return self.flag

    def set(self) -> None:
        self.flag = True

    def clear(self) -> None:
        self.flag = False

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        if self.flag:
            return True
        if self.set_at is not None and self.clock.now + timeout >= self.set_at:
            self.clock.now = max(self.clock.now, self.set_at)
            self.set_at = None
            self.flag = True
            return True
        self.clock.now += timeout
        return False


class Probe:
    """Returns ``values`` in turn (the last one for ever), noting when it looked."""

    def __init__(self, clock: FakeClock, *values: object) -> None:
        self.clock = clock
        self.values = list(values)
        self.times: list[float] = []

    def __call__(self) -> object:
        self.times.append(self.clock.now)
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def run(probe, clock: FakeClock, **kw):
    kw.setdefault("interval", 1.0)
    kw.setdefault("timeout", 10.0)
    return wait_for(probe, clock=clock, sleep=clock.sleep, **kw)


# ---------------------------------------------------------------- done and values

def test_returns_the_first_truthy_value_at_once(clock):
    probe = Probe(clock, {"node": "a"})
    assert run(probe, clock) == {"node": "a"}
    assert probe.times == [0.0] and clock.sleeps == []


def test_polls_every_interval_until_truthy(clock):
    probe = Probe(clock, None, 0, "", [], "ready")
    assert run(probe, clock, interval=0.5) == "ready"
    assert probe.times == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_done_decides_instead_of_truthiness(clock):
    # A probe that answers False ("ended") is done as much as True ("ready").
    probe = Probe(clock, None, None, False)
    assert run(probe, clock, done=lambda v: v is not None) is False
    assert probe.times == [0.0, 1.0, 2.0]


def test_done_may_accept_a_falsy_value_the_caller_waits_for(clock):
    probe = Probe(clock, ["a", "b"], ["b"], [])
    assert run(probe, clock, done=lambda active: not active) == []
    assert len(probe.times) == 3


# ---------------------------------------------------------------- timeouts

def test_timeout_raises_naming_what_and_the_last_value(clock):
    probe = Probe(clock, "pending 1", "pending 2", "pending 3")
    with pytest.raises(WaitTimeout) as caught:
        run(probe, clock, timeout=2.0, what="the head to start", done=lambda v: v == "ready")
    exc = caught.value
    assert isinstance(exc, TimeoutError)
    assert exc.what == "the head to start" and exc.last == "pending 3" and exc.timeout == 2.0
    assert str(exc) == "timed out after 2 s waiting for the head to start; last seen: 'pending 3'"
    assert probe.times == [0.0, 1.0, 2.0], "the last look happens at the deadline"


def test_the_last_pause_is_cut_to_the_deadline(clock):
    probe = Probe(clock, None)
    with pytest.raises(WaitTimeout):
        run(probe, clock, timeout=2.5, interval=1.0)
    assert probe.times == [0.0, 1.0, 2.0, 2.5]
    assert clock.sleeps == [1.0, 1.0, 0.5]
    assert clock.now == 2.5, "never waits past the deadline"


def test_the_probe_runs_once_even_with_no_time(clock):
    probe = Probe(clock, None)
    with pytest.raises(WaitTimeout):
        run(probe, clock, timeout=0.0)
    assert probe.times == [0.0] and clock.sleeps == []
    assert run(Probe(clock, "yes"), clock, timeout=0.0) == "yes"


def test_a_value_seen_at_the_deadline_still_counts(clock):
    probe = Probe(clock, None, None, "just in time")
    assert run(probe, clock, timeout=2.0) == "just in time"


def test_a_slow_probe_uses_up_the_time(clock):
    def slow():
        clock.now += 4.0
    with pytest.raises(WaitTimeout):
        run(slow, clock, timeout=10.0, interval=1.0)
    # looks at 0 (ends 4), 5 (ends 9), 10 (ends 14): then the time is up
    assert clock.sleeps == [1.0, 1.0]


def test_without_raising_a_timeout_returns_none(clock):
    probe = Probe(clock, None)
    assert run(probe, clock, timeout=3.0, raising=False) is None
    assert probe.times == [0.0, 1.0, 2.0, 3.0]


def test_error_builds_the_callers_exception_from_the_last_value(clock):
    probe = Probe(clock, ["9"], ["9", "7"])
    with pytest.raises(RuntimeError, match=r"^still active: 9, 7$"):
        run(probe, clock, timeout=1.0, done=lambda v: not v,
            error=lambda active: RuntimeError("still active: " + ", ".join(active)))


def test_no_timeout_waits_for_ever(clock):
    probe = Probe(clock, *([None] * 500), "finally")
    assert run(probe, clock, timeout=None, interval=60.0) == "finally"
    assert clock.now == 500 * 60.0


def test_an_exception_from_the_probe_ends_the_wait_unchanged(clock):
    calls = []

    def probe():
        calls.append(clock.now)
        if len(calls) == 3:
            raise LookupError("job 12 ended FAILED")
    with pytest.raises(LookupError, match="job 12 ended FAILED"):
        run(probe, clock)
    assert calls == [0.0, 1.0, 2.0]


# ---------------------------------------------------------------- backoff

def test_backoff_grows_the_pause_up_to_its_cap(clock):
    probe = Probe(clock, None)
    with pytest.raises(WaitTimeout):
        run(probe, clock, timeout=20.0, interval=0.5, backoff=2.0, max_interval=4.0)
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 0.5]
    assert clock.now == 20.0


def test_backoff_without_a_cap_keeps_growing(clock):
    probe = Probe(clock, None, None, None, None, "done")
    run(probe, clock, timeout=None, interval=1.0, backoff=3.0)
    assert clock.sleeps == [1.0, 3.0, 9.0, 27.0]


@pytest.mark.parametrize("kw, field", [
    ({"interval": 0.0}, "interval"),
    ({"interval": -1.0}, "interval"),
    ({"backoff": 0.5}, "backoff"),
    ({"interval": 2.0, "max_interval": 1.0}, "max_interval"),
])
def test_bad_settings_are_refused_by_name(clock, kw, field):
    probe = Probe(clock, "x")
    with pytest.raises(ValueError, match=rf"^{field}="):
        run(probe, clock, **kw)
    assert probe.times == [], "refused before looking"


# ---------------------------------------------------------------- progress

def test_progress_sees_each_value_that_was_not_done(clock):
    seen = []
    probe = Probe(clock, "1/3", "2/3", "3/3 ok")
    run(probe, clock, done=lambda v: v.endswith("ok"), progress=seen.append)
    assert seen == ["1/3", "2/3"]


def test_progress_is_not_called_for_the_look_that_times_out(clock):
    seen = []
    probe = Probe(clock, 0, 1, 2)
    with pytest.raises(WaitTimeout) as caught:
        run(probe, clock, timeout=2.0, done=lambda v: v >= 5, progress=seen.append)
    assert seen == [0, 1] and caught.value.last == 2


# ---------------------------------------------------------------- wake-up

def test_a_wakeup_cuts_the_pause_short(clock):
    event = FakeEvent(clock)
    event.set_at = 0.3
    probe = Probe(clock, None, "woken")
    assert run(probe, clock, interval=5.0, wake=event) == "woken"
    assert probe.times == [0.0, 0.3]
    assert clock.sleeps == [], "with a wake-up event the pause is the event's wait"
    assert not event.is_set(), "the event is cleared for the next pause"


def test_without_a_wakeup_the_pause_runs_its_full_interval(clock):
    event = FakeEvent(clock)
    probe = Probe(clock, None, None, "x")
    run(probe, clock, interval=2.0, wake=event)
    assert probe.times == [0.0, 2.0, 4.0] and event.waits == [2.0, 2.0]


def test_a_wakeup_set_by_the_probe_looks_again_at_once_even_at_the_deadline(clock):
    event = FakeEvent(clock)
    looks = []

    def probe():
        looks.append(clock.now)
        if len(looks) == 2:
            clock.now = 50.0      # a long action, past the deadline...
            event.set()           # ...after which the probe asks for another look
            return None
        return "healthy" if len(looks) == 3 else None
    assert run(probe, clock, timeout=10.0, interval=1.0, wake=event) == "healthy"
    assert looks == [0.0, 1.0, 50.0]


def test_a_wakeup_does_not_extend_the_deadline_otherwise(clock):
    event = FakeEvent(clock)
    event.set_at = 1.5
    probe = Probe(clock, None)
    with pytest.raises(WaitTimeout):
        run(probe, clock, timeout=3.0, interval=1.0, wake=event)
    assert probe.times == [0.0, 1.0, 1.5, 2.5, 3.0]


def test_a_real_event_wakes_a_real_wait():
    """One real-time check that threading.Event fits: a 60 s pause ends when set."""
    event = threading.Event()
    looks = []

    def probe():
        looks.append(1)
        if len(looks) == 1:
            threading.Timer(0.05, event.set).start()
            return None
        return "woken"
    assert wait_for(probe, timeout=120, interval=60, wake=event) == "woken"


# ---------------------------------------------------------------- tests' helpers

def test_wait_until_reports_the_last_value_as_an_assertion():
    clock = FakeClock()
    probe = Probe(clock, None, [], 0)
    with pytest.raises(AssertionError, match=r"^timed out after 1 s waiting for the count; last value: 0$"):
        wait_until(probe, 1.0, 0.5, "the count", clock=clock, sleep=clock.sleep)
    assert probe.times == [0.0, 0.5, 1.0]


def test_wait_until_reports_an_exception_of_the_predicate():
    clock = FakeClock()

    def flaky():
        raise KeyError("node-1")
    with pytest.raises(AssertionError, match=r"last value: \"raised KeyError: 'node-1'\"$"):
        wait_until(flaky, 1.0, 0.5, "a node", clock=clock, sleep=clock.sleep)


def test_wait_until_returns_the_value_and_retries_after_an_exception():
    clock = FakeClock()
    calls = []

    def settling():
        calls.append(clock.now)
        if len(calls) == 1:
            raise FileNotFoundError("not yet")
        return {"state": "JOINED"}
    assert wait_until(settling, 5, 0.2, clock=clock, sleep=clock.sleep) == {"state": "JOINED"}
    assert calls == [0.0, 0.2]


def test_stays_holds_for_the_whole_period():
    clock = FakeClock()
    looks = []
    stays(lambda: looks.append(clock.now) or True, 1.0, 0.25, "quiet", clock=clock, sleep=clock.sleep)
    assert looks == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_stays_fails_at_once_naming_what_changed():
    clock = FakeClock()
    state = iter(["PENDING", "PENDING", "RUNNING", "PENDING"])
    current = {}

    def pending():
        current["state"] = next(state)
        return current["state"] == "PENDING"
    with pytest.raises(AssertionError,
                       match=r"^job 7 stays PENDING stopped holding after 0.2 of 1 s: now 'RUNNING'$"):
        stays(pending, 1.0, 0.1, "job 7 stays PENDING", show=lambda: current["state"],
              clock=clock, sleep=clock.sleep)
    assert clock.now == pytest.approx(0.2), "failed at the first change, not at the end"


def test_stays_reports_an_exception_of_the_predicate():
    clock = FakeClock()

    def boom():
        raise AssertionError("node id changed: abc -> def")
    with pytest.raises(AssertionError, match=r"stopped holding after 0.0 of 2 s: .*node id changed: abc -> def"):
        stays(boom, 2.0, 0.5, "the workers stay", clock=clock, sleep=clock.sleep)


def test_stays_reports_the_falsy_value_without_show():
    clock = FakeClock()
    values = iter([True, []])
    with pytest.raises(AssertionError, match=r"after 0.5 of 1 s: returned \[\]$"):
        stays(lambda: next(values), 1.0, 0.5, "the list", clock=clock, sleep=clock.sleep)
