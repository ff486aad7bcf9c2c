"""Dagster config classes, resources' validation and the orphan rule: no Ray, no jobs."""

import dataclasses

import dagster
import pydantic
import pytest

from elastic_ray.config import SlurmRunAllocationConfig as CoreRun
from elastic_ray.config import SlurmWorkerAllocationConfig as CoreWorker
from elastic_ray.config.launcher import RayLauncher as CoreLauncher
from elastic_ray.config.queue import SlurmQueue as CoreQueue
from elastic_ray.dagster import (
    SSHConnectionResource,
    ComputeResource,
    RayLauncher,
    SlurmQueueConfig,
    SlurmResource,
    SlurmRunAllocationConfig,
    SlurmSessionResource,
    SlurmWorkerAllocationConfig,
)
from elastic_ray.dagster.orphans import OrphanAction, SessionJobs, decide

PAIRS = [(SlurmRunAllocationConfig, CoreRun), (SlurmWorkerAllocationConfig, CoreWorker),
         (RayLauncher, CoreLauncher), (SlurmQueueConfig, CoreQueue)]


@pytest.mark.parametrize("dagster_cls, core_cls", PAIRS)
def test_generated_fields_and_defaults_follow_the_core(dagster_cls, core_cls):
    assert issubclass(dagster_cls, dagster.Config)
    assert list(dagster_cls.model_fields) == [f.name for f in dataclasses.fields(core_cls)]
    assert dagster_cls().to_core() == core_cls()


def test_worker_config_is_a_run_config_and_round_trips():
    assert issubclass(SlurmWorkerAllocationConfig, SlurmRunAllocationConfig)
    core = CoreWorker(partition="gpu-a", gpus_per_node=4, ray_resources={"accelerator:a40": 1},
                      ray_start_args=("--num-cpus=8",), extra_sbatch_directives=("--requeue",), rejoin_timeout=300)
    config = SlurmWorkerAllocationConfig.from_core(core)
    assert config.ray_start_args == ["--num-cpus=8"] and config.ray_resources == {"accelerator:a40": 1.0}
    assert config.to_core() == core


def test_a_new_core_field_appears_in_dagster_without_a_hand_kept_list():
    from elastic_ray.dagster.configs import generate_config

    @dataclasses.dataclass(frozen=True)
    class Grown(CoreRun):
        new_knob: int | None = None

    generated = generate_config("Grown", Grown)
    assert "new_knob" in generated.model_fields and generated(new_knob=3).to_core().new_knob == 3


@pytest.mark.parametrize("cls, kwargs, field", [
    (SlurmRunAllocationConfig, {"time_limit": "soon"}, "time_limit"),
    (SlurmRunAllocationConfig, {"mem": "1G", "mem_per_cpu": "1G"}, "mem_per_cpu"),
    (SlurmWorkerAllocationConfig, {"ray_resources": {"GPU": 1}}, "ray_resources['GPU']"),
    (SlurmWorkerAllocationConfig, {"ray_start_args": ["--address=x"]}, "ray_start_args[0]"),
    (SlurmWorkerAllocationConfig, {"rejoin_timeout": 0}, "rejoin_timeout"),
    (RayLauncher, {"port_strategy": "lucky"}, "port_strategy"),
    (SlurmQueueConfig, {"cpus": 0}, "cpus"),
])
def test_validation_is_the_core_and_names_the_field(cls, kwargs, field):
    with pytest.raises(pydantic.ValidationError) as err:
        cls(**kwargs)
    assert f"{field}=" in str(err.value)


def test_compute_resource_errors_name_the_field():
    with pytest.raises(pydantic.ValidationError, match=r"ray_head_allocation\.partition"):
        ComputeResource(mode="local", ray_head_allocation=SlurmRunAllocationConfig(time_limit="60"))
    with pytest.raises(pydantic.ValidationError, match=r"run_allocation\.partition"):
        ComputeResource(mode="local")
    with pytest.raises(pydantic.ValidationError, match="slurm"):
        ComputeResource(mode="slurm", run_allocation=SlurmRunAllocationConfig(partition="cpu"))
    with pytest.raises(pydantic.ValidationError, match="allocation_scope"):
        ComputeResource(mode="local", allocation_scope="asset", run_allocation=SlurmRunAllocationConfig(partition="cpu"))
    with pytest.raises(pydantic.ValidationError, match="ssh"):
        SlurmResource(remote_base="/home/me")
    with pytest.raises(pydantic.ValidationError, match="remote_base"):
        SlurmResource(ssh=SSHConnectionResource(host="login"))
    with pytest.raises(pydantic.ValidationError, match="remote_base='relative'"):
        SlurmResource(ssh=SSHConnectionResource(host="login"), remote_base="relative")
    with pytest.raises(pydantic.ValidationError, match="ssh.port"):
        SSHConnectionResource(host="login", port=70000)
    with pytest.raises(pydantic.ValidationError, match="ssh.host"):
        SSHConnectionResource(host="-oProxyCommand=x")


