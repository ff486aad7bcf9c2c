"""Allocation configs: every validation rule, and every inheritance rule.

Each refused value is checked for the field its error names, because "which
field do I fix?" is the whole point of validating early.
"""

from __future__ import annotations

import math

import pytest

from elastic_ray.config import (
    RayLauncher,
    SlurmRunAllocationConfig as Run,
    SlurmWorkerAllocationConfig as Worker,
    inherit_worker_config,
    resolve_head_config,
)
from elastic_ray.errors import ConfigError
from elastic_ray.config.slurm_values import parse_memory_mb, parse_slurm_time

# ----------------------------------------------------------------- accepted values

GOOD_TIMES = [
    ("30", 1800), ("0:30", 30), ("90", 5400), ("01:30", 90), ("12:00:00", 43200),
    ("1-0", 86400), ("2-12", 2 * 86400 + 12 * 3600), ("1-02:03", 86400 + 7200 + 180),
    ("3-00:00:00", 3 * 86400), ("0-00:00:10", 10), ("UNLIMITED", None), ("infinite", None),
]


@pytest.mark.parametrize("text,seconds", GOOD_TIMES)
def test_slurm_time_forms(text, seconds):
    assert parse_slurm_time(text) == seconds
    assert Run(time_limit=text).time_limit == text.strip()


