"""Why a drain signal came, asked of the scheduler, and the drain it calls for.

Runs on its own short thread (``agent-signal``), not the effects thread: that
may be busy starting Ray for many seconds while Slurm's KillWait runs. It
writes nothing the loop owns: the resulting drain is posted to the loop as an
event. The deadline itself is decided by ``machine.drain_deadline_for_signal``.
"""

from __future__ import annotations

import signal
import time
from typing import Any, Callable

from ..scheduler.base import JobState
from .machine import DrainRequested, drain_deadline_for_signal

DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
# How long a signal-triggered drain may wait for the scheduler to say why the
# signal came (state and end time). Slurm kills the job KillWait seconds
# after a cancel (default 30, 10 in the lab), so the answer is only useful if
# it comes quickly; without one the drain gets ENDING_GRACE.
SIGNAL_LOOKUP_TIMEOUT = 5.0


def lookup_job(scheduler: dict[str, Any], job_name: str, job_id: str,
               log: Callable[..., None]) -> tuple[JobState | None, float | None]:
    """This job's state and planned end as the scheduler reports them; (None,
    None) when it does not answer within SIGNAL_LOOKUP_TIMEOUT. Also used by
    the walltime drain of a head without a pre-walltime signal."""
    try:
        from ..scheduler.factory import make_scheduler

        sched = make_scheduler(scheduler["kind"], state_dir=scheduler.get("state_dir"))
        if hasattr(sched, "timeout"):
            sched.timeout = SIGNAL_LOOKUP_TIMEOUT  # type: ignore[attr-defined]
        info = sched.query(job_name, [job_id]).get(job_id)
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
