"""The session file (config/session_file.py): every key maps onto Session.create,
every refused key is named with the file, and a bad file creates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.config.session_file import (
    SESSION_ENV,
    SessionFileError,
    WorkerToAdd,
    load_session_file,
    parse_session_file,
)
from elastic_ray.coordinator.session import Session
from elastic_ray.errors import ConfigError

FULL = """
path = "runs/train"
scheduler = "slurm"
job_name = "train-42"
ray_head_only = true
local_state_dir = "state"
claim_period = 45
supervise_interval = 12.5

[head]
partition = "cpu"
time_limit = "12:00:00"
mem = "16G"
account = "proj"

[launcher]
port_strategy = "hash_jobid"
num_gpus_per_node = 1
head_port = 7000
env = { OMP_NUM_THREADS = "1" }
pre_start_commands = ["module load cuda"]
auth_mode = "token"
ray_start_args = ["--num-cpus=4"]
include_dashboard = true
object_store_memory = 100000000

[worker_allocation]
partition = "gpu"
num_nodes = 2
gpus_per_node = 4
time_limit = "4:00:00"
ray_resources = { "accelerator:a40" = 1 }

[[workers]]
partition = "cpu"
num_nodes = 3
resubmit_on_failure = 2

[[workers]]
nodelist = "cpu-[1-2]"
extra_sbatch_directives = ["--exclusive"]
"""


def _write(tmp_path: Path, text: str, name: str = "session.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_every_key_maps_to_its_create_argument(tmp_path):
    sf = load_session_file(_write(tmp_path, FULL))
    assert sf.path == tmp_path / "runs/train"            # relative to the file's directory
    kw = sf.create_kwargs
    assert set(kw) == {"scheduler", "job_name", "ray_head_only", "local_state_dir", "claim_period",
                       "supervise_interval", "head", "launcher", "worker_allocation"}
    assert (kw["scheduler"], kw["job_name"], kw["ray_head_only"]) == ("slurm", "train-42", True)
    assert kw["local_state_dir"] == tmp_path / "state"
    assert (kw["claim_period"], kw["supervise_interval"]) == (45, 12.5)
    assert kw["head"] == SlurmRunAllocationConfig(partition="cpu", time_limit="12:00:00", mem="16G", account="proj")
    assert kw["launcher"] == RayLauncher(port_strategy="hash_jobid", num_gpus_per_node=1, head_port=7000,
                                         env={"OMP_NUM_THREADS": "1"}, pre_start_commands=("module load cuda",),
                                         auth_mode="token", ray_start_args=("--num-cpus=4",),
                                         include_dashboard=True, object_store_memory=100000000)
    assert kw["worker_allocation"] == SlurmWorkerAllocationConfig(
        partition="gpu", num_nodes=2, gpus_per_node=4, time_limit="4:00:00", ray_resources={"accelerator:a40": 1.0})
    assert sf.workers == (
        WorkerToAdd(SlurmWorkerAllocationConfig(partition="cpu", num_nodes=3), 2),
        WorkerToAdd(SlurmWorkerAllocationConfig(nodelist="cpu-[1-2]", extra_sbatch_directives=("--exclusive",)), 0))


def test_keys_left_out_are_not_passed_so_create_applies_its_own_defaults():
    sf = parse_session_file({"head": {"partition": "cpu", "time_limit": "10"}})
    assert set(sf.create_kwargs) == {"head"}        # no scheduler: Session.create's rule decides
    assert sf.path is None and sf.workers == ()


@pytest.mark.parametrize("data, key, words", [
    ({"partiton": "x"}, "partiton", "unknown key"),
    ({"head": {"partiton": "cpu"}}, "head.partiton", "unknown key"),
    ({"launcher": {"port": 1}}, "launcher.port", "unknown key"),
    ({"launcher": {"port_strategy": "nope"}}, "launcher.port_strategy", "must be one of random, hash_jobid, fixed"),
    ({"launcher": {"head_port": "6379"}}, "launcher.head_port", "must be a port number"),
    ({"launcher": {"env": {"RAY_ADDRESS": "x"}}}, "launcher.env['RAY_ADDRESS']", "is set by the agent"),
    ({"launcher": "fixed"}, "launcher", "must be a table"),
    ({"head": {"partition": "cpu"}}, "head.time_limit", "explicit time_limit"),
    ({"head": {"time_limit": "10"}}, "head.partition", "explicit partition"),
    ({"head": {"partition": "cpu", "time_limit": "10", "num_nodes": 2}}, "head.num_nodes", "exactly one node"),
    ({"head": {"partition": "cpu", "time_limit": "1:75"}}, "head.time_limit", "seconds must be below 60"),
    ({"head": {"partition": "cpu", "time_limit": "10", "num_nodes": "1"}}, "head.num_nodes", "whole number"),
    ({"worker_allocation": {"num_nodes": 0}}, "worker_allocation.num_nodes", "at least 1"),
    ({"worker_allocation": {"resubmit_on_failure": 1}}, "worker_allocation.resubmit_on_failure", "unknown key"),
    ({"worker_allocation": {"ray_resources": {"CPU": 1}}}, "worker_allocation.ray_resources['CPU']", "agent"),
    ({"workers": {"num_nodes": 1}}, "workers", "array of tables"),
    ({"workers": [{"num_nodes": 1}, {"gpus": 1}]}, "workers[1].gpus", "unknown key"),
    ({"workers": [{"resubmit_on_failure": -1}]}, "workers[0].resubmit_on_failure", ">= 0"),
    ({"workers": [{"resubmit_on_failure": True}]}, "workers[0].resubmit_on_failure", ">= 0"),
    ({"scheduler": "pbs"}, "scheduler", "must be one of local, slurm"),
    ({"scheduler": 1}, "scheduler", "must be one of local, slurm"),
    ({"path": 3}, "path", "must be a path"),
    ({"path": ""}, "path", "must not be empty"),
    ({"local_state_dir": False}, "local_state_dir", "must be a path"),
    ({"job_name": "has blank"}, "job_name", "not a valid job name"),
    ({"ray_head_only": "yes"}, "ray_head_only", "true or false"),
    ({"claim_period": 0}, "claim_period", "more than 0"),
    ({"claim_period": True}, "claim_period", "a number of seconds"),
    ({"supervise_interval": "30"}, "supervise_interval", "a number of seconds"),
    ({"ray_head_only": False, "launcher": {"port_strategy": "fixed"}}, "launcher.port_strategy",
     "'random' or 'hash_jobid'"),
    ({"autoscale": "on"}, "autoscale", "must be a table"),
    ({"autoscale": {}}, "autoscale.pools", "must be a list"),
    ({"autoscale": {"pools": []}}, "autoscale.pools", "at least one Pool"),
    ({"autoscale": {"pools": [{"max_allocations": 2}]}}, "autoscale.pools[0].config", "is required"),
    ({"autoscale": {"pools": [{"config": {"partiton": "gpu"}}]}}, "autoscale.pools[0].config.partiton",
     "not a field"),
    ({"autoscale": {"pools": [{"config": {"partition": "gpu"}}], "idle_timeout": 0}}, "autoscale.idle_timeout",
     "above zero"),
    ({"autoscale": {"pools": [{"config": {"partition": "gpu"}}], "idle": 5}}, "autoscale.idle", "not a field"),
])
def test_every_refusal_names_the_file_and_the_dotted_key(data, key, words):
    full = {"head": {"partition": "cpu", "time_limit": "10"}, **data}
    with pytest.raises(SessionFileError) as info:
        parse_session_file(full, "my.toml")
    assert isinstance(info.value, ConfigError) and info.value.field == key
    assert str(info.value).startswith(f"my.toml: {key}: "), str(info.value)
    assert words in str(info.value)


def test_a_missing_head_table_is_named():
    with pytest.raises(SessionFileError, match=r"^s.toml: head: missing"):
        parse_session_file({}, "s.toml")


def test_bad_toml_and_a_missing_file_name_the_file(tmp_path):
    with pytest.raises(SessionFileError, match=r"bad.toml: not valid TOML"):
        load_session_file(_write(tmp_path, "head = {", "bad.toml"))
    with pytest.raises(SessionFileError, match=r"gone.toml: cannot be read"):
        load_session_file(tmp_path / "gone.toml")


def test_the_directory_comes_from_the_argument_then_the_file_then_the_environment(tmp_path):
    sf = parse_session_file({"head": {"partition": "cpu", "time_limit": "10"}, "path": "p"}, base=tmp_path)
    assert sf.directory(tmp_path / "given", {SESSION_ENV: "/env"}) == tmp_path / "given"
    assert sf.directory(None, {SESSION_ENV: "/env"}) == tmp_path / "p"
    bare = parse_session_file({"head": {"partition": "cpu", "time_limit": "10"}})
    assert bare.directory(None, {SESSION_ENV: "/env"}) == Path("/env")
    with pytest.raises(SessionFileError, match="path: no session directory.*ELASTIC_RAY_SESSION"):
        bare.directory(None, {})


def test_from_config_refuses_a_bad_file_before_anything_is_created(tmp_path):
    config = _write(tmp_path, '[head]\npartition = "cpu"\ntime_limit = "10"\n[launcher]\nport_strategy = "x"\n')
    with pytest.raises(SessionFileError, match="launcher.port_strategy"):
        Session.from_config(config, path=tmp_path / "session")
    assert not (tmp_path / "session").exists()


AUTOSCALE = """
[head]
partition = "cpu"
time_limit = "12:00:00"

