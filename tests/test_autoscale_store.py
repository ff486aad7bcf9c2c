"""The autoscaler's files (coordinator/scaling/store.py) and ``Session.autoscale``: real files, no jobs."""

from __future__ import annotations

import time
import uuid

import pytest

from elastic_ray import ConfigError, CorruptFileError, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.autoscale import AutoscalePolicy, Pool
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.scaling import store
from elastic_ray.coordinator.session import Session
from elastic_ray.protocol.disk import event_log, paths
from elastic_ray.protocol.disk.events import EventKind
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir

POLICY = AutoscalePolicy(pools=[Pool(SlurmWorkerAllocationConfig(partition="gpu-b", gpus_per_node=2),
                                     max_allocations=2)], idle_timeout=60)


@pytest.fixture
def session(tmp_path):
    info = SessionInfo(session_id=uuid.uuid4().hex, job_name="er-store", created_at=time.time(),
                       scheduler={"kind": "local", "state_dir": str(tmp_path / "sched")},
                       head=SlurmRunAllocationConfig(partition="cpu").to_dict(), launcher=RayLauncher().to_dict())
    return Session(SessionDir.create(tmp_path / "s", info), supervise=False)


def test_a_session_without_a_policy_has_no_file(session):
    assert store.read_policy(session.path) is None and store.read_state(session.path) is None


def test_autoscale_stores_the_policy_and_none_stops_it(session):
    session.autoscale(POLICY)
    assert store.read_policy(session.path).policy == POLICY
    session.autoscale(POLICY.to_dict())          # the dict form (a session file, run config) is the same policy
    assert store.read_policy(session.path).policy == POLICY
    session.autoscale(None)
    assert store.read_policy(session.path).policy is None
    reasons = [e.reason for e in event_log.read(session.path).events if e.kind is EventKind.AUTOSCALE_POLICY]
    assert reasons == ["set", "set", "stopped"]


@pytest.mark.parametrize("bad, field", [
    ("fast", "policy"),
    (42, "policy"),
    ({"pools": []}, "pools"),
    ({"pools": [{"config": {"partition": "cpu"}}], "idle_timeout": -1}, "idle_timeout"),
    ({"pools": [{"config": {"partition": "cpu"}, "max_allocations": 0}]}, "pools[0].max_allocations"),
    ({"pools": [{"config": {"partition": "cpu"}}], "min_allocations": 3}, "min_allocations"),
    ({"pools": [{"config": {"partition": "cpu"}}], "idle": 3}, "idle"),
])
def test_a_refused_policy_names_its_field_and_changes_nothing(session, bad, field):
    session.autoscale(POLICY)
    before = paths.autoscale_file(session.path).read_bytes()
    with pytest.raises(ConfigError) as refused:
        session.autoscale(bad)
    assert refused.value.field == field
    assert paths.autoscale_file(session.path).read_bytes() == before


@pytest.mark.parametrize("content", [b"{", b"[]", b'{"version": 2, "set_at": 1, "policy": null}',
                                     b'{"version": 1, "set_at": 1, "policy": {"pools": []}}',
                                     b'{"version": 1, "policy": null}'])
def test_a_damaged_or_newer_policy_file_is_refused_as_corrupt(session, content):
    paths.autoscale_file(session.path).write_bytes(content)
    with pytest.raises(CorruptFileError):
        store.read_policy(session.path)


def test_the_holder_s_state_round_trips(session):
    state = store.ScalerState(holder="h:1:x", turn_at=5.0,
                              jobs={"12": store.Tracked(POLICY.pools[0].config.to_dict(), 4.0, raced=True)},
                              estimates={"0": {"partition": "gpu-b", "start_in": 0.0, "asked_at": 4.0}},
                              unserved=2, notes=("a note",), recent=tuple({"at": float(i)} for i in range(15)))
    store.write_state(session.path, state)
    back = store.read_state(session.path)
    assert back.jobs == state.jobs and back.notes == ("a note",) and back.unserved == 2
    assert len(back.recent) == store.RECENT_KEPT and back.recent[-1]["at"] == 14.0


@pytest.mark.parametrize("content", [b'{"version": 1, "jobs": []}', b'{"version": 1, "jobs": {"1": {}}}',
                                     b'{"version": 1, "notes": "x"}', b'{"version": 9}'])
def test_a_damaged_state_file_is_refused_as_corrupt(session, content):
    paths.autoscale_state_file(session.path).write_bytes(content)
    with pytest.raises(CorruptFileError):
        store.read_state(session.path)


# ---------------------------------------------------------------- the status view (pure)

def _text(lines) -> str:
    return "\n".join(line.plain for line in lines)


def test_a_session_that_never_scaled_shows_nothing():
    from elastic_ray.cli.status_view import autoscale_lines
    from elastic_ray.coordinator.scaling.status import summary
    assert summary(None, None, None, 100.0) is None and autoscale_lines(None, 100.0) == []


