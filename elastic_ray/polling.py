"""Wait for something by looking at it again and again, with a deadline.

Most waits in this project have the same shape: look (read a file, ask the
scheduler once), stop if what we see is what we wait for, give up after a
timeout, pause, look again. Written by hand each time, the details drift:
whether the last look happens at the deadline, whether the pause overshoots
it, what the timeout says. One function keeps them the same everywhere, and
takes its clock and its sleep as arguments so its timing can be tested with
a fake clock and no real waiting.

It belongs to no room: the agent, the coordinator and the CLI may all use it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from .errors import WaitTimeout

T = TypeVar("T")


class Wakeup(Protocol):
    """What :func:`wait_for` needs of a wake-up event (``threading.Event`` fits)."""

    def is_set(self) -> bool: ...

    def clear(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def wait_for(
    probe: Callable[[], T],
    *,
    timeout: float | None,
    interval: float,
    what: str = "a condition",
    done: Callable[[T], object] | None = None,
    backoff: float = 1.0,
    max_interval: float | None = None,
    progress: Callable[[T], None] | None = None,
    wake: Wakeup | None = None,
    error: Callable[[T], BaseException] | None = None,
    raising: bool = True,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T | None:
    """Call ``probe`` until what it returns is done; return that value.

    ``done`` decides on each value (default: the value is truthy). Between
    looks the pause starts at ``interval`` and is multiplied by ``backoff``
    after each one, up to ``max_interval``; a pause never runs past the
    deadline, so the last look happens at the deadline itself.
    ``timeout=None`` waits for ever.

    The probe runs at least once, even with no time left. An exception it
    raises ends the wait at once and reaches the caller unchanged: that is
    how a probe says "this will never come" (a job that ended, say).

    When the time is up: with ``raising`` (the default) raise ``error(last)``
    if given, else :class:`WaitTimeout` naming ``what`` and the last value;
    without ``raising``, return None.

    ``progress(value)`` is called after each look that was not done and did
    not time out, just before the pause. ``wake``, if given, cuts a pause
    short when it is set; when it is set while the probe runs (the probe may
    set it itself, to ask for another look), the next look happens at once,
    before the deadline is considered: there is news, so look at it before
    giving up. An event that is set on every look therefore never times out.
    """
    if interval <= 0:
        raise ValueError(f"interval={interval!r}: must be a positive number of seconds")
    if backoff < 1.0:
        raise ValueError(f"backoff={backoff!r}: must be at least 1 (a pause never shrinks)")
    if max_interval is not None and max_interval < interval:
        raise ValueError(f"max_interval={max_interval!r}: must be at least interval ({interval!r})")
    deadline = None if timeout is None else clock() + timeout
    pause = interval
    while True:
        value = probe()
        if (done(value) if done is not None else value):
            return value
        if wake is not None and wake.is_set():
            wake.clear()
            continue
        now = clock()
        if deadline is not None and now >= deadline:
            if not raising:
                return None
            if error is not None:
                raise error(value)
            raise WaitTimeout(what, timeout, value)  # type: ignore[arg-type]
        if progress is not None:
            progress(value)
        step = pause if deadline is None else min(pause, deadline - now)
        if wake is not None:
            wake.wait(step)
            wake.clear()
        else:
            sleep(step)
        pause = pause * backoff
        if max_interval is not None:
            pause = min(pause, max_interval)


__all__ = ["WaitTimeout", "Wakeup", "wait_for"]
