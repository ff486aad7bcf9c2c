"""How a failed payload driver's step ended (issue 25): found by its step name in
Slurm's accounting, told in ``PayloadFailed`` and shown by ``session status``.
Pure decisions by table; the real OOM kill is ``integration/test_limits_slurm.py``."""

from __future__ import annotations

import pytest

from elastic_ray.cli.status_model import driver_oom_steps
from elastic_ray.cli.status_view import oom_text
from elastic_ray.coordinator.drivers import driver_argv, oom_step
from elastic_ray.errors import PayloadFailed
from elastic_ray.protocol.disk.events import Event, EventKind, EventSource
from elastic_ray.scheduler.base import JobState
from elastic_ray.scheduler.slurm_parse import parse_step_states

# sacct -n -P --format=JobID,State,JobName -j 10, as the enforcing lab printed it (plus what else may come).
SACCT = """\
10|RUNNING|wrap
10.batch|RUNNING|batch
10.extern|RUNNING|extern
10.0|RUNNING|elastic-agent
10.1|OUT_OF_MEMORY|er-driver-ab12cd34
10.2|COMPLETED|er-driver-ffff0000
10.3|CANCELLED by 0|er-driver-ab12cd34
11.1|OUT_OF_MEMORY|er-driver-ab12cd34
10.4|FAILED|name|with|bars
"""


@pytest.mark.parametrize("name, expected", [
    ("er-driver-ab12cd34", {"10.1": JobState.OUT_OF_MEMORY, "10.3": JobState.CANCELLED}),
    ("er-driver-ffff0000", {"10.2": JobState.COMPLETED}),
    ("name|with|bars", {"10.4": JobState.FAILED}),
    ("batch", {}),          # the batch and extern steps are never a driver's
    ("wrap", {}),           # nor the job's own line
    ("er-driver-00000000", {}),
])
def test_a_driver_s_steps_are_found_by_name_in_its_own_job_only(name, expected):
    assert parse_step_states(SACCT, "10", name) == expected


def test_an_unreadable_sacct_line_is_an_error_not_a_guess():
    with pytest.raises(ValueError, match="fields from sacct"):
        parse_step_states("10.1|RUNNING\n", "10", "x")


@pytest.mark.parametrize("states, expected", [
    (None, None),
    ({}, None),
    ({"10.1": JobState.FAILED}, None),
    ({"10.2": JobState.OUT_OF_MEMORY, "10.1": JobState.COMPLETED}, "10.2"),
    ({"10.3": JobState.OUT_OF_MEMORY, "10.2": JobState.OUT_OF_MEMORY}, "10.2"),
])
def test_the_oom_step_among_a_driver_s_steps(states, expected):
    assert oom_step(states) == expected


def test_the_slurm_driver_step_carries_its_name_and_the_local_one_runs_as_is():
    argv = driver_argv("slurm", "10", ["python", "x.py"], "er-driver-ab12cd34")
    assert argv[:2] == ["srun", "--jobid=10"] and "--job-name=er-driver-ab12cd34" in argv
    assert argv[-2:] == ["python", "x.py"] and argv.index("--job-name=er-driver-ab12cd34") < argv.index("python")
    assert not any(a.startswith("--job-name") for a in driver_argv("slurm", "10", ["python"]))
    assert driver_argv("local", "10", ["python"], "er-driver-x")[-1] == "python"


@pytest.mark.parametrize("kwargs, says", [
    ({}, "payload 'python x.py' exited with 1"),
    ({"step_state": "OUT_OF_MEMORY", "step": "10.1"},
     "payload 'python x.py' exited with 1: the OOM killer ended it (its step 10.1 went over the head "
     "allocation's memory grant; Slurm says OUT_OF_MEMORY)"),
    ({"step_state": "FAILED", "step": "10.4"}, "payload 'python x.py' exited with 1 (its step 10.4 ended FAILED)"),
])
def test_payload_failed_says_how_the_step_ended(kwargs, says):
    exc = PayloadFailed(1, ["python", "x.py"], **kwargs)
    assert str(exc) == says and exc.returncode == 1 and exc.step_state == kwargs.get("step_state")


def test_status_takes_the_coordinator_s_oom_events_by_head_job():
    events = [
        Event(1.0, EventKind.OOM_KILLED, EventSource.COORDINATOR, job="10", details={"step": "10.1"}),
        Event(2.0, EventKind.OOM_KILLED, EventSource.AGENT, job="10", details={"kills": 1, "new": 1}),  # counted by nodes
        Event(3.0, EventKind.PAYLOAD_FINISHED, EventSource.COORDINATOR, job="10"),
        Event(4.0, EventKind.OOM_KILLED, EventSource.COORDINATOR, job="12", details={"step": "12.4"}),
        Event(5.0, EventKind.OOM_KILLED, EventSource.COORDINATOR, job="10", details={"step": "10.3"}),
    ]
    assert driver_oom_steps(events) == {"10": ["10.1", "10.3"], "12": ["12.4"]}


@pytest.mark.parametrize("counts, state, steps, expected", [
    ([None], "RUNNING", ["10.1"], "payload driver step 10.1 ended OUT_OF_MEMORY (over the grant; OOM killer)"),
    ([None], "RUNNING", ["10.1", "10.3"],
     "payload driver steps 10.1, 10.3 ended OUT_OF_MEMORY (over the grant; OOM killer)"),
    ([2], "RUNNING", ["10.1"], "OOM killer ended 2 processes of this job (over its memory grant); "
                               "payload driver step 10.1 ended OUT_OF_MEMORY (over the grant; OOM killer)"),
    ([None], "RUNNING", [], ""),
])
def test_the_status_note_names_the_driver_steps(counts, state, steps, expected):
    assert oom_text([{"oom_kills": c} for c in counts], state, steps) == expected
