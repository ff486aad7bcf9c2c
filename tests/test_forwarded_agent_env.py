"""The agents' ELASTIC_AGENT_* settings are the session's, not the submitting process's.

``Session.create`` records the creating process's ``ELASTIC_AGENT_*``
variables in session.json; every later submission, from any process, puts
those on its nodes. Sessions made before the record existed forward the
submitting process's own, as they always did. Nothing runs: the scheduler
records the job specs, and their batch scripts are rendered as sbatch
would get them.
"""

from __future__ import annotations

import json
import os

import pytest

from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.allocations import submit
from elastic_ray.coordinator.session import Session
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.scheduler.base import Scheduler
from elastic_ray.scheduler.render import render_batch_script

HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="60")
WORKER = SlurmWorkerAllocationConfig(partition="cpu", num_nodes=1)
TUNED = {"ELASTIC_AGENT_POLL_INTERVAL": "0.5", "ELASTIC_AGENT_REJOIN_ORDER": "all"}


class _RecordingScheduler(Scheduler):
    """Accepts submissions and runs nothing."""

    kind = "local"

    def __init__(self, state_dir):
        self.state_dir = state_dir
        self.submitted: list = []

    def submit(self, spec):
        self.submitted.append(spec)
        return str(100 + len(self.submitted))

    def query(self, job_name, job_ids=(), *, user=None):
        return {}

    def cancel(self, job_id):
        pass

    def cancel_by_name(self, job_name, *, user=None):
        pass

    def signal(self, job_id, signal_name, *, batch=False):
        pass

    def test_only(self, spec):
        return 0.0


def _exports(spec, prefix: str = "export ELASTIC_AGENT_") -> list[str]:
    """The batch script's export lines (the agents' ones by default), as sbatch would get them."""
    return [line for line in render_batch_script(spec).splitlines() if line.startswith(prefix)]


@pytest.fixture
def agent_env(monkeypatch):
    for name in [n for n in os.environ if n.startswith("ELASTIC_AGENT_")]:
        monkeypatch.delenv(name)
    for name, value in TUNED.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_session_json_records_the_creators_agent_settings(tmp_path, agent_env):
    s = Session.create(tmp_path / "s", head=HEAD, scheduler=_RecordingScheduler(tmp_path / "state"), supervise=False)
    s.close()
    assert json.loads((tmp_path / "s" / "session.json").read_text())["agent_env"] == TUNED
    assert _exports(s.scheduler.submitted[0]) == [
        "export ELASTIC_AGENT_POLL_INTERVAL=0.5", "export ELASTIC_AGENT_REJOIN_ORDER=all"]


def _worker_from_the_creator(tmp_path):
    first = Session.create(tmp_path / "s", head=HEAD, scheduler=_RecordingScheduler(tmp_path / "state"),
                           supervise=False)
    first.add_worker_allocation(WORKER)
    first.close()
    return first.scheduler.submitted[-1]


def _worker_from_a_second_session(tmp_path):
    second = Session.open(tmp_path / "s", _RecordingScheduler(tmp_path / "state"), supervise=False)
    second.add_worker_allocation(WORKER)
    second.close()
    return second.scheduler.submitted[-1]


def test_a_second_session_on_the_directory_renders_the_same_settings(tmp_path, agent_env):
    before = _worker_from_the_creator(tmp_path)
    for name in TUNED:          # another process, without the creator's variables
        agent_env.delenv(name)
    after = _worker_from_a_second_session(tmp_path)
    assert _exports(after, "export ") == _exports(before, "export ") and dict(after.env) == dict(before.env)
    assert _exports(after) == ["export ELASTIC_AGENT_POLL_INTERVAL=0.5", "export ELASTIC_AGENT_REJOIN_ORDER=all"]


def test_a_second_sessions_own_settings_do_not_reach_the_nodes(tmp_path, agent_env):
    """sbatch would pass them on with the submitter's environment: they are exported blank (unset)."""
    before = _worker_from_the_creator(tmp_path)
    agent_env.setenv("ELASTIC_AGENT_POLL_INTERVAL", "5")     # another value of a recorded one
    agent_env.setenv("ELASTIC_AGENT_BACKOFF_BASE", "9")      # one the creator did not have
    after = _worker_from_a_second_session(tmp_path)
    assert _exports(after) == ["export ELASTIC_AGENT_BACKOFF_BASE=''", "export ELASTIC_AGENT_POLL_INTERVAL=0.5",
                               "export ELASTIC_AGENT_REJOIN_ORDER=all"]
    assert {k: v for k, v in after.env.items() if v} == dict(before.env)