def _days_form(seconds: int) -> str:
    """``seconds`` written in Slurm's ``D-HH:MM:SS`` form (what sacct and squeue print)."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


@pytest.mark.parametrize("seconds", [10, 60, 3600, 86400 + 61, 3 * 86400])
def test_the_days_form_parses_back_to_its_seconds(seconds):
    assert parse_slurm_time(_days_form(seconds)) == seconds


@pytest.mark.parametrize("text,mb", [("16G", 16384), ("200000M", 200000), ("512", 512), ("1T", 1048576),
                                     ("2048K", 2), ("0", 0), ("8g", 8192)])
def test_memory_forms(text, mb):
    assert parse_memory_mb(text) == mb


# Signal forms (and job ids, job names, host lists) are tested once, in
# tests/test_slurm_values.py; here, what the config fields make of them.

@pytest.mark.parametrize("field,given,stored", [
    ("mem", " 16g\n", "16G"), ("mem_per_cpu", "4G\n", "4G"), ("time_limit", "30\n", "30"),
    ("time_min", " 1-0\n", "1-0"), ("signal_before_timeout", "sigterm@600\n", "TERM@600"),
    ("signal_before_timeout", "15@0600", "TERM@600"),
])
def test_parsed_values_are_stored_stripped_and_normalised(field, given, stored):
    # A newline must never reach an #SBATCH line: fields that are parsed are
    # stored in their normal form, the others are refused (REFUSED below).
    assert getattr(Run(**{field: given}), field) == stored


def test_a_full_worker_config_is_accepted_and_normalised():
    cfg = Worker(partition="gpu-a", num_nodes=2, gpus_per_node=4, cpus_per_task=32, mem="200g",
                 time_limit="08:00:00", signal_before_timeout="SIGTERM@600", nodelist="gpua-[1-2]",
                 exclude="gpua-3", qos="normal", account="proj-1", reservation="maint",
                 constraint="a40&ib", extra_sbatch_directives=["--requeue", "--comment=x"],
                 ray_resources={"accelerator:a40": 1, "vram_48gb": 1},
                 ray_start_args=["--num-cpus=8", "--object-store-memory=1000000"], rejoin_timeout=900)
    assert cfg.mem == "200G"
    assert cfg.signal_before_timeout == "TERM@600"
    assert dict(cfg.ray_resources) == {"accelerator:a40": 1.0, "vram_48gb": 1.0}
    assert cfg.extra_sbatch_directives == ("--requeue", "--comment=x")
    with pytest.raises(TypeError):
        cfg.ray_resources["x"] = 1  # immutable
    assert Worker.from_dict(cfg.to_dict()) == cfg


# ----------------------------------------------------------------- refused values

REFUSED = [
    # (kwargs, field named in the error)
    ({"partition": ""}, "partition"),
    ({"partition": "gpu a"}, "partition"),
    ({"partition": "cpu;rm"}, "partition"),
    ({"partition": 3}, "partition"),
    ({"num_nodes": 0}, "num_nodes"),
    ({"num_nodes": True}, "num_nodes"),
    ({"num_nodes": 1.5}, "num_nodes"),
    ({"gpus_per_node": -1}, "gpus_per_node"),
    ({"gpus_per_node": "2"}, "gpus_per_node"),
    ({"cpus_per_task": 0}, "cpus_per_task"),
    ({"mem": "16GB"}, "mem"),
    ({"mem": "-1G"}, "mem"),
    ({"mem": "lots"}, "mem"),
    ({"mem": 16}, "mem"),
    ({"mem_per_cpu": "4Q"}, "mem_per_cpu"),
    ({"mem": "16G", "mem_per_cpu": "4G"}, "mem_per_cpu"),
    ({"time_limit": "1:75"}, "time_limit"),
    ({"time_limit": "25:00:00:00"}, "time_limit"),
    ({"time_limit": "1-25"}, "time_limit"),
    ({"time_limit": "0"}, "time_limit"),
    ({"time_limit": "soon"}, "time_limit"),
    ({"time_limit": "1h"}, "time_limit"),
    ({"time_limit": 60}, "time_limit"),
    ({"time_min": "1:99:00"}, "time_min"),
    ({"time_limit": "10", "time_min": "20"}, "time_min"),
    ({"time_limit": "10", "time_min": "UNLIMITED"}, "time_min"),
    ({"signal_before_timeout": "KILL@60"}, "signal_before_timeout"),
    ({"signal_before_timeout": "SIGSTOP@60"}, "signal_before_timeout"),
    ({"signal_before_timeout": "9@60"}, "signal_before_timeout"),
    ({"signal_before_timeout": "TERM@0"}, "signal_before_timeout"),
    ({"signal_before_timeout": "TERM@70000"}, "signal_before_timeout"),
    ({"signal_before_timeout": "TERM"}, "signal_before_timeout"),
    ({"signal_before_timeout": "B:TERM@60"}, "signal_before_timeout"),
    ({"signal_before_timeout": "NOPE@60"}, "signal_before_timeout"),
    ({"signal_before_timeout": "99@60"}, "signal_before_timeout"),
    ({"nodelist": "a b"}, "nodelist"),
    ({"nodelist": "$(reboot)"}, "nodelist"),
    ({"exclude": "n1\nn2"}, "exclude"),
    ({"qos": "high prio"}, "qos"),
    ({"account": "a'b"}, "account"),
    ({"reservation": "r`x`"}, "reservation"),
    ({"constraint": "a40 & ib"}, "constraint"),
    ({"extra_sbatch_directives": "--requeue"}, "extra_sbatch_directives"),
    ({"extra_sbatch_directives": ["-p cpu"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--requeue", "--time=10"]}, "extra_sbatch_directives[1]"),
    ({"extra_sbatch_directives": ["--sig=TERM@60"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--part=gpu"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--job-name=other"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--gres=gpu:2"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--output=/x"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--wrap=id"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--comment=a b"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--comment=$(id)"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--comment=x\n#SBATCH --time=1"]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": ["--comment="]}, "extra_sbatch_directives[0]"),
    ({"extra_sbatch_directives": [7]}, "extra_sbatch_directives[0]"),
    # A trailing newline, and digits of another script ('١٢٣'), in every field.
    ({"partition": "cpu\n"}, "partition"),
    ({"partition": "cpu,gpu-a\n"}, "partition"),
    ({"qos": "normal\n"}, "qos"),
    ({"account": "proj-1\n"}, "account"),
    ({"reservation": "maint\n"}, "reservation"),
    ({"constraint": "a40&ib\n"}, "constraint"),
    ({"nodelist": "gpua-1\n"}, "nodelist"),
    ({"nodelist": "gpua-[\u0661-\u0662]"}, "nodelist"),
    ({"exclude": "gpua-[1-2]\n"}, "exclude"),
    ({"mem": "\u0661\u0666G"}, "mem"),
    ({"mem": "16\u212a"}, "mem"),  # KELVIN SIGN, which case-insensitive Unicode matching reads as k
    ({"mem_per_cpu": "4G\n4G"}, "mem_per_cpu"),
    ({"time_limit": "\u0661\u0660"}, "time_limit"),
    ({"time_limit": "30\n30"}, "time_limit"),
    ({"time_min": "1:\u0663\u0660"}, "time_min"),
    ({"signal_before_timeout": "TERM@\u0661\u0662\u0660"}, "signal_before_timeout"),
    ({"signal_before_timeout": "\u0661\u0665@60"}, "signal_before_timeout"),
    ({"signal_before_timeout": "s\u0131gterm@60"}, "signal_before_timeout"),
    ({"signal_before_timeout": "TERM@60\nUSR1@5"}, "signal_before_timeout"),
    ({"extra_sbatch_directives": ["--requeue\n"]}, "extra_sbatch_directives[0]"),
    # A host list must be well formed, not only made of the right characters.
    ({"nodelist": "gpua-[2-1]"}, "nodelist"),
    ({"nodelist": "gpua-[1-2"}, "nodelist"),
    ({"exclude": "a,,b"}, "exclude"),
    ({"exclude": "gpua-[a-b]"}, "exclude"),
]


@pytest.mark.parametrize("kwargs,field", REFUSED)
@pytest.mark.parametrize("cls", [Run, Worker])
def test_refused_slurm_values_name_the_field(cls, kwargs, field):
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(field + "=")


WORKER_REFUSED = [
    ({"ray_resources": {"": 1}}, "ray_resources['']"),
    ({"ray_resources": {"  ": 1}}, "ray_resources['  ']"),
    ({"ray_resources": {"CPU": 4}}, "ray_resources['CPU']"),
    ({"ray_resources": {"GPU": 1}}, "ray_resources['GPU']"),
    ({"ray_resources": {"memory": 1e9}}, "ray_resources['memory']"),
    ({"ray_resources": {"object_store_memory": 1e9}}, "ray_resources['object_store_memory']"),
    ({"ray_resources": {"node:10.0.0.1": 1}}, "ray_resources['node:10.0.0.1']"),
    ({"ray_resources": {"dagster_slurm_worker": 2}}, "ray_resources['dagster_slurm_worker']"),
    ({"ray_resources": {"a40": -1}}, "ray_resources['a40']"),
    ({"ray_resources": {"a40": math.inf}}, "ray_resources['a40']"),
    ({"ray_resources": {"a40": math.nan}}, "ray_resources['a40']"),
    ({"ray_resources": {"a40": "1"}}, "ray_resources['a40']"),
    ({"ray_resources": {"a40": True}}, "ray_resources['a40']"),
    ({"ray_resources": {"a\n40": 1}}, "ray_resources['a\\n40']"),
    ({"ray_resources": [("a40", 1)]}, "ray_resources"),
    ({"ray_start_args": "--num-cpus=8"}, "ray_start_args"),
    ({"ray_start_args": ["--num-cpus", "8"]}, "ray_start_args[1]"),
    ({"ray_start_args": ["num-cpus=8"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--address=1.2.3.4:6379"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--head"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--block"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--temp-dir=/x"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--resources={}"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--num-gpus=2"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--node-ip-address=1.2.3.4"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--num-cpus=8", "--port=6379"]}, "ray_start_args[1]"),
    ({"ray_start_args": ["--labels=a=b"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--memory=1\n"]}, "ray_start_args[0]"),
    ({"ray_start_args": ["--disable-usage-stats\n"]}, "ray_start_args[0]"),
    ({"rejoin_timeout": 0}, "rejoin_timeout"),
    ({"rejoin_timeout": -5}, "rejoin_timeout"),
    ({"rejoin_timeout": math.inf}, "rejoin_timeout"),
    ({"rejoin_timeout": "600"}, "rejoin_timeout"),
]


@pytest.mark.parametrize("kwargs,field", WORKER_REFUSED)
def test_refused_ray_values_name_the_field(kwargs, field):
    with pytest.raises(ConfigError) as info:
        Worker(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize("name", ["FOO\n", "\nFOO", "", "1FOO", "FO O", "F\u00d6O", "FOO-BAR", "FOO="])
def test_launcher_refuses_bad_env_names_naming_the_variable(name):
    with pytest.raises(ConfigError) as info:
        RayLauncher(env={name: "1"})
    assert info.value.field == f"env[{name!r}]"


@pytest.mark.parametrize("args", [["--disable-usage-stats\n"], ["--num-cpus=8", "--block\n"]])
def test_launcher_refuses_ray_start_args_with_a_trailing_newline(args):
    with pytest.raises(ConfigError) as info:
        RayLauncher(ray_start_args=args)
    assert info.value.field == f"ray_start_args[{len(args) - 1}]"


def test_from_dict_names_an_unknown_key():
    with pytest.raises(ConfigError) as info:
        Run.from_dict({"partition": "cpu", "gpus": 2})
    assert info.value.field == "gpus"


# ----------------------------------------------------------------- inheritance

HEAD = Run(partition="cpu", time_limit="3-00:00:00", cpus_per_task=4, mem="16G", account="acct",
           qos="long", nodelist="cpu-1", extra_sbatch_directives=("--requeue",),
           signal_before_timeout="TERM@300")
FIRST = Worker(partition="gpu-a", gpus_per_node=4, cpus_per_task=32, mem_per_cpu="4G", time_limit="08:00:00",
               signal_before_timeout="TERM@600", nodelist="gpua-1", exclude="gpua-9",
               extra_sbatch_directives=("--comment=first",), ray_resources={"a40": 1},
               ray_start_args=("--num-cpus=8",), rejoin_timeout=120)

INHERIT = [
    # (id, config, first worker, head, expected field values)
    ("no parent: unchanged", Worker(partition="x"), None, None, {"partition": "x", "time_limit": None}),
    ("head is the parent without a first worker", Worker(), None, HEAD,
     {"partition": "cpu", "time_limit": "3-00:00:00", "cpus_per_task": 4, "mem": "16G", "account": "acct",
      "qos": "long", "signal_before_timeout": "TERM@300"}),
    ("the first worker wins over the head", Worker(), FIRST, HEAD,
     {"partition": "gpu-a", "gpus_per_node": 4, "cpus_per_task": 32, "time_limit": "08:00:00",
      "signal_before_timeout": "TERM@600", "exclude": "gpua-9", "account": None, "qos": None}),
    ("set fields are kept", Worker(partition="gpu-b", gpus_per_node=2), FIRST, HEAD,
     {"partition": "gpu-b", "gpus_per_node": 2, "cpus_per_task": 32}),
    ("nodelist is never inherited (head)", Worker(), None, HEAD, {"nodelist": None}),
    ("nodelist is never inherited (worker)", Worker(), FIRST, HEAD, {"nodelist": None}),
    ("extra directives are never inherited", Worker(), FIRST, HEAD, {"extra_sbatch_directives": ()}),
    ("own extra directives are kept", Worker(extra_sbatch_directives=["--requeue"]), FIRST, HEAD,
     {"extra_sbatch_directives": ("--requeue",)}),
    ("ray_resources are never inherited", Worker(), FIRST, HEAD, {"ray_resources": {}}),
    ("ray_start_args are never inherited", Worker(), FIRST, HEAD, {"ray_start_args": ()}),
    ("rejoin_timeout is never inherited", Worker(), FIRST, HEAD, {"rejoin_timeout": 600.0}),
    ("memory: both forms inherited when neither is set", Worker(), FIRST, HEAD,
     {"mem": None, "mem_per_cpu": "4G"}),
    ("memory: mem replaces an inherited mem_per_cpu", Worker(mem="100G"), FIRST, HEAD,
     {"mem": "100G", "mem_per_cpu": None}),
    ("memory: mem_per_cpu replaces an inherited mem", Worker(mem_per_cpu="2G"), None, HEAD,
     {"mem": None, "mem_per_cpu": "2G"}),
    ("memory: mem inherited from the head", Worker(), None, HEAD, {"mem": "16G", "mem_per_cpu": None}),
    ("time_min inherited with its limit", Worker(), Worker(time_limit="60", time_min="30"), None,
     {"time_limit": "60", "time_min": "30"}),
]


@pytest.mark.parametrize("config,first,head,expected", [row[1:] for row in INHERIT], ids=[r[0] for r in INHERIT])
def test_inheritance(config, first, head, expected):
    result = inherit_worker_config(config, first, head)
    assert isinstance(result, Worker)
    for name, value in expected.items():
        got = getattr(result, name)
        assert (dict(got) if name == "ray_resources" else got) == value, name


def test_inheritance_does_not_change_its_inputs():
    before = (FIRST.to_dict(), HEAD.to_dict())
    inherit_worker_config(Worker(), FIRST, HEAD)
    assert (FIRST.to_dict(), HEAD.to_dict()) == before


def test_an_inherited_config_is_revalidated():
    # A child setting time_min above the inherited limit is refused, naming time_min.
    with pytest.raises(ConfigError) as info:
        inherit_worker_config(Worker(time_min="10:00:00"), None, HEAD.__class__(time_limit="60"))
    assert info.value.field == "time_min"


# ----------------------------------------------------------------- head defaults

def test_head_defaults():
    head = resolve_head_config(Run(partition="cpu", time_limit="1-00:00:00"))
    assert (head.num_nodes, head.cpus_per_task, head.mem, head.gpus_per_node) == (1, 2, "8G", 0)


def test_head_keeps_its_memory_per_cpu():
    head = resolve_head_config(Run(partition="cpu", time_limit="60", mem_per_cpu="1G"))
    assert (head.mem, head.mem_per_cpu) == (None, "1G")


@pytest.mark.parametrize("kwargs,field", [({"time_limit": "60"}, "partition"), ({"partition": "cpu"}, "time_limit")])
def test_head_needs_partition_and_time_limit(kwargs, field):
    with pytest.raises(ConfigError) as info:
        resolve_head_config(Run(**kwargs))
    assert info.value.field == field
