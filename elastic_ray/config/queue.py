"""Queue defaults and how they reach each allocation of a run.

A site describes its usual compute request once (the queue: partition,
walltime, CPUs, GPUs, memory, plus account, QoS and reservation). Those
numbers describe *compute*, so they are applied differently per role:

* a head that only hosts Ray's control plane (``ray_head_allocation``, or a
  session with ``ray_head_only=True``) takes nothing but account, QoS and
  reservation from the queue; its shape comes from the head defaults of
  :func:`~elastic_ray.config.allocation.resolve_head_config`;
* an allocation that computes (the run's first allocation in the default
  layout, and every worker allocation) takes the queue's values for the
  fields it leaves unset;
* a later worker allocation inherits the first worker allocation *as
  resolved*, i.e. after the queue filled it, so the queue never contradicts
  what the run already asked for.

Everything here is pure (no Dagster, no I/O), so the rules are table-tested
in ``tests/test_queue_rules.py`` and shared by any front end.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TypeVar

from ..errors import ConfigError
from .allocation import (
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
    inherit_worker_config,
    resolve_head_config,
    resolve_separate_head_config,
)


@dataclass(frozen=True)
class SlurmQueue:
    """A site's default compute request. ``cpus`` is CPUs per task.

    ``None`` (or an empty partition) leaves the value to Slurm's own defaults.
    """

    partition: str | None = None
    num_nodes: int | None = 1
    time_limit: str | None = "00:30:00"
    cpus: int | None = 2
    gpus_per_node: int | None = 0
    mem: str | None = None
    mem_per_cpu: str | None = None
    signal_before_timeout: str | None = None
    account: str | None = None
    qos: str | None = None
    reservation: str | None = None

    def __post_init__(self) -> None:
        if self.partition == "":
            object.__setattr__(self, "partition", None)
        # One set of value rules: check the queue as the allocation it fills.
        try:
            checked = SlurmRunAllocationConfig(**self.allocation_values())
        except ConfigError as exc:
            field = "cpus" if exc.field == "cpus_per_task" else exc.field
            raise ConfigError(field, exc.value, exc.reason) from None
        for alloc_field, queue_field in QUEUE_FIELD_NAMES.items():
            object.__setattr__(self, queue_field, getattr(checked, alloc_field))

    def allocation_values(self) -> dict[str, object]:
        """The queue's values under the allocation configs' field names."""
        return {alloc: getattr(self, queue) for alloc, queue in QUEUE_FIELD_NAMES.items()}


# Allocation field -> queue field. Only CPUs are named differently.
QUEUE_FIELD_NAMES = {
    "partition": "partition",
    "num_nodes": "num_nodes",
    "time_limit": "time_limit",
    "cpus_per_task": "cpus",
    "gpus_per_node": "gpus_per_node",
    "mem": "mem",
    "mem_per_cpu": "mem_per_cpu",
    "signal_before_timeout": "signal_before_timeout",
    "account": "account",
    "qos": "qos",
    "reservation": "reservation",
}
# What a head-only allocation takes from the queue: who pays and where, never a shape.
QUEUE_HEAD_FIELDS = ("account", "qos", "reservation")
_MEMORY = ("mem", "mem_per_cpu")

C = TypeVar("C", bound=SlurmRunAllocationConfig)


def apply_queue_to_head(config: SlurmRunAllocationConfig, queue: SlurmQueue) -> SlurmRunAllocationConfig:
    """A head-only allocation: only account, QoS and reservation come from the queue."""
    updates = {name: getattr(queue, name) for name in QUEUE_HEAD_FIELDS
               if getattr(config, name) is None and getattr(queue, name) is not None}
    return replace(config, **updates) if updates else config


def apply_queue_to_compute(config: C, queue: SlurmQueue) -> C:
    """An allocation that computes: unset fields take the queue's values.

    Memory is one setting in two forms: if the config sets ``mem`` or
    ``mem_per_cpu``, the queue's memory (either form) is not used.
    """
    values = queue.allocation_values()
    updates = {name: value for name, value in values.items()
               if name not in _MEMORY and value is not None and getattr(config, name) is None}
    if config.mem is None and config.mem_per_cpu is None:
        updates.update({name: values[name] for name in _MEMORY if values[name] is not None})
    return replace(config, **updates) if updates else config


def resolve_worker_allocation(
    config: SlurmWorkerAllocationConfig,
    *,
    queue: SlurmQueue,
    first_worker: SlurmRunAllocationConfig | None,
    head: SlurmRunAllocationConfig | None,
    head_computes: bool,
) -> SlurmWorkerAllocationConfig:
    """Fill a worker allocation's unset fields, in this order of precedence:

    1. its own values;
    2. the session's first worker allocation as resolved, or, without one,
       the head allocation if the head computes (the default layout): both
       already carry the queue's values;
    3. the queue's compute defaults.

    A head-only head is never a parent here: its small CPU shape must not
    leak into a compute request. (The core's own inheritance still fills
    whatever is left unset from the head, as the session promises.)
    """
    if first_worker is not None:
        config = inherit_worker_config(config, first_worker, None)
    elif head is not None and head_computes:
        config = inherit_worker_config(config, None, head)
    return apply_queue_to_compute(config, queue)


@dataclass(frozen=True)
class RunLayout:
    """What to create a run's session with (see ``Session.create``)."""

    head: SlurmRunAllocationConfig
    ray_head_only: bool
    worker_allocation: SlurmWorkerAllocationConfig | None


