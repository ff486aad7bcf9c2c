"""Payload drivers: the user's program, run next to the head.

A driver is launched as a step of the head allocation (``srun --jobid=<head>
--overlap``) on Slurm, or as a local process on the local scheduler, with
``RAY_ADDRESS`` pointing at the head. While it runs, its head is watched:

* the head job ends, or the session moves the head elsewhere: the driver is
  stopped and ``wait`` raises ``SlurmAllocationEnded`` (``allocation_state``
  is the job's final state, or ``REPLACED``), even when the step reported an
  exit code first, because an exit caused by a lost head is not the
  program's own verdict;
* the head drains (its pre-walltime signal or ``request_drain``): the driver
  gets SIGTERM so it can stop at a checkpoint, and ``wait`` raises
  ``SlurmStepDrained``.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import ElasticRayError, SlurmAllocationEnded, SlurmStepDrained
from ..polling import wait_for
from .ports import DriverSession, HeadRef

log = logging.getLogger("elastic_ray.coordinator")

CHECK_INTERVAL = 0.5
SCHEDULER_CHECK_INTERVAL = 2.0
STOP_GRACE = 10.0


class PayloadFailed(ElasticRayError):
    """The driver exited non-zero while its head stayed healthy."""

    def __init__(self, returncode: int, argv: Sequence[str]):
        self.returncode = returncode
        super().__init__(f"payload {' '.join(argv)!r} exited with {returncode}")


@dataclass(frozen=True)
class RunResult:
    returncode: int
    head_job: str
    seconds: float


def driver_argv(kind: str, head_job: str, argv: Sequence[str]) -> list[str]:
    """Pure: how a driver is started for each scheduler kind."""
    if kind == "slurm":
        # One task on the head allocation's first node, sharing its CPUs with
        # the agent (--overlap); killed if the step's task dies.
        return ["srun", f"--jobid={head_job}", "--overlap", "--nodes=1", "--ntasks=1", "--quiet",
                "--kill-on-bad-exit=1", *argv]
    return list(argv)


class PayloadRun:
    """A running driver. Create with :meth:`Session.run`."""

    def __init__(self, session: DriverSession, head: HeadRef, argv: Sequence[str],
                 env: Mapping[str, str] | None = None, stdout=None, stderr=None):
        self.session = session
        self.head = head
        self.argv = list(argv)
        full_env = dict(os.environ)
        full_env.update(env or {})
        full_env.update({"RAY_ADDRESS": head.address, "ELASTIC_RAY_SESSION": str(session.path),
                         "ELASTIC_RAY_HEAD_JOB": head.job_id, "RAY_USAGE_STATS_ENABLED": "0"})
        full_env.setdefault("RAY_AUTH_MODE", session.launcher.auth_mode)
        self.started = time.time()
        self.proc = subprocess.Popen(driver_argv(session.info.scheduler["kind"], head.job_id, self.argv),
                                     env=full_env, stdout=stdout, stderr=stderr, start_new_session=True)
        self._drained = False
        log.info("event=driver_started session=%s head=%s pid=%s", session.job_name, head.job_id, self.proc.pid)

    def _stop(self) -> None:
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def _head_gone(self) -> str | None:
        """The reason the head is no longer this driver's, or None."""
        pointer = self.session.head_pointer()
        if pointer is not None and pointer != self.head.job_id:
            return "REPLACED"
        info = self.session.job_info(self.head.job_id)
        if info is not None and (info.state.is_final or info.state.value == "COMPLETING"):
            return info.state.value
        return None

    def wait(self, timeout: float | None = None) -> RunResult:
        next_scheduler_check = 0.0

        def finished() -> RunResult | None:
            nonlocal next_scheduler_check
            rc = self.proc.poll()
            now = time.monotonic()
            if rc is not None and self._drained:
                # It was told to stop at a checkpoint and did: that is a drain,
                # also when the session moved the head before it exited.
                raise SlurmStepDrained(f"the head {self.head.job_id} drains; the driver stopped (exit {rc})")
            if rc is not None or now >= next_scheduler_check:
                next_scheduler_check = now + SCHEDULER_CHECK_INTERVAL
                gone = self._head_gone()
                if gone is not None:
                    self._stop()
                    raise SlurmAllocationEnded(
                        f"the head allocation {self.head.job_id} of this driver is {gone}; "
                        f"call replace_head() and launch again", allocation_state=gone, job_id=self.head.job_id)
            if not self._drained:
                obs = self.session.observe_head()
                if obs.job == self.head.job_id and obs.draining:
                    self._drained = True
                    log.info("event=driver_signalled session=%s head=%s reason=head_draining",
                             self.session.job_name, self.head.job_id)
                    try:
                        os.killpg(self.proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        pass
            if rc is None:
                return None
            if rc != 0:
                raise PayloadFailed(rc, self.argv)
            return RunResult(rc, self.head.job_id, time.time() - self.started)

        result = wait_for(finished, timeout=timeout, interval=CHECK_INTERVAL, raising=False)
        if result is None:
            self._stop()
            raise TimeoutError(f"driver still running after {timeout:.0f}s; stopped it")
        return result
