"""What a payload driver's ``wait`` raises when its head drains and the hand-over is quick.

A draining head gets its drivers SIGTERM; the session meanwhile elects the
next head and moves the ``ray_head`` pointer. When the election wins the
race against the driver's exit (a hosted head starts in about a second, a
Ray driver may take as long to stop), the driver still ended because of the
drain: ``wait`` must say ``SlurmStepDrained``, not that the head was lost.
A cancelled head looks like a drain at first too (its agent gets SIGTERM),
but its job is already ending: that stays a lost head. A fake session plays
the head; the driver is a real process.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.drivers import PayloadRun, drained_head_handed_over
from elastic_ray.coordinator.head.headwatch import HeadObservation
from elastic_ray.errors import SlurmAllocationEnded, SlurmStepDrained
from elastic_ray.protocol.disk import event_log
from elastic_ray.protocol.disk.events import EventKind
from elastic_ray.protocol.disk.records import AllocationRecord
from elastic_ray.scheduler.base import JobInfo, JobState
from tests.helpers import node_state, wait_until

# Notes SIGTERM in a file, then takes a moment to exit, as a Ray driver does.
SLOW_TO_STOP = """
import signal, sys, time
def on_term(*_):
    open(sys.argv[1], "w").write("term")
    time.sleep(0.8)
    sys.exit(15)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[2], "w").write("ready")
time.sleep(60)
"""


class FakeSession:
    """Head "1" drains (or not) once the driver is ready; once the driver has
    its SIGTERM, or at once with ``move_at_once``, the session has elected
    head "2", and head "1"'s job is in ``head_state``."""

    def __init__(self, tmp_path: Path, *, draining: bool, move_at_once: bool = False,
                 head_state: JobState = JobState.RUNNING):
        self.path = tmp_path
        self.info = SimpleNamespace(scheduler={"kind": "local"}, head={})  # no pre-walltime signal
        self.launcher = RayLauncher(auth_mode="disabled")
        self.job_name = "er-test"
        self.termed, self.ready = tmp_path / "termed", tmp_path / "ready"
        self.draining = draining
        self.move_at_once = move_at_once
        self.head_state = head_state

    def record(self) -> AllocationRecord:
        return AllocationRecord()

    def ray_client_env(self) -> dict[str, str]:
        return {"RAY_AUTH_MODE": "disabled"}

    def head_pointer(self) -> str:
        return "2" if self.move_at_once or self.termed.exists() else "1"

    def job_info(self, job_id: str, unreachable_ok: bool = False, max_age: float = 0.0) -> JobInfo:
        # Head "1" is in head_state by the time the driver got its SIGTERM.
        ending = job_id == "1" and self.termed.exists()
        return JobInfo(job_id=job_id, name=self.job_name, state=self.head_state if ending else JobState.RUNNING)

    def observe_head(self, wait: float = 0.0) -> HeadObservation:
        job = self.head_pointer()
        return HeadObservation(job=job, address="127.0.0.1:1", alive=True, draining=self.draining and job == "1" and self.ready.exists(),
                               last_beat_age=0.1)

    def node_states(self, job_id: str) -> dict:
        return {}


def start(session: FakeSession) -> PayloadRun:
    head = SimpleNamespace(job_id="1", address="127.0.0.1:1")
    return PayloadRun(session, head, [sys.executable, "-c", SLOW_TO_STOP, str(session.termed),
                                        str(session.ready)])


def test_a_drained_driver_ends_as_step_drained_even_after_the_head_moved(tmp_path):
    session = FakeSession(tmp_path, draining=True)
    run = start(session)
    with pytest.raises(SlurmStepDrained) as drained:
        run.wait(timeout=30)
    assert session.termed.exists(), "the driver got SIGTERM"
    assert drained.value.job_id == "1" and drained.value.allocation_state == "DRAINING"
    # One failover loop covers both: a drain is a kind of allocation end.
    assert isinstance(drained.value, SlurmAllocationEnded)
    # The run's history has the payload's start and its end, with how it ended.
    events = event_log.read(tmp_path).events
    assert [(e.kind, e.job) for e in events] == [(EventKind.PAYLOAD_STARTED, "1"), (EventKind.PAYLOAD_FINISHED, "1")]
    assert events[0].details["pid"] == run.proc.pid and events[0].details["name"] == os.path.basename(sys.executable)
    assert events[1].reason == "SlurmStepDrained" and events[1].details["ok"] is False
    assert 0 < events[1].details["seconds"] < 30


def test_a_cancelled_head_that_looked_like_a_drain_is_a_lost_head(tmp_path):
    # scancel: the job is COMPLETING, its agent gets SIGTERM and says it
    # drains, the driver is signalled, and the session elects meanwhile.
    session = FakeSession(tmp_path, draining=True, head_state=JobState.COMPLETING)
    run = start(session)
    with pytest.raises(SlurmAllocationEnded) as ended:
        run.wait(timeout=30)
    assert session.termed.exists(), "the driver got SIGTERM"
    assert type(ended.value) is SlurmAllocationEnded, "not a drain"
    assert ended.value.allocation_state == "REPLACED" and ended.value.job_id == "1"


@pytest.mark.parametrize(("gone", "state", "handed_over"), [
    ("REPLACED", JobState.RUNNING, True),       # draining head waits for the move
    ("REPLACED", JobState.COMPLETED, True),     # and leaves once it happened
    ("REPLACED", JobState.COMPLETING, False),   # cancelled, or at its walltime
    ("REPLACED", JobState.CANCELLED, False),
    ("REPLACED", None, False),                  # the scheduler does not know it
    ("COMPLETING", JobState.COMPLETING, False),
    ("TIMEOUT", JobState.TIMEOUT, False),
])
def test_drained_head_handed_over(gone, state, handed_over):
    assert drained_head_handed_over(gone, state) is handed_over


