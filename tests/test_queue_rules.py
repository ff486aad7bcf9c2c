"""The queue rules and head layouts (elastic_ray.config.queue): pure, table-tested."""

from __future__ import annotations

import pytest

from elastic_ray.config import SlurmRunAllocationConfig as Run
from elastic_ray.config import SlurmWorkerAllocationConfig as Worker
from elastic_ray.config.queue import (
    QUEUE_FIELD_NAMES,
    SlurmQueue,
    apply_queue_to_compute,
    apply_queue_to_head,
    plan_run_layout,
    plan_session_layout,
    resolve_worker_allocation,
)
from elastic_ray.errors import ConfigError

FULL_QUEUE = SlurmQueue(partition="gpu", num_nodes=2, time_limit="08:00:00", cpus=16, gpus_per_node=4,
                        mem="64G", signal_before_timeout="TERM@600", account="acme", qos="high",
                        reservation="maint")


def test_queue_fields_cover_the_queue_dataclass():
    from dataclasses import fields
    assert sorted(QUEUE_FIELD_NAMES.values()) == sorted(f.name for f in fields(SlurmQueue))


@pytest.mark.parametrize("kwargs, field", [
    ({"cpus": 0}, "cpus"),
    ({"time_limit": "soon"}, "time_limit"),
    ({"mem": "lots"}, "mem"),
    ({"mem": "1G", "mem_per_cpu": "1G"}, "mem_per_cpu"),
    ({"gpus_per_node": -1}, "gpus_per_node"),
    ({"signal_before_timeout": "TERM"}, "signal_before_timeout"),
    ({"account": "a b"}, "account"),
    ({"num_nodes": True}, "num_nodes"),
])
def test_queue_errors_name_the_queue_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        SlurmQueue(**kwargs)
    assert err.value.field == field


def test_queue_empty_partition_means_unset_and_values_are_normalised():
    q = SlurmQueue(partition="", mem="4g")
    assert q.partition is None and q.mem == "4G"


# (head allocation, queue) -> expected fields after apply_queue_to_head
HEAD_TABLE = [
    # only account, qos and reservation come from the queue; never a shape
    (Run(partition="cpu", time_limit="3-00:00:00"), FULL_QUEUE,
     {"partition": "cpu", "account": "acme", "qos": "high", "reservation": "maint", "num_nodes": None,
      "cpus_per_task": None, "gpus_per_node": None, "mem": None, "time_limit": "3-00:00:00",
      "signal_before_timeout": None}),
    # the head's own account wins
    (Run(partition="cpu", time_limit="60", account="mine"), FULL_QUEUE, {"account": "mine", "qos": "high"}),
    # an empty queue changes nothing
    (Run(partition="cpu", time_limit="60"), SlurmQueue(), {"account": None, "qos": None, "reservation": None}),
]


@pytest.mark.parametrize("head, queue, expected", HEAD_TABLE)
def test_head_takes_only_account_qos_reservation(head, queue, expected):
    out = apply_queue_to_head(head, queue)
    for name, value in expected.items():
        assert getattr(out, name) == value, name


# (compute allocation, queue) -> expected fields after apply_queue_to_compute
COMPUTE_TABLE = [
    (Run(), FULL_QUEUE, {"partition": "gpu", "num_nodes": 2, "time_limit": "08:00:00", "cpus_per_task": 16,
                         "gpus_per_node": 4, "mem": "64G", "mem_per_cpu": None,
                         "signal_before_timeout": "TERM@600", "account": "acme", "qos": "high",
                         "reservation": "maint"}),
    # own values win, field by field
    (Run(partition="gpu-a", cpus_per_task=8, gpus_per_node=0), FULL_QUEUE,
     {"partition": "gpu-a", "cpus_per_task": 8, "gpus_per_node": 0, "num_nodes": 2}),
    # memory is one setting: mem_per_cpu on the allocation keeps the queue's mem out
    (Run(mem_per_cpu="4G"), FULL_QUEUE, {"mem": None, "mem_per_cpu": "4G"}),
    (Run(mem="8G"), SlurmQueue(mem_per_cpu="2G"), {"mem": "8G", "mem_per_cpu": None}),
    (Run(), SlurmQueue(mem=None, mem_per_cpu="2G"), {"mem": None, "mem_per_cpu": "2G"}),
    # fields the queue does not know stay as they are
    (Run(constraint="a100", nodelist="n1"), FULL_QUEUE, {"constraint": "a100", "nodelist": "n1"}),
    # an unset queue value leaves the field unset (Slurm's default)
    (Run(), SlurmQueue(partition=None, time_limit=None, cpus=None, gpus_per_node=None, num_nodes=None),
     {"partition": None, "time_limit": None, "cpus_per_task": None, "gpus_per_node": None, "num_nodes": None}),
]


