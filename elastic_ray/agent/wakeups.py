"""When the agent's event loop wakes, and which periodic work rides along (pure).

An idle agent must cost next to nothing (at most 0.1 % of a core, issue 11).
Most of what it spends goes to waking up at all: a round of ``zmq`` polls,
the checks on its Ray node (two reads in ``/proc``), the machine's tick. So
the loop sleeps until the earliest deadline it has (never longer than
``MAX_SLEEP``), and periodic work that is not urgent carries a *slack*: it
is done up to that much early, on a wakeup that happens anyway (a heartbeat
sent, the pointer read), instead of on a wakeup of its own. An idle head
then wakes about once a second (its own heartbeat, the pointer read riding
on it); an idle worker about once a second too (the pointer read), since
it does not wake per heartbeat: it takes the queued beats then
(``agent.head.following.wake_socket``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

INF = float("inf")
#: The loop looks at its Ray node, the walltime and slurmd at least this often.
MAX_SLEEP = 1.0
#: How often the Ray node's raylet is looked up in ``/proc`` (``ray start``
#: itself is a child: its exit is seen at every wakeup, at the cost of one waitpid).
RAYLET_CHECK_SECONDS = 1.0


def sleep_for(now: float, deadlines: tuple[float, ...]) -> float:
    """Seconds to wait for the earliest of ``deadlines``: 0 when one has
    passed, at most ``MAX_SLEEP``."""
    return max(0.0, min(min(deadlines, default=INF) - now, MAX_SLEEP))


def poll_ms(seconds: float) -> int:
    """The poller's timeout in whole milliseconds, rounded *up*: ZeroMQ
    truncates, and a loop woken a fraction of a millisecond before its
    deadline finds nothing due and wakes again at once (measured: an idle
    head woke 2.1 times a second for one beat a second)."""
    return math.ceil(seconds * 1000)


def due(now: float, at: float, slack: float = 0.0) -> bool:
    """Is work planned for ``at`` to be done at ``now``? Up to ``slack`` early."""
    return now >= at - slack


def pointer_slack(poll_interval: float) -> float:
    """The ``ray_head`` pointer is read at most a quarter interval early, so
    it rides on a wakeup that comes anyway (a head's heartbeat) without being
    read at every one: less than half an interval, or with wakeups every half
    interval it would be read twice as often."""
    return poll_interval / 4


def pointer_rides_on_beat(beats: bool, beat_interval: float, poll_interval: float) -> bool:
    """An agent that beats at least as often as it reads the pointer reads it
    only at a beat's wakeup, and the pointer has no deadline of its own.

    With two deadlines of the same period, one wakeup serves both only while
    they stay in phase, and any wakeup between beats (a status write, a
    request) that reads the pointer a little early shifts it for good: the
    head then woke twice a second instead of once (measured: 71 wakeups in
    30 s against 39, issue 11)."""
    return beats and beat_interval <= poll_interval


def pointer_deadline(next_pointer: float, rides_on_beat: bool) -> float:
    """The pointer read's deadline for :func:`sleep_for`: none when it rides on
    the beats, except a read asked for at once (``next_pointer`` 0)."""
    return INF if rides_on_beat and next_pointer > 0 else next_pointer


def pointer_read_due(now: float, next_pointer: float, poll_interval: float, rides_on_beat: bool,
                     beating_now: bool) -> bool:
    """Read ``ray_head`` at this wakeup? At once when asked for (0); riding on
    the beats, only at a beat's wakeup; and then up to a quarter interval early."""
    if next_pointer <= 0:
        return True
    if rides_on_beat and not beating_now:
        return False
    return due(now, next_pointer, pointer_slack(poll_interval))


def raylet_check_due(now: float, at: float) -> bool:
    """The raylet lookup rides on a wakeup up to a quarter of its period early
    (see ``pointer_slack``)."""
    return due(now, at, RAYLET_CHECK_SECONDS / 4)


@dataclass
class LoopClock:
    """The loop's periodic deadlines and what each wakeup does about them.

    The runner asks :meth:`timeout` before it sleeps and, once awake,
    :meth:`read_pointer` and :meth:`beat`; a control request that wants the
    pointer read at once (a ``follow`` nudge) calls :meth:`read_pointer_soon`.
    No clock of its own: ``now`` is always passed in, so a simulation drives
    the very decisions the agent takes with a fake clock
    (``tests/test_agent_wakeups.py``). ``beats``: this agent beats now (a
    head, or a node hosting one)."""

    beat_interval: float
    poll_interval: float
    next_beat: float = 0.0
    next_pointer: float = 0.0
    next_status: float = 0.0

    def rides(self, beats: bool) -> bool:
        return pointer_rides_on_beat(beats, self.beat_interval, self.poll_interval)

    def timeout(self, now: float, beats: bool, silence_at: float = INF) -> float:
        """Seconds to sleep before the next wakeup that has work to do."""
        return sleep_for(now, (pointer_deadline(self.next_pointer, self.rides(beats)),
                               self.next_beat if beats else INF, self.next_status, silence_at))

    def read_pointer(self, now: float, beats: bool) -> bool:
        """Read ``ray_head`` at this wakeup? If so its next read is planned."""
        if pointer_read_due(now, self.next_pointer, self.poll_interval, self.rides(beats),
                            beating_now=beats and now >= self.next_beat):
            self.next_pointer = now + self.poll_interval
            return True
        return False

    def read_pointer_soon(self) -> None:
        """Read the pointer at the next wakeup rather than at its next planned read."""
        self.next_pointer = 0.0

    def beat(self, now: float, beats: bool) -> bool:
        """Send a heartbeat at this wakeup? If so the next one is planned."""
        if beats and now >= self.next_beat:
            self.next_beat = now + self.beat_interval
            return True
        return False