def test_a_driver_whose_head_moved_without_a_drain_sees_its_head_replaced(tmp_path):
    run = start(FakeSession(tmp_path, draining=False, move_at_once=True))
    with pytest.raises(SlurmAllocationEnded) as ended:
        run.wait(timeout=30)
    assert type(ended.value) is SlurmAllocationEnded, "not a drain"
    assert ended.value.allocation_state == "REPLACED" and ended.value.job_id == "1"
    assert run.proc.poll() is not None, "the driver was stopped"


class SharedAnswerSession(FakeSession):
    """The shared answer (any ``max_age`` > 0) still says the head runs; asked
    afresh, the scheduler says its job was cancelled meanwhile."""

    def __init__(self, tmp_path: Path):
        super().__init__(tmp_path, draining=False)
        self.ages: list[float] = []

    def job_info(self, job_id: str, unreachable_ok: bool = False, max_age: float = 0.0) -> JobInfo:
        self.ages.append(max_age)
        return JobInfo(job_id=job_id, name=self.job_name,
                       state=JobState.RUNNING if max_age > 0 else JobState.CANCELLED)


def test_a_running_driver_watches_the_shared_answer_and_its_exit_is_judged_on_a_fresh_one(tmp_path):
    session = SharedAnswerSession(tmp_path)
    run = PayloadRun(session, SimpleNamespace(job_id="1", address="127.0.0.1:1"),
                     [sys.executable, "-c", "import time, sys; time.sleep(1.5); sys.exit(1)"])
    with pytest.raises(SlurmAllocationEnded) as ended:
        run.wait(timeout=30)
    assert type(ended.value) is SlurmAllocationEnded and ended.value.allocation_state == "CANCELLED"
    assert session.ages[0] == 10.0, "while it runs, an answer up to 10 s old will do"
    assert session.ages[-1] == 0.0, "its exit is judged on a fresh answer"


class SignalledSession(FakeSession):
    """Head "1" has ``signal_before_timeout=TERM@50`` and is 60 s from its
    walltime: Slurm's warning reaches the driver (a step of the head's job)
    and the head's agent at once. The agent wrote DRAINING in its node file;
    the heartbeat that says so has not come (late, or lost)."""

    def __init__(self, tmp_path: Path, *, node_file_draining: bool):
        super().__init__(tmp_path, draining=False)
        self.info = SimpleNamespace(scheduler={"kind": "local"}, head={"signal_before_timeout": "TERM@50"})
        self.node_file_draining = node_file_draining

    def job_info(self, job_id: str, unreachable_ok: bool = False, max_age: float = 0.0) -> JobInfo:
        return JobInfo(job_id=job_id, name=self.job_name, state=JobState.RUNNING, end_time=time.time() + 60)

    def node_states(self, job_id: str) -> dict:
        state = "DRAINING" if self.node_file_draining and job_id == "1" else "JOINED"
        return {"cpu-1": node_state(job_id, "cpu-1", state, role="head")}


# What a checkpointing payload does on Slurm's warning: it stops cleanly, exit 0.
STOPS_ON_TERM = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\ntime.sleep(0.3)\n"


@pytest.mark.parametrize("node_file_draining, drained", [(True, True), (False, False)])
def test_a_driver_that_stops_on_the_slurm_warning_is_a_drain_when_the_head_s_node_file_says_so(
        tmp_path, node_file_draining, drained):
    session = SignalledSession(tmp_path, node_file_draining=node_file_draining)
    run = PayloadRun(session, SimpleNamespace(job_id="1", address="127.0.0.1:1"),
                     [sys.executable, "-c", STOPS_ON_TERM])
    t0 = time.monotonic()
    if drained:
        with pytest.raises(SlurmStepDrained):
            run.wait(timeout=30)
        assert time.monotonic() - t0 < 3.0, "the node file answers at the first look"
    else:
        # Neither the heartbeat nor the node file says it drains: after the
        # wait for drain news, the exit is the payload's own.
        assert run.wait(timeout=30).returncode == 0


def test_a_driver_stops_on_sigterm_even_when_the_caller_ignores_it(tmp_path):
    """Dagster maps SIGTERM onto SIGINT's handler during a step; where SIGINT is ignored that leaves
    SIGTERM ignored in the caller, and a child would inherit it. The driver starts clean anyway."""
    session = FakeSession(tmp_path, draining=False)
    head = SimpleNamespace(job_id="1", address="127.0.0.1:1")
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        run = PayloadRun(session, head, [sys.executable, "-c", "import time; time.sleep(60)"])
    finally:
        signal.signal(signal.SIGTERM, before)
    try:
        # (the shim's own argv ends the same way: wait for the exec, when "-m" is gone)
        wait_until(lambda: psutil.Process(run.proc.pid).cmdline()[1:2] == ["-c"]
                   or run.proc.poll() is not None, 10, 0.02, "the driver exec'd")
        started = time.monotonic()
        run.stop()
        assert run.proc.returncode == -signal.SIGTERM, "SIGTERM ended it, not the SIGKILL after the grace"
        assert time.monotonic() - started < 2
    finally:
        if run.proc.poll() is None:
            os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait(5)