@pytest.mark.parametrize("config, queue, expected", COMPUTE_TABLE)
def test_compute_takes_queue_defaults_for_unset_fields(config, queue, expected):
    out = apply_queue_to_compute(config, queue)
    assert type(out) is type(config)
    for name, value in expected.items():
        assert getattr(out, name) == value, name


def test_worker_keeps_its_ray_settings_through_the_queue():
    w = Worker(ray_resources={"accelerator:a40": 1}, ray_start_args=("--num-cpus=8",), rejoin_timeout=300)
    out = apply_queue_to_compute(w, FULL_QUEUE)
    assert isinstance(out, Worker) and dict(out.ray_resources) == {"accelerator:a40": 1.0}
    assert out.ray_start_args == ("--num-cpus=8",) and out.rejoin_timeout == 300


FIRST = Worker(partition="gpu-a", num_nodes=1, gpus_per_node=3, cpus_per_task=32, mem="200G", time_limit="08:00:00",
               account="acme", qos="high", reservation="maint", signal_before_timeout="TERM@600")
HEAD = Run(partition="cpu", num_nodes=1, cpus_per_task=2, mem="8G", gpus_per_node=0, time_limit="3-00:00:00")

# (new worker, first worker, head, head computes) -> expected fields
WORKER_TABLE = [
    # a later worker inherits the first worker as resolved, not the queue
    (Worker(), FIRST, HEAD, False,
     {"partition": "gpu-a", "gpus_per_node": 3, "cpus_per_task": 32, "mem": "200G", "time_limit": "08:00:00"}),
    (Worker(partition="gpu-b", mem_per_cpu="4G"), FIRST, HEAD, False,
     {"partition": "gpu-b", "mem": None, "mem_per_cpu": "4G", "gpus_per_node": 3}),
    # no first worker, head-only head: the queue, never the CPU head's shape
    (Worker(), None, HEAD, False,
     {"partition": "gpu", "cpus_per_task": 16, "gpus_per_node": 4, "mem": "64G", "time_limit": "08:00:00",
      "num_nodes": 2}),
    # no first worker, computing head (default layout): the head, then the queue
    (Worker(), None, Run(partition="gpu-a", cpus_per_task=8, time_limit="60"), True,
     {"partition": "gpu-a", "cpus_per_task": 8, "time_limit": "60", "gpus_per_node": 4, "mem": "64G"}),
    # never inherited: one submission's nodelist and directives, the Ray settings
    (Worker(), Worker(partition="gpu-a", nodelist="n1", extra_sbatch_directives=("--requeue",),
                      ray_resources={"x": 1}, ray_start_args=("--num-cpus=2",), rejoin_timeout=60), HEAD, False,
     {"nodelist": None, "extra_sbatch_directives": (), "ray_start_args": (), "rejoin_timeout": 600.0}),
]


@pytest.mark.parametrize("config, first, head, computes, expected", WORKER_TABLE)
def test_worker_allocation_precedence(config, first, head, computes, expected):
    out = resolve_worker_allocation(config, queue=FULL_QUEUE, first_worker=first, head=head, head_computes=computes)
    assert isinstance(out, Worker)
    for name, value in expected.items():
        assert getattr(out, name) == value, name
    assert dict(out.ray_resources) == dict(config.ray_resources)


def test_run_layout_default_head_computes_with_queue_defaults():
    layout = plan_run_layout(Run(partition="gpu-a", gpus_per_node=3), None, FULL_QUEUE)
    assert layout.ray_head_only is False and layout.worker_allocation is None
    assert layout.head.partition == "gpu-a" and layout.head.gpus_per_node == 3
    assert layout.head.cpus_per_task == 16 and layout.head.mem == "64G" and layout.head.num_nodes == 2
    assert layout.head.time_limit == "08:00:00" and layout.head.account == "acme"