[autoscale]
idle_timeout = 120
max_nodes = 4

[[autoscale.pools]]
max_allocations = 2
[autoscale.pools.config]
partition = "gpu-b"
gpus_per_node = 2
time_limit = "4:00:00"
"""


def test_the_autoscale_table_is_the_policy_set_after_creation(tmp_path):
    from elastic_ray.autoscale import AutoscalePolicy, Pool
    calls = []

    class FakeSession:
        @classmethod
        def create(cls, path, **kwargs):
            calls.append("create")
            return cls()

        def autoscale(self, policy):
            calls.append(policy)

    sf = load_session_file(_write(tmp_path, AUTOSCALE))
    expected = AutoscalePolicy(pools=[Pool(SlurmWorkerAllocationConfig(partition="gpu-b", gpus_per_node=2,
                                                                       time_limit="4:00:00"), max_allocations=2)],
                               idle_timeout=120, max_nodes=4)
    assert sf.autoscale == expected and "autoscale" not in sf.create_kwargs
    sf.create(FakeSession, path=tmp_path / "s")
    assert calls == ["create", expected]
    assert load_session_file(_write(tmp_path, FULL)).autoscale is None


def test_create_passes_the_file_and_overrides_then_adds_the_workers(tmp_path):
    calls = []

    class FakeSession:
        @classmethod
        def create(cls, path, **kwargs):
            calls.append(("create", path, kwargs))
            return cls()

        def add_worker_allocation(self, config, *, resubmit_on_failure=0):
            calls.append(("add", config.num_nodes, resubmit_on_failure))

    sf = load_session_file(_write(tmp_path, FULL))
    sf.create(FakeSession, supervise=False, job_name="other")
    (_, path, kwargs), *adds = calls
    assert path == tmp_path / "runs/train"
    assert kwargs["supervise"] is False and kwargs["job_name"] == "other" and kwargs["scheduler"] == "slurm"
    assert adds == [("add", 3, 2), ("add", None, 0)]


@pytest.mark.parametrize("page", ["cli.md", "autoscale.md"])
def test_the_docs_session_files_are_accepted(page):
    # The TOML examples of these pages are session files: each must parse and pass every check.
    import re
    try:
        import tomllib
    except ModuleNotFoundError:   # Python 3.10
        import tomli as tomllib   # type: ignore[no-redef]
    text = (Path(__file__).resolve().parent.parent / "docs" / page).read_text()
    blocks = re.findall(r"```toml\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        sf = parse_session_file(tomllib.loads(block), page)
        assert sf.autoscale is not None, "each example shows the [autoscale] table"
