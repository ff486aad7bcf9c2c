"""Payload drivers: the user's program, run next to the head.

A driver is launched as a step of the head allocation (``srun --jobid=<head>
--overlap``) on Slurm, or as a local process on the local scheduler, with
``RAY_ADDRESS`` pointing at the head. While it runs, its head is watched:

* the head job ends, or the session moves the head elsewhere: the driver is
  stopped and ``wait`` raises ``SlurmAllocationEnded`` (``allocation_state``
  is the job's final state, or ``REPLACED``), even when the step reported an
  exit code first, because an exit caused by a lost head is not the
  program's own verdict;
* the ``ray_head`` pointer and the heartbeat are read every half second;
  Slurm is looked at every few seconds through the session's shared answer
  (at most ``WATCH_MAX_AGE`` old, so the drivers and waits of a run cost
  one query per that period together), and asked afresh once the driver
  exited, so its exit is judged on the truth;
* Slurm does not answer for a while (slurmctld restarting): the driver keeps
  running on the head's heartbeat and the ``ray_head`` pointer, and asks
  again at the next check; a lost head is still noticed from its silence
  once the scheduler answers again;
* the head drains (its pre-walltime signal or ``request_drain``): the driver
  gets SIGTERM so it can stop at a checkpoint, and ``wait`` raises
  ``SlurmStepDrained``, also when the hand-over moved the head before the
  driver's exit was seen (the old head still runs, or completed: a planned
  hand-over, not a lost head).
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .. import knobs
from ..config.slurm_values import parse_signal
# Defined in errors (its docstring says why); ``X as X`` keeps it importable from here, for type checkers too.
from ..errors import PayloadFailed as PayloadFailed
from ..errors import ElasticRayError, SlurmAllocationEnded, SlurmStepDrained
from ..polling import wait_for
from ..protocol.disk import event_log
from ..protocol.disk.events import EventKind, EventSource
from ..protocol.disk.records import AgentState, NodeState
from ..ray_auth import apply_auth_env
from ..scheduler.base import JobState
from .allocations.pacing import watch_max_age
from .head.headwatch import HeadObservation
from .ports import DriverSession, HeadRef

log = logging.getLogger("elastic_ray.coordinator")

CHECK_INTERVAL = 0.5
SCHEDULER_CHECK_INTERVAL = 2.0
STOP_GRACE = 10.0
# A head in doubt (draining, or silent): a fresh scheduler answer at most this often (s).
FRESH_CHECK_EVERY = 10.0
# A driver whose head's job ended: nothing left to finish (its head is gone), so a short grace.
LOST_HEAD_GRACE = 0.2
# Slurm sends a step's --signal=SIG@N up to its 30 s timer early; with some slack.
SIGNAL_EARLY = 35.0
# A driver that ended inside that window: how long to listen for the head's
# heartbeat to say it drains (its agent asks the scheduler why it got the signal).
DRAIN_NEWS_WAIT = 5.0
DRAIN_NEWS_STEP = 0.5   # between two looks at the heartbeat and the node file
# A failed driver's step: how long accounting may take to list how it ended (slurmdbd hears a moment later).
STEP_END_WAIT = 5.0


@dataclass(frozen=True)
class RunResult:
    returncode: int
    head_job: str
    seconds: float


def driver_environ(inherited: Mapping[str, str], caller: Mapping[str, str], *, keepalive: Mapping[str, str],
                   auth: Mapping[str, str], fixed: Mapping[str, str]) -> dict[str, str]:
    """Pure: a payload driver's environment, layer by layer.

    The run's keepalive (``RayLauncher.keepalive_env``) first: the caller's
    environment and ``env`` win over it. The run's auth settings win over
    the caller's (a driver with another mode or token would be refused by
    the head, or a stale RAY_AUTH_TOKEN would shadow the session's token
    file), and ``fixed`` (the head's address, the session) over everything.
    """
    out = {**keepalive, **inherited, **caller}
    apply_auth_env(out, auth)
    out.update(fixed)
    return out


def driver_argv(kind: str, head_job: str, argv: Sequence[str], step_name: str | None = None) -> list[str]:
    """Pure: how a driver is started for each scheduler kind."""
    if kind == "slurm":
        # One task on the head allocation's first node, sharing its CPUs with
        # the agent (--overlap); killed if the step's task dies. The step's
        # own name is how its end is found in accounting afterwards.
        named = [f"--job-name={step_name}"] if step_name else []
        return ["srun", f"--jobid={head_job}", "--overlap", "--nodes=1", "--ntasks=1", "--quiet",
                "--kill-on-bad-exit=1", *named, *argv]
    # Started from the caller's process: through clean_exec, so a SIGTERM its parent left ignored
    # (Dagster's step handlers can) does not keep the driver from stopping when asked.
    return [sys.executable, "-m", "elastic_ray.clean_exec", *argv]


def oom_step(states: Mapping[str, JobState] | None) -> str | None:
    """Pure: the id of a step that ended OUT_OF_MEMORY among a driver's steps' states, or None."""
    return next((step for step, state in sorted((states or {}).items()) if state is JobState.OUT_OF_MEMORY), None)


def drained_head_handed_over(gone: str, head_state: JobState | None) -> bool:
    """Pure: a driver stopped for a drain, and its head is no longer its
    head (``gone``): was that the planned hand-over, or is the head lost?

    A draining head stays RUNNING until the session has moved the head
    (``REPLACED``), and ends COMPLETED after. A cancel or a node failure
    also looks like a drain at first (the agent gets SIGTERM), but there the
    job is already ending (COMPLETING, CANCELLED, ...) when the driver stops:
    that is a lost head, whatever the election did meanwhile.
    """
    return gone == "REPLACED" and head_state in (JobState.RUNNING, JobState.COMPLETED)


def head_in_doubt(obs: HeadObservation, head_job: str, seen_alive: bool) -> bool:
    """Pure: does the heartbeat of a driver's head (``obs``) give a reason to
    ask the scheduler now whether its job ended? It drains (a cancelled
    head's agent drains on its SIGTERM), or went silent after it was heard
    (a killed one); a head never heard yet (no beat so far) is no news."""
    return obs.job == head_job and (obs.draining or (seen_alive and not obs.alive))


def head_drained_since(states: Iterable[NodeState], since: float) -> bool:
    """Pure: did the head's agent go DRAINING at or after ``since``? Its node
    file says so while it drains, and its published transitions once it left
    (a hand-over can be over before a driver looks)."""
    return any(state.state is AgentState.DRAINING
               or any(t.to_state is AgentState.DRAINING and t.at >= since for t in state.transitions)
               for state in states)


def in_signal_window(signal_before_timeout: str | None, end_time: float | None, now: float) -> bool:
    """Pure: could the pre-walltime signal of the head's allocation have come by now?

    On Slurm a driver is a step of the head's allocation, so that signal
    reaches the driver itself, as it reaches the head's agent. A driver that
    stops at a checkpoint on it may exit before the head's heartbeat says it
    drains; inside this window its exit is taken for the drain it is.
    """
    if signal_before_timeout is None or end_time is None:
        return False
    return now >= end_time - parse_signal(signal_before_timeout).seconds - SIGNAL_EARLY


class PayloadRun:
    """A running driver. Create with :meth:`Session.run`."""

    def __init__(self, session: DriverSession, head: HeadRef, argv: Sequence[str],
                 env: Mapping[str, str] | None = None, stdout=None, stderr=None):
        self.session = session
        self.head = head
        self.argv = list(argv)
        full_env = driver_environ(os.environ, env or {}, keepalive=session.launcher.keepalive_env(),
                                  auth=session.ray_client_env(), fixed={
                                      "RAY_ADDRESS": head.address, knobs.SESSION.name: str(session.path),
                                      knobs.HEAD_JOB.name: head.job_id, "RAY_USAGE_STATS_ENABLED": "0"})
        self.started = time.time()
        self.step_name = f"er-driver-{secrets.token_hex(4)}"
        self.proc = subprocess.Popen(driver_argv(session.info.scheduler["kind"], head.job_id, self.argv,
                                                 self.step_name),
                                     env=full_env, stdout=stdout, stderr=stderr, start_new_session=True)
        self._drained = False
        self._signal = self._head_signal()
        log.info("event=driver_started session=%s head=%s pid=%s", session.job_name, head.job_id, self.proc.pid)
        self._ended = False
        event_log.emit(session.path, EventKind.PAYLOAD_STARTED, EventSource.COORDINATOR, job=head.job_id,
                       name=os.path.basename(self.argv[0]) if self.argv else None, pid=self.proc.pid)

    def _report_end(self, outcome: str, rc: int | None) -> None:
        """``payload_finished`` once: ``outcome`` is ``ok`` or the error's type."""
        if not self._ended:
            self._ended = True
            event_log.emit(self.session.path, EventKind.PAYLOAD_FINISHED, EventSource.COORDINATOR,
                           job=self.head.job_id, reason=outcome, ok=outcome == "ok", exit_code=rc,
                           seconds=round(time.time() - self.started, 3), pid=self.proc.pid)

    def _head_signal(self) -> str | None:
        """The ``signal_before_timeout`` of the allocation that hosts this driver's head."""
        worker = self.session.record().workers.get(self.head.job_id)
        config = worker.config if worker is not None else self.session.info.head
        return config.get("signal_before_timeout")

    def _moved_by_a_drain(self) -> bool:
        """The driver ended or its head moved; did the head drain (Slurm's
        pre-walltime signal, the head's own drain ahead of its walltime, a
        removal) rather than end?"""
        drained = self._head_drained()   # a file read: a driver that just finished asks no scheduler
        if not drained and self._signal is None:
            return False
        info = self.session.job_info(self.head.job_id, unreachable_ok=True)
        if info is None or info.state is not JobState.RUNNING:
            return False  # the allocation is ending: not a hand-over
        if drained:
            return True
        if self._signal is None or not in_signal_window(self._signal, info.end_time, time.time()):
            return False
        # Draining, or already handed over (an election can be quicker than
        # our look): either way the head moves because of its signal. The
        # head agent's node file says DRAINING before it answers anything, so
        # it is read too: the heartbeat that says so can come up to a beat
        # later, and one that is lost or late must not turn a drain into a
        # payload that seems to have finished.
        deadline = time.monotonic() + DRAIN_NEWS_WAIT
        while True:
            obs = self.session.observe_head(wait=DRAIN_NEWS_STEP)
            if obs.job != self.head.job_id or obs.draining or self._head_drained():
                return True
            if time.monotonic() >= deadline:
                return False

    def _head_drained(self) -> bool:
        return head_drained_since(self.session.node_states(self.head.job_id).values(), self.started)

    def stop(self, grace: float = STOP_GRACE) -> None:
        """Stop the driver now (SIGTERM to its process group, SIGKILL after ``grace`` s)."""
        if self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def _moved(self) -> str | None:
        """"REPLACED" once ``ray_head`` names another head (a file read, no scheduler)."""
        pointer = self.session.head_pointer()
        return "REPLACED" if pointer is not None and pointer != self.head.job_id else None

    def _head_gone(self, max_age: float = 0.0) -> str | None:
        """The reason the head is no longer this driver's, or None; the
        scheduler's answer may be ``max_age`` s old (the shared one)."""
        if (moved := self._moved()) is not None:
            return moved
        info = self.session.job_info(self.head.job_id, unreachable_ok=True, max_age=max_age)
        if info is not None and (info.state.is_final or info.state.value == "COMPLETING"):
            return info.state.value
        return None

    def _handed_over(self, gone: str) -> bool:
        """Whether the head this driver was drained from moved on as planned."""
        info = self.session.job_info(self.head.job_id, unreachable_ok=True)
        return drained_head_handed_over(gone, info.state if info is not None else None)

    def _step_drained(self, rc: int | None, head_state: str | None) -> SlurmStepDrained:
        after = f"; the head is now {head_state}" if head_state else ""
        return SlurmStepDrained(f"the head {self.head.job_id} drains; the driver stopped "
                                f"(exit {self.proc.returncode if rc is None else rc}){after}",
                                job_id=self.head.job_id)

    def _step_end(self) -> tuple[str, str] | None:
        """How the driver's step ended, from the scheduler's accounting: (step id, state), or None
        (no accounting, not listed within a few seconds, or an answer that cannot be had)."""
        if self.session.info.scheduler["kind"] != "slurm":
            return None

        try:
            # Done once the step's end is listed, or accounting is off (None); a timeout is None too.
            states = wait_for(lambda: self.session.scheduler.step_states(self.head.job_id, self.step_name),
                              done=lambda found: found is None or any(s.is_final for s in found.values()),
                              timeout=STEP_END_WAIT, interval=CHECK_INTERVAL, raising=False)
        except ElasticRayError as exc:
            log.warning("event=driver_step_unknown session=%s head=%s error=%r", self.session.job_name,
                        self.head.job_id, str(exc)[:200])
            return None
        if (step := oom_step(states)) is not None:
            return step, JobState.OUT_OF_MEMORY.value
        final = sorted((step, state.value) for step, state in (states or {}).items() if state.is_final)
        return final[-1] if final else None

    def _failed(self, rc: int) -> PayloadFailed:
        """The error for a driver that exited ``rc`` != 0, with how its step ended where known; the
        OOM killer's part goes to the event log too (``session status`` shows it on the head's row)."""
        ended = self._step_end()
        if ended is None:
            return PayloadFailed(rc, self.argv)
        step, state = ended
        if state == JobState.OUT_OF_MEMORY.value:
            log.warning("event=driver_oom_killed session=%s head=%s step=%s", self.session.job_name,
                        self.head.job_id, step)
            event_log.emit(self.session.path, EventKind.OOM_KILLED, EventSource.COORDINATOR, job=self.head.job_id,
                           step=step, name=os.path.basename(self.argv[0]) if self.argv else None)
        return PayloadFailed(rc, self.argv, step_state=state, step=step)

    def wait(self, timeout: float | None = None) -> RunResult:
        next_scheduler_check = 0.0
        next_fresh_check = 0.0
        seen_alive = False

        def finished() -> RunResult | None:
            nonlocal next_scheduler_check, next_fresh_check, seen_alive
            rc = self.proc.poll()
            now = time.monotonic()
            gone = self._moved()
            # The head's heartbeat stopped or says it drains (a cancel's SIGTERM
            # drains it too): ask the scheduler afresh now, not at the next paced
            # look, so a lost head ends the wait before its driver's step does.
            obs = self.session.observe_head() if gone is None and rc is None else None
            suspect = obs is not None and head_in_doubt(obs, self.head.job_id, seen_alive) and now >= next_fresh_check
            seen_alive = seen_alive or (obs is not None and obs.job == self.head.job_id and obs.alive)
            if gone is None and (rc is not None or suspect or now >= next_scheduler_check):
                next_scheduler_check = now + SCHEDULER_CHECK_INTERVAL
                if suspect:
                    next_fresh_check = now + FRESH_CHECK_EVERY
                # An exit or a silent head is judged on a fresh answer; a running driver's watch
                # takes the shared one.
                gone = self._head_gone(0.0 if rc is not None or suspect else watch_max_age())
            # The driver ended, or its head moved before we saw it drain (a
            # quick election can pass between two checks): did the head drain?
            # (A head whose job ends is lost, not drained: no need to ask.)
            if (rc is not None or gone is not None) and gone in (None, "REPLACED") and not self._drained \
                    and self._moved_by_a_drain():
                self._drained = True
                log.info("event=driver_signalled session=%s head=%s reason=head_drained",
                         self.session.job_name, self.head.job_id)
            if gone is not None:
                stop_from = time.monotonic()
                self.stop(STOP_GRACE if gone == "REPLACED" else LOST_HEAD_GRACE)
                log.info("event=driver_head_gone session=%s head=%s state=%s seen=%s stopped_in=%.2fs",
                         self.session.job_name, self.head.job_id, gone,
                         "exit" if rc is not None else "heartbeat" if suspect else "look",
                         time.monotonic() - stop_from)
                if self._drained and self._handed_over(gone):
                    raise self._step_drained(rc, gone)
                raise SlurmAllocationEnded(
                    f"the head allocation {self.head.job_id} of this driver is {gone}; "
                    f"call replace_head() and launch again", allocation_state=gone, job_id=self.head.job_id)
            if not self._drained:
                obs = obs or self.session.observe_head()
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
            if self._drained:
                raise self._step_drained(rc, None)
            if rc != 0:
                raise self._failed(rc)
            return RunResult(rc, self.head.job_id, time.time() - self.started)

        try:
            result = wait_for(finished, timeout=timeout, interval=CHECK_INTERVAL, raising=False)
        except Exception as exc:
            self._report_end(type(exc).__name__, self.proc.returncode)
            raise
        if result is None:
            self.stop()
            self._report_end("TimeoutError", self.proc.returncode)
            raise TimeoutError(f"driver still running after {timeout:.0f}s; stopped it")
        self._report_end("ok", result.returncode)
        return result