def test_run_layout_cpu_head_takes_head_defaults_and_run_allocation_becomes_first_worker():
    layout = plan_run_layout(Run(partition="GPU-rtx6000", gpus_per_node=3, time_limit="08:00:00",
                                 signal_before_timeout="TERM@600"),
                             Run(partition="cpu", cpus_per_task=4, mem="16G", time_limit="3-00:00:00"), FULL_QUEUE)
    assert layout.ray_head_only is True
    head = layout.head
    assert (head.partition, head.num_nodes, head.cpus_per_task, head.mem, head.gpus_per_node) == \
        ("cpu", 1, 4, "16G", 0)
    assert (head.account, head.qos, head.reservation) == ("acme", "high", "maint")
    assert head.signal_before_timeout is None, "the queue's signal describes compute, not the head"
    worker = layout.worker_allocation
    assert isinstance(worker, Worker)
    assert (worker.partition, worker.gpus_per_node, worker.cpus_per_task, worker.mem, worker.num_nodes) == \
        ("GPU-rtx6000", 3, 16, "64G", 2)


def test_run_layout_cpu_head_defaults():
    head = plan_run_layout(Run(), Run(partition="cpu", time_limit="60"), SlurmQueue(mem="32G", cpus=8)).head
    assert (head.num_nodes, head.cpus_per_task, head.mem, head.gpus_per_node) == (1, 2, "8G", 0)


@pytest.mark.parametrize("head, field", [
    (Run(time_limit="60"), "ray_head_allocation.partition"),
    (Run(partition="cpu"), "ray_head_allocation.time_limit"),
])
def test_run_layout_head_errors_name_the_place(head, field):
    with pytest.raises(ConfigError) as err:
        plan_run_layout(Run(), head, FULL_QUEUE)
    assert err.value.field == field


def test_run_layout_default_needs_a_partition_somewhere():
    with pytest.raises(ConfigError) as err:
        plan_run_layout(Run(), None, SlurmQueue())
    assert err.value.field == "run_allocation.partition"


def test_session_layout_head_only():
    layout = plan_session_layout(Run(partition="cpu", time_limit="60", num_nodes=1), ray_head_only=True,
                                 worker_allocation=Worker(partition="gpu-a"), queue=FULL_QUEUE)
    assert layout.head.cpus_per_task == 2 and layout.head.account == "acme"
    assert layout.worker_allocation.partition == "gpu-a" and layout.worker_allocation.cpus_per_task == 16
    with pytest.raises(ConfigError) as err:
        plan_session_layout(Run(partition="cpu", time_limit="60", num_nodes=2), ray_head_only=True,
                            worker_allocation=None, queue=FULL_QUEUE)
    assert err.value.field == "num_nodes"


def test_session_layout_computing_head_is_parent_of_its_worker():
    layout = plan_session_layout(Run(partition="gpu-a", cpus_per_task=8), ray_head_only=False,
                                 worker_allocation=Worker(num_nodes=3), queue=FULL_QUEUE)
    assert layout.head.cpus_per_task == 8 and layout.head.time_limit == "08:00:00"
    w = layout.worker_allocation
    assert (w.partition, w.cpus_per_task, w.num_nodes, w.gpus_per_node) == ("gpu-a", 8, 3, 4)


def test_later_workers_inherit_from_the_first_worker_as_resolved():
    """The first worker took its memory from the head; a later worker that
    sets nothing inherits that resolved value, not the raw template's gap."""
    from elastic_ray.config import SlurmRunAllocationConfig
    from elastic_ray.config import SlurmWorkerAllocationConfig as W
    from elastic_ray.config import inherit_worker_config
    from elastic_ray.coordinator.allocations.submit import first_worker_config
    from elastic_ray.protocol.disk.records import AllocationRecord, WorkerRecord

    head = SlurmRunAllocationConfig(partition="cpu", time_limit="60", mem="4G", account="proj")
    template = W(partition="gpu-a", gpus_per_node=2)
    first = inherit_worker_config(template, None, head)
    assert first.mem == "4G" and first.account == "proj"
    record = AllocationRecord().with_worker(WorkerRecord(job_id="10", config=first.to_dict(), submitted_at=1.0))
    record = record.with_worker(WorkerRecord(job_id="12", config=W(partition="cpu").to_dict(), submitted_at=2.0))
    parent = first_worker_config(record, template.to_dict())
    assert parent == first
    later = inherit_worker_config(W(), parent, head)
    assert (later.partition, later.gpus_per_node, later.mem, later.account) == ("gpu-a", 2, "4G", "proj")
    assert first_worker_config(AllocationRecord(), template.to_dict()) == template
    assert first_worker_config(AllocationRecord(), None) is None
