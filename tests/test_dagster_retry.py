"""A retried run whose supervisor died elects a running worker allocation.

As a user meets it: the run's Dagster process (here a subprocess running
``execute_job`` on a persistent instance) dies while its payload commits
work, and the head's allocation is gone too. The user marks the run failed
and re-executes it. The retry finds the session by the root run id, elects
the still running worker allocation as its head when the session is opened
(no new allocation submitted), and the payload finishes the remaining units.
Local scheduler, real agents, real Ray, real Dagster.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import dagster
import pytest

from elastic_ray.coordinator.session import Session
from tests.dagster_helpers import all_jobs_final, session_root_fixture  # noqa: F401 - fixture "session_root"
from tests.dagster_retry_defs import FAILOVER, HEAD_AT_OPEN, JOB_NAME, define_retry_job
from tests.helpers import committed_units, wait_until

pytestmark = [pytest.mark.dagster, pytest.mark.ray, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parent.parent

FIRST_RUN = """
import json, sys
from dagster import DagsterInstance, execute_job, reconstructable
from tests.dagster_retry_defs import define_retry_job
with DagsterInstance.get() as instance:
    execute_job(reconstructable(define_retry_job), instance=instance, run_config=json.loads(sys.argv[1]))
"""


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


@pytest.fixture(name="dagster_home")
def dagster_home_fixture(tmp_path, monkeypatch):
    """A persistent Dagster instance both processes share (sqlite in a temp DAGSTER_HOME)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return home


def test_retried_run_whose_supervisor_died_elects_the_running_worker(session_root, dagster_home, tmp_path):
    commits, pids, log = tmp_path / "commits.txt", tmp_path / "pids.txt", tmp_path / "first-run.log"
    total = 16
    run_config = {"ops": {"retried": {"config": {"commits": str(commits), "total": total, "pids": str(pids)}}}}

    # Run 1 in a process of its own, as a run worker would.
    with log.open("w") as out:
        first = subprocess.Popen([sys.executable, "-c", FIRST_RUN, json.dumps(run_config)], cwd=ROOT,
                                 stdout=out, stderr=subprocess.STDOUT)
    driver_killed = False
    try:
        # Ready once its payload committed some units (so the worker joined).
        wait_until(lambda: first.poll() is not None or (len(committed_units(commits)) >= 4 and pids.exists()),
                   timeout=180, message="the first run's payload committing")
        assert first.poll() is None, f"the first run ended early:\n{tail(log)}"
        first_driver = int(pids.read_text().split()[0])

        with dagster.DagsterInstance.get() as instance:
            [run] = instance.get_runs()
            path = session_root / run.run_id
            session = Session.open(path, supervise=False)
            try:
                before = session.record()
                [worker] = before.workers
                head = before.head_job
                assert head is not None and head != worker

                # The supervisor dies (with the host its driver ran on), and
                # the head's allocation is gone too.
                kill(first.pid)
                first.wait()
                kill(first_driver)
                driver_killed = True
                session.scheduler.cancel(head)
                wait_until(lambda: session.job_info(head).state.is_final, timeout=60,
                           message=f"head {head} ending after cancel")
                assert session.job_info(worker).state.value == "RUNNING"
                done_before = len(committed_units(commits))

                # Dagster saw the run start and never end: the user marks it
                # failed, then re-executes it from failure.
                instance.report_run_failed(instance.get_run_by_id(run.run_id), message="run worker killed")
                with dagster.execute_job(
                        dagster.reconstructable(define_retry_job), instance=instance,
                        reexecution_options=dagster.ReexecutionOptions.from_failure(run.run_id, instance)) as result:
                    assert result.success, f"retried run failed; first run's log:\n{tail(log)}"
                    retry = instance.get_run_by_id(result.run_id)
                    materializations = result.asset_materializations_for_node("retried")
                messages = [entry.user_message for entry in instance.all_logs(result.run_id)]
                after = session.record()
                jobs = session.scheduler.query(session.job_name)
            finally:
                session.close()

        assert retry.job_name == JOB_NAME and retry.root_run_id == run.run_id != retry.run_id
        assert [p.name for p in session_root.iterdir() if (p / "session.json").is_file()] == [run.run_id], \
            "the retry opened the first run's session, and made no other"
        # The running worker allocation took the head over when the retry
        # opened the session, before any launch: no failover in the asset,
        # and no new allocation.
        assert f"{HEAD_AT_OPEN}{worker}" in messages, [m for m in messages if HEAD_AT_OPEN in m]
        assert not [m for m in messages if FAILOVER in m]
        assert after.head_job == worker and head in after.predecessors, after
        assert sorted(jobs, key=int) == sorted([head, worker], key=int), f"jobs submitted: {sorted(jobs)}"
        meta = {k: v.value for k, v in materializations[-1].metadata.items()}
        assert meta["elastic_ray/head_job"] == worker, meta
        # Every unit once, across both runs.
        assert sorted(committed_units(commits)) == list(range(total)), "every unit committed exactly once"
        assert meta["already_committed"] == done_before and meta["committed_now"] == total - done_before, meta
        # The retried run ran in this process (in-process executor): its end
        # tore the session down, jobs of the killed run included.
        wait_until(lambda: all_jobs_final(session_root), timeout=60, message="run's jobs ended")
    finally:
        if first.poll() is None:
            kill(first.pid)
            first.wait()
        if not driver_killed and pids.exists():   # the test failed before it killed the driver
            kill(int(pids.read_text().split()[0]))