def test_a_session_created_with_no_settings_forwards_none_later(tmp_path, agent_env):
    for name in TUNED:
        agent_env.delenv(name)
    s = Session.create(tmp_path / "s", head=HEAD, scheduler=_RecordingScheduler(tmp_path / "state"), supervise=False)
    s.close()
    assert json.loads((tmp_path / "s" / "session.json").read_text())["agent_env"] == {}
    agent_env.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.1")
    later = Session.open(tmp_path / "s", _RecordingScheduler(tmp_path / "state"), supervise=False)
    later.add_worker_allocation(WORKER)
    later.close()
    assert _exports(later.scheduler.submitted[-1]) == ["export ELASTIC_AGENT_POLL_INTERVAL=''"]


def test_an_older_session_without_the_record_forwards_the_submitters_own(tmp_path, agent_env):
    s = Session.create(tmp_path / "s", head=HEAD, scheduler=_RecordingScheduler(tmp_path / "state"), supervise=False)
    s.close()
    path = tmp_path / "s" / "session.json"
    data = json.loads(path.read_text())
    del data["agent_env"]                       # as an older elastic-ray wrote it
    path.write_text(json.dumps(data))
    agent_env.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.25")
    later = Session.open(tmp_path / "s", _RecordingScheduler(tmp_path / "state"), supervise=False)
    assert later.info.agent_env is None
    later.add_worker_allocation(WORKER)
    later.close()
    assert _exports(later.scheduler.submitted[-1]) == [
        "export ELASTIC_AGENT_POLL_INTERVAL=0.25", "export ELASTIC_AGENT_REJOIN_ORDER=all"]


def test_the_job_env_is_the_launchers_then_the_recorded_settings():
    launcher = RayLauncher(env={"ELASTIC_AGENT_START_TIMEOUT": "90", "OMP_NUM_THREADS": "1"})
    mine = {"ELASTIC_AGENT_START_TIMEOUT": "5", "ELASTIC_AGENT_SLURMD_CHECK": "0", "HOME": "/home/x"}
    # A session created before the record: this process's own win over the launcher's, as before.
    assert submit.agent_env(launcher, None, mine) == {"ELASTIC_AGENT_START_TIMEOUT": "5", "OMP_NUM_THREADS": "1",
                                                      "ELASTIC_AGENT_SLURMD_CHECK": "0"}
    # Recorded: the record wins; this process's own are blanked, unless the launcher sets them.
    assert submit.agent_env(launcher, {"ELASTIC_AGENT_POLL_INTERVAL": "0.5"}, mine) == {
        "ELASTIC_AGENT_START_TIMEOUT": "90", "OMP_NUM_THREADS": "1", "ELASTIC_AGENT_SLURMD_CHECK": "",
        "ELASTIC_AGENT_POLL_INTERVAL": "0.5"}


def _info(**extra) -> SessionInfo:
    return SessionInfo(session_id="s1", job_name="er-x", created_at=1.0, scheduler={"kind": "slurm"},
                       head={"partition": "cpu"}, **extra)


def test_the_record_round_trips_and_stays_optional():
    assert "agent_env" not in _info().to_dict()
    assert SessionInfo.from_dict(_info().to_dict()).agent_env is None
    tuned = _info(agent_env=TUNED)
    assert tuned.to_dict()["agent_env"] == TUNED
    assert dict(SessionInfo.from_dict(tuned.to_dict()).agent_env) == TUNED


@pytest.mark.parametrize("bad", [{"PATH": "/bin"}, {"ELASTIC_AGENT_X": 1}, ["ELASTIC_AGENT_X"]])
def test_a_malformed_record_is_refused(bad):
    data = _info().to_dict()
    data["agent_env"] = bad
    with pytest.raises(ValueError, match="agent_env"):
        SessionInfo.from_dict(data)