def _prefixed(where: str, exc: ConfigError) -> ConfigError:
    return ConfigError(f"{where}.{exc.field}", exc.value, exc.reason)


def as_worker(config: SlurmRunAllocationConfig) -> SlurmWorkerAllocationConfig:
    """The same Slurm request as a worker allocation (no Ray extras)."""
    if isinstance(config, SlurmWorkerAllocationConfig):
        return config
    return SlurmWorkerAllocationConfig(**{f.name: getattr(config, f.name) for f in fields(config)})


def plan_run_layout(
    run_allocation: SlurmRunAllocationConfig,
    ray_head_allocation: SlurmRunAllocationConfig | None,
    queue: SlurmQueue,
) -> RunLayout:
    """The two head layouts of a run-scoped session.

    Without ``ray_head_allocation`` the run allocation hosts the head and
    computes (queue defaults apply to it). With it, the head is a separate,
    head-only allocation and the run allocation becomes the first worker
    allocation. Errors name the field with its place, e.g.
    ``ray_head_allocation.partition``.
    """
    if ray_head_allocation is None:
        try:
            head = resolve_head_config(apply_queue_to_compute(run_allocation, queue))
        except ConfigError as exc:
            raise _prefixed("run_allocation", exc) from None
        return RunLayout(head=head, ray_head_only=False, worker_allocation=None)
    try:
        head = resolve_separate_head_config(apply_queue_to_head(ray_head_allocation, queue))
    except ConfigError as exc:
        raise _prefixed("ray_head_allocation", exc) from None
    worker = resolve_worker_allocation(as_worker(run_allocation), queue=queue, first_worker=None, head=head,
                                       head_computes=False)
    return RunLayout(head=head, ray_head_only=True, worker_allocation=worker)


def plan_session_layout(
    head: SlurmRunAllocationConfig,
    *,
    ray_head_only: bool,
    worker_allocation: SlurmWorkerAllocationConfig | None,
    queue: SlurmQueue,
) -> RunLayout:
    """The layout of an explicitly configured session (``SlurmSessionResource``).

    ``ray_head_only=True`` makes ``head`` a one-node, head-only allocation
    (queue: account, QoS, reservation only) and ``worker_allocation`` its
    first worker allocation; otherwise ``head`` computes like any allocation.
    """
    if ray_head_only:
        resolved = resolve_separate_head_config(apply_queue_to_head(head, queue))
    else:
        resolved = resolve_head_config(apply_queue_to_compute(head, queue))
    worker = None
    if worker_allocation is not None:
        try:
            worker = resolve_worker_allocation(worker_allocation, queue=queue, first_worker=None, head=resolved,
                                               head_computes=not ray_head_only)
        except ConfigError as exc:
            raise _prefixed("worker_allocation", exc) from None
    return RunLayout(head=resolved, ray_head_only=ray_head_only, worker_allocation=worker)