def test_the_status_names_the_holder_the_last_decision_and_errors():
    from elastic_ray.cli.status_view import autoscale_lines
    from elastic_ray.coordinator.scaling.status import summary
    from elastic_ray.protocol.disk.records import ElectionClaim
    policy = store.PolicyFile(POLICY, 1.0)
    state = store.ScalerState(holder="h:1:x", turn_at=95.0, unserved=2, notes=("2 unserved wait",),
                              recent=({"at": 90.0, "action": "submit", "job": "7", "reason": "why not"},),
                              error="Submit failed: no")
    on = summary(policy, state, ElectionClaim("h:1:x", 50.0, 130.0), 100.0)
    assert on["holder"] == "h:1:x" and on["lease_left"] == 30.0 and on["turn_age"] == 5.0
    text = _text(autoscale_lines(on, 100.0))
    assert "autoscaler: on (1 pool: gpu-b), run by h:1:x, last turn 5s ago, 2 unserved" in text
    assert "waiting: 2 unserved wait" in text and "last decision (10s ago): why not" in text
    assert "error: Submit failed: no" in text
    lapsed = summary(policy, state, ElectionClaim("h:1:x", 50.0, 99.0), 100.0)
    assert lapsed["holder"] is None and "run by no process" in _text(autoscale_lines(lapsed, 100.0))
    off = summary(store.PolicyFile(None, 2.0), None, None, 100.0, ("state: damaged",))
    assert _text(autoscale_lines(off, 100.0)) == "autoscaler: off\n  error: state: damaged"


def test_teardown_stops_scaling_and_says_so_before_the_session_ends(session):
    from elastic_ray.cli.status_view import autoscale_lines
    from elastic_ray.coordinator.scaling.status import autoscale_status
    session.autoscale(POLICY)
    assert session.teardown() == ()
    assert store.read_policy(session.path).policy is None
    events = [e for e in event_log.read(session.path).events
              if e.kind in (EventKind.AUTOSCALE_POLICY, EventKind.SESSION_ENDED)]
    assert [(e.kind, e.reason) for e in events] == [(EventKind.AUTOSCALE_POLICY, "set"),
                                                    (EventKind.AUTOSCALE_POLICY, "stopped by teardown"),
                                                    (EventKind.SESSION_ENDED, "teardown")]
    shown = autoscale_status(session.path, session.record(), time.time())
    assert not shown["on"] and _text(autoscale_lines(shown, time.time())) == "autoscaler: off"
    session.teardown()   # nothing left to stop: no second event
    assert len([e for e in event_log.read(session.path).events if e.kind is EventKind.AUTOSCALE_POLICY]) == 2


def test_teardown_of_a_session_that_never_scaled_writes_no_policy(session):
    session.teardown()
    assert store.read_policy(session.path) is None


def test_teardown_clears_a_damaged_policy_file_too(session):
    paths.autoscale_file(session.path).write_bytes(b"{")
    session.teardown()
    assert store.read_policy(session.path).policy is None


# ---------------------------------------------------------------- `elastic-ray session autoscale`

POLICY_TOML = """
idle_timeout = 60
[[pools]]
max_allocations = 2
[pools.config]
partition = "gpu-b"
gpus_per_node = 2
"""


def test_the_command_sets_shows_and_stops_the_policy(session, tmp_path):
    import json
    from click.testing import CliRunner
    from elastic_ray.cli import main

    run = lambda *args: CliRunner().invoke(main, ["session", "autoscale", str(session.path), *args])  # noqa: E731
    assert run().stdout.strip() == "autoscaling: off"
    (tmp_path / "policy.toml").write_text(POLICY_TOML)
    shown = run("--policy", str(tmp_path / "policy.toml"))
    assert shown.exit_code == 0 and shown.stdout.strip() == "autoscaling: on (gpu-b); run by no process yet"
    assert store.read_policy(session.path).policy == POLICY
    # A session file's [autoscale] table is accepted as well.
    (tmp_path / "session.toml").write_text('[head]\npartition = "cpu"\n[autoscale]\n' + POLICY_TOML.replace(
        "[[pools]]", "[[autoscale.pools]]").replace("[pools.config]", "[autoscale.pools.config]"))
    assert run("--policy", str(tmp_path / "session.toml")).exit_code == 0
    doc = json.loads(run("--json").stdout)
    assert doc["command"] == "session autoscale" and doc["autoscale"]["on"]
    assert doc["autoscale"]["policy"]["pools"][0]["max_allocations"] == 2
    assert run("--off").stdout.strip() == "autoscaling: off" and store.read_policy(session.path).policy is None


def test_the_command_refuses_a_bad_policy_naming_the_field_and_changes_nothing(session, tmp_path):
    from click.testing import CliRunner
    from elastic_ray.cli import main

    session.autoscale(POLICY)
    before = paths.autoscale_file(session.path).read_bytes()
    (tmp_path / "bad.toml").write_text(POLICY_TOML.replace("max_allocations = 2", "max_allocations = 0"))
    bad = CliRunner().invoke(main, ["session", "autoscale", str(session.path), "--policy", str(tmp_path / "bad.toml")])
    assert bad.exit_code == 2 and "pools[0].max_allocations=0" in bad.output, bad.output
    both = CliRunner().invoke(main, ["session", "autoscale", str(session.path), "--off", "--policy", "x.toml"])
    assert both.exit_code == 2 and "not both" in both.output
    assert paths.autoscale_file(session.path).read_bytes() == before