def test_session_resource_fields_are_the_head_allocation_fields():
    fields = set(SlurmSessionResource.model_fields)
    assert {f.name for f in dataclasses.fields(CoreRun)} <= fields
    assert {"slurm", "ray_head_only", "worker_allocation", "launcher", "session_root"} <= fields
    with pytest.raises(pydantic.ValidationError, match="num_nodes"):
        SlurmSessionResource(mode="local", partition="cpu", time_limit="60", ray_head_only=True, num_nodes=2)
    ok = SlurmSessionResource(mode="local", partition="cpu", time_limit="60", ray_head_only=True, num_nodes=1,
                              worker_allocation=SlurmWorkerAllocationConfig(partition="gpu-a"))
    assert ok.layout().ray_head_only and ok.layout().worker_allocation.partition == "gpu-a"


def test_bad_run_config_fails_the_run_naming_the_field():
    @dagster.asset
    def needs_compute(compute: ComputeResource):
        return 1

    result = dagster.materialize(
        [needs_compute], resources={"compute": ComputeResource.configure_at_launch()}, raise_on_error=False,
        run_config={"resources": {"compute": {"config": {
            "mode": "local", "run_allocation": {"partition": "cpu", "time_limit": "whenever"}}}}})
    assert not result.success
    failures = [e for e in result.all_events if e.is_failure]
    assert any("time_limit='whenever'" in str(e.event_specific_data) for e in failures)


# (run statuses, session jobs) -> verdict
IDLE = SessionJobs(head_active=False, running_workers=0, pending_workers=0, successor_active=False,
                   election_pending=False)
LIVE_HEAD = dataclasses.replace(IDLE, head_active=True)
WAITING_WORKER = dataclasses.replace(IDLE, running_workers=1)
ORPHAN_TABLE = [
    ([], LIVE_HEAD, OrphanAction.NO_RUN),
    (["STARTED"], LIVE_HEAD, OrphanAction.RUN_ACTIVE),
    (["FAILURE", "QUEUED"], LIVE_HEAD, OrphanAction.RUN_ACTIVE),      # a retry is coming
    (["CANCELING"], LIVE_HEAD, OrphanAction.RUN_ACTIVE),
    (["SUCCESS"], IDLE, OrphanAction.NOTHING_LIVE),
    (["SUCCESS"], LIVE_HEAD, OrphanAction.TEARDOWN),
    (["FAILURE"], dataclasses.replace(LIVE_HEAD, running_workers=2), OrphanAction.TEARDOWN),
    (["CANCELED"], dataclasses.replace(IDLE, pending_workers=1), OrphanAction.TEARDOWN),
    (["FAILURE"], WAITING_WORKER, OrphanAction.WAITING_FOR_HEAD),
    (["FAILURE"], dataclasses.replace(IDLE, successor_active=True), OrphanAction.WAITING_FOR_HEAD),
    (["SUCCESS"], dataclasses.replace(IDLE, pending_workers=1, election_pending=True),
     OrphanAction.WAITING_FOR_HEAD),
]


@pytest.mark.parametrize("statuses, jobs, action", ORPHAN_TABLE)
def test_orphan_rule(statuses, jobs, action):
    verdict, why = decide(statuses, jobs)
    assert verdict is action and why


def test_the_autoscale_policy_is_run_config_checked_by_the_core():
    from elastic_ray.autoscale import AutoscalePolicy, Pool
    from elastic_ray.config import SlurmWorkerAllocationConfig as CoreWorker
    from elastic_ray.dagster import AutoscaleConfig, AutoscalePoolConfig

    config = AutoscaleConfig(pools=[AutoscalePoolConfig(config=SlurmWorkerAllocationConfig(partition="gpu-b",
                                                                                           gpus_per_node=2),
                                                        max_allocations=2)], idle_timeout=60)
    assert config.to_core() == AutoscalePolicy(pools=[Pool(CoreWorker(partition="gpu-b", gpus_per_node=2), 2)],
                                               idle_timeout=60)
    for kwargs, field in [({"pools": []}, "pools=[]"), ({"idle_timeout": -1}, "idle_timeout=-1"),
                          ({"pools": [{"config": {"partition": "gpu-b"}, "max_allocations": 0}]},
                           "pools[0].max_allocations=0")]:
        with pytest.raises(pydantic.ValidationError) as err:
            AutoscaleConfig(**{"pools": [{"config": {"partition": "cpu"}}], **kwargs})
        assert field in str(err.value)
    compute = ComputeResource(mode="local", run_allocation=SlurmRunAllocationConfig(partition="cpu"),
                              autoscale={"pools": [{"config": {"partition": "gpu-b"}}], "min_allocations": 1})
    assert compute.autoscale.to_core().min_allocations == 1
    assert ComputeResource(mode="local", run_allocation=SlurmRunAllocationConfig(partition="cpu")).autoscale is None


def test_the_session_resource_takes_the_same_autoscale_policy():
    head = {"mode": "local", "partition": "cpu", "time_limit": "60"}
    session = SlurmSessionResource(**head, autoscale={"pools": [{"config": {"partition": "gpu-b"}}],
                                                      "min_allocations": 1})
    assert session.autoscale.to_core().min_allocations == 1 and SlurmSessionResource(**head).autoscale is None
    with pytest.raises(pydantic.ValidationError) as err:
        SlurmSessionResource(**head, autoscale={"pools": [{"config": {"partition": "gpu-b"}, "max_allocations": 0}]})
    assert "pools[0].max_allocations=0" in str(err.value)
