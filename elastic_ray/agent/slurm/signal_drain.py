"""Drains decided from what the scheduler says: why a drain signal came, and
when a head with no pre-walltime signal must drain ahead of its walltime.

Runs on its own short thread (``agent-signal``), not the effects thread: that
may be busy starting Ray for many seconds while Slurm's KillWait runs. It
writes nothing the loop owns: the resulting drain is posted to the loop as an
event. The deadline itself is decided by ``machine.drain_deadline_for_signal``.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Callable

from ...scheduler.base import JobInfo, JobState
from ..machine import DrainRequested, drain_deadline_for_signal
from .walltime import WalltimeFacts, walltime_drain

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
# How long a signal-triggered drain may wait for the scheduler to say why the
# signal came (state and end time). Slurm kills the job KillWait seconds
# after a cancel (default 30, 10 in the lab), so the answer is only useful if
# it comes quickly; without one the drain gets ENDING_GRACE.
SIGNAL_LOOKUP_TIMEOUT = 5.0
# How often a head with no pre-walltime signal asks for its job's end time.
END_TIME_REFRESH = 60.0


def own_job_info(scheduler: dict[str, Any], job_name: str, job_id: str, timeout: float) -> JobInfo | None:
    """This agent's job as the scheduler lists it: ONE query (all jobs of the
    session's name, as every poll). Raises when the scheduler does not
    answer within ``timeout``; None when it does not list the job."""
    from ...scheduler.factory import make_scheduler

    sched = make_scheduler(scheduler["kind"], state_dir=scheduler.get("state_dir"))
    if hasattr(sched, "timeout"):
        sched.timeout = timeout  # type: ignore[attr-defined]
    return sched.query(job_name, [job_id]).get(job_id)


def lookup_job(scheduler: dict[str, Any], job_name: str, job_id: str,
               log: Callable[..., None]) -> tuple[JobState | None, float | None]:
    """This job's state and planned end as the scheduler reports them; (None,
    None) when it does not answer within SIGNAL_LOOKUP_TIMEOUT. Also used by
    the walltime drain of a head without a pre-walltime signal."""
    try:
        info = own_job_info(scheduler, job_name, job_id, SIGNAL_LOOKUP_TIMEOUT)
        if info is not None:
            return info.state, info.end_time
    except Exception as exc:
        log("end_time_unknown", error=str(exc)[:200])
    return None, None


def drain_for_signal(signal_name: str, scheduler: dict[str, Any], job_name: str, job_id: str,
                     log: Callable[..., None]) -> DrainRequested:
    """Find out why the signal came; return the drain with the right deadline."""
    now = time.time()
    state, end = lookup_job(scheduler, job_name, job_id, log)
    deadline = drain_deadline_for_signal(now, state, end)
    log("signal_drain", signal=signal_name, job_state=state.value if state else "-",
        end_in=f"{end - now:.1f}s" if end is not None else "-", deadline_in=f"{deadline - now:.1f}s",
        lookup=f"{time.time() - now:.2f}s")
    return DrainRequested(time.time(), deadline, f"{signal_name} (job {state.value if state else '?'})")


class WalltimeWatch:
    """The head's own walltime drain, for an allocation Slurm sends no warning.

    Owned by the event loop: ``check`` runs there, and the end-time lookup
    runs on a short thread (``agent-end-time``) whose answer is handed back
    through ``post`` (the loop's call queue), so only the loop writes
    ``end_time``. The rule itself is ``walltime.walltime_drain`` (pure).
    """

    def __init__(self, scheduler: dict[str, Any], job_name: str, job_id: str, lead: float,
                 log: Callable[..., None], post: Callable[[Callable[[], None]], None]):
        self.scheduler, self.job_name, self.job_id, self.lead = scheduler, job_name, job_id, lead
        self.log, self.post = log, post
        self.end_time: float | None = None   # the job's planned end
        self._next_lookup = 0.0
        self._busy = False

    def check(self, now: float, serves: bool, joined: bool, has_signal: bool) -> DrainRequested | None:
        """The drain due now, if any; starts a lookup of the end time when one is due."""
        if has_signal or not serves:
            return None
        if now >= self._next_lookup and not self._busy:
            self._busy = True
            self._next_lookup = now + END_TIME_REFRESH
            threading.Thread(target=self._lookup, name="agent-end-time", daemon=True).start()
        drain = walltime_drain(WalltimeFacts(now, serves, joined, has_signal, self.end_time, self.lead))
        if drain is not None:
            self.log("walltime_drain", end_in=f"{(self.end_time or now) - now:.1f}s",
                     deadline_in=f"{drain.deadline - now:.1f}s", lead=f"{self.lead:g}s")
        return drain

    def _lookup(self) -> None:
        _, end = lookup_job(self.scheduler, self.job_name, self.job_id, self.log)

        def keep() -> None:
            self._busy = False
            if end is not None:
                self.end_time = end
            else:  # no answer: ask again soon rather than a minute later
                self._next_lookup = min(self._next_lookup, time.time() + 5.0)
        self.post(keep)
