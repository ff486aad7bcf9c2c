"""A session's scheduler is chosen, never defaulted: named, or from
$ELASTIC_RAY_SCHEDULER (config/scheduler_choice.py), for Session.create and
for the Dagster resources alike."""

from __future__ import annotations

import pytest

from elastic_ray.config import SlurmRunAllocationConfig
from elastic_ray.config.scheduler_choice import SCHEDULER_ENV, scheduler_kind
from elastic_ray.coordinator.session import Session
from elastic_ray.errors import ConfigError

HEAD = SlurmRunAllocationConfig(partition="cpu", time_limit="60")


def test_a_named_scheduler_wins_over_the_environment():
    assert scheduler_kind("slurm", {SCHEDULER_ENV: "local"}) == "slurm"
    assert scheduler_kind("local", {}) == "local"


@pytest.mark.parametrize("value", ["local", "slurm", " slurm "])
def test_the_environment_chooses_when_nothing_is_named(value):
    assert scheduler_kind(None, {SCHEDULER_ENV: value}) == value.strip()


def test_without_either_the_error_says_both_ways():
    for environ in ({}, {SCHEDULER_ENV: ""}):
        with pytest.raises(ConfigError) as caught:
            scheduler_kind(None, environ)
        assert caught.value.field == "scheduler"
        assert "scheduler='slurm'" in str(caught.value) and f"{SCHEDULER_ENV}=slurm" in str(caught.value)


def test_a_bad_choice_names_where_it_came_from():
    with pytest.raises(ConfigError) as named:
        scheduler_kind("pbs", {SCHEDULER_ENV: "slurm"})
    assert named.value.field == "scheduler"
    with pytest.raises(ConfigError) as from_env:
        scheduler_kind(None, {SCHEDULER_ENV: "Slurm"})
    assert from_env.value.field == SCHEDULER_ENV and from_env.value.value == "Slurm"


def test_session_create_without_a_scheduler_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(SCHEDULER_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"pass scheduler='slurm' .*or set {SCHEDULER_ENV}=slurm"):
        Session.create(tmp_path / "s", head=HEAD, supervise=False)
    assert not (tmp_path / "s").exists()


def test_session_create_takes_the_scheduler_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(SCHEDULER_ENV, "local")
    submitted = []
    monkeypatch.setattr(Session, "_submit_head", lambda self: submitted.append(self.info.job_name))
    session = Session.create(tmp_path / "s", head=HEAD, supervise=False)
    try:
        assert session.info.scheduler["kind"] == "local" and submitted == [session.info.job_name]
    finally:
        session.close()


def test_the_dagster_resources_take_mode_or_the_environment(monkeypatch):
    pytest.importorskip("dagster")
    from elastic_ray.dagster import ComputeResource, SlurmSessionResource
    from elastic_ray.dagster.configs import SlurmRunAllocationConfig as DagsterRun

    compute = ComputeResource(run_allocation=DagsterRun(partition="cpu", time_limit="60"))
    session = SlurmSessionResource(partition="cpu", time_limit="60")
    monkeypatch.delenv(SCHEDULER_ENV, raising=False)
    for resource in (compute, session):
        with pytest.raises(ConfigError, match=f"pass mode='slurm' .*or set {SCHEDULER_ENV}=slurm") as caught:
            resource.scheduler_kind()
        assert caught.value.field == "mode"
    monkeypatch.setenv(SCHEDULER_ENV, "local")
    assert compute.scheduler_kind() == "local" and session.scheduler_kind() == "local"
    assert ComputeResource(mode="slurm", slurm={}, run_allocation=DagsterRun(partition="cpu")).scheduler_kind() \
        == "slurm"   # named wins
    monkeypatch.setenv(SCHEDULER_ENV, "slurm")
    assert session.scheduler_kind() == "slurm"
    with pytest.raises(ConfigError) as no_queue:   # mode='slurm' needs the SlurmResource, from the env too
        compute.scheduler_kind()
    assert no_queue.value.field == "slurm"


def test_the_dagster_resources_refuse_an_unknown_mode():
    pytest.importorskip("dagster")
    import pydantic

    from elastic_ray.dagster import ComputeResource, SlurmSessionResource
    from elastic_ray.dagster.configs import SlurmRunAllocationConfig as DagsterRun

    with pytest.raises(pydantic.ValidationError, match="mode='pbs'"):
        ComputeResource(mode="pbs", run_allocation=DagsterRun(partition="cpu", time_limit="60"))
    with pytest.raises(pydantic.ValidationError, match="mode='pbs'"):
        SlurmSessionResource(mode="pbs", partition="cpu", time_limit="60")
