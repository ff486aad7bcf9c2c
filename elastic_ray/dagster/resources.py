"""The Dagster resources: SlurmResource, ComputeResource, SlurmSessionResource.

They hold configuration only; every decision lives elsewhere: the queue
rules and head layouts in ``elastic_ray.config.queue`` (pure), the run scope
in ``run_session``, the Pipes launch in ``pipes``, and everything about
Slurm jobs, heads and elections in the core coordinator.
"""

from __future__ import annotations

import dataclasses
import logging
import typing
from typing import Any, Literal, Optional

import dagster
import pydantic
from pydantic import Field, PrivateAttr

from .. import defaults, knobs
from ..config import SlurmRunAllocationConfig as CoreRunAllocation
from ..config.launcher import RayLauncher as CoreRayLauncher
from ..config.scheduler_choice import SCHEDULER_ENV, scheduler_kind
from ..errors import ConfigError
from ..config.queue import RunLayout, SlurmQueue, plan_run_layout, plan_session_layout
from ..coordinator.session import Head, WorkerAllocation
from .configs import (
    AutoscaleConfig,
    RayLauncher,
    SlurmQueueConfig,
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
    dagster_default,
    dagster_type,
)
from .pipes import run_pipes_payload
from .run_session import RunSession, in_multiprocess_step, open_or_create, run_key, session_root
from .ssh_mode import SSHConnectionResource, open_or_create_remote

log = logging.getLogger("elastic_ray.dagster")


class SlurmResource(dagster.ConfigurableResource):
    """The cluster: its queue defaults and, from outside it, how to reach it over SSH."""

    queue: SlurmQueueConfig = Field(default_factory=SlurmQueueConfig,
                                    description="Default compute request of the site's queue.")
    ssh: Optional[SSHConnectionResource] = Field(
        default=None, description="Reach the cluster over SSH (the SSH mode); unset: this process runs on a "
                                  "host with the Slurm commands and the shared filesystem.")
    remote_base: Optional[str] = Field(
        default=None, description="SSH mode: a directory on the cluster's shared filesystem; run sessions go "
                                  "to remote_base/sessions, and the cluster-side install to remote_base/venv.")
    remote_python: Optional[str] = Field(
        default=None, description="SSH mode: the cluster side's Python with elastic-ray installed "
                                  "(default: remote_base/venv/bin/python).")

    @pydantic.model_validator(mode="after")
    def _check_ssh(self) -> "SlurmResource":
        if (self.ssh is None) != (self.remote_base is None):
            missing = "remote_base" if self.remote_base is None else "ssh"
            raise ConfigError(missing, None, "the SSH mode needs both ssh=SSHConnectionResource(...) and "
                                             "remote_base='/absolute/dir/on/the/cluster'")
        if self.remote_base is not None and not self.remote_base.startswith("/"):
            raise ConfigError("remote_base", self.remote_base, "must be an absolute path on the cluster")
        if self.remote_python is not None and self.ssh is None:
            raise ConfigError("remote_python", self.remote_python, "only used in the SSH mode (set ssh and remote_base)")
        return self

    def core_queue(self) -> SlurmQueue:
        return self.queue.to_core()


def _ssh_of(resource: Any) -> Optional[SlurmResource]:
    """The resource's SlurmResource if it is in the SSH mode."""
    slurm = getattr(resource, "slurm", None)
    return slurm if slurm is not None and slurm.ssh is not None else None


def _queue_of(slurm: Optional[SlurmResource]) -> SlurmQueue:
    return slurm.core_queue() if slurm is not None else SlurmQueue()


class _RunScoped:
    """What both resources share: one session per run, torn down at the run's end."""

    _run_session: Optional[RunSession]

    def scheduler_kind(self) -> str:
        """``mode``, else $ELASTIC_RAY_SCHEDULER: read when a run opens its
        session, so one definition serves a laptop and the cluster; neither
        is a ConfigError naming ``mode`` that says both ways. The SSH mode
        reaches a Slurm cluster by definition: there, unset means 'slurm'."""
        mode = getattr(self, "mode")
        if mode is None and _ssh_of(self) is not None and not knobs.SCHEDULER.is_set():
            return "slurm"
        return scheduler_kind(mode, field="mode")

    def _open(self, context: Any, layout: RunLayout, launcher: CoreRayLauncher,
              queue: SlurmQueue, root: Optional[str], heal_timeout: float) -> RunSession:
        """The run's session. The step that creates it sets the ``autoscale`` policy, if any, and so
        does one that brings it back after its end (a re-execution: the end's teardown stopped the
        policy); a step that opens a live session leaves the policy as the run has it (a payload may
        have changed or stopped it)."""
        fresh = self._run_session is None
        slurm = _ssh_of(self)
        if self._run_session is None and slurm is not None:
            self._run_session = open_or_create_remote(
                slurm.ssh, slurm.remote_base, slurm.remote_python, run_key(context), layout=layout,
                scheduler=self.scheduler_kind(), launcher=launcher, queue=queue, heal_timeout=heal_timeout)
        if self._run_session is None:
            self._run_session = open_or_create(session_root(root), run_key(context), layout=layout,
                                               scheduler=self.scheduler_kind(), launcher=launcher, queue=queue,
                                               heal_timeout=heal_timeout)
        policy = getattr(self, "autoscale")
        if fresh and policy is not None and (self._run_session.created or self._run_session.healed):
            self._run_session.autoscale(policy.to_core())
        return self._run_session

    def _end(self) -> None:
        """At the end of this process's use: tear the session down if this
        process runs the whole run (in-process execution); a multiprocess step
        only lets go, and the orphan sensor ends the jobs once the run ended."""
        run_session, self._run_session = self._run_session, None
        if run_session is None:
            return
        if in_multiprocess_step():
            run_session.close()
            return
        run_session.teardown()


class ComputeResource(dagster.ConfigurableResource, _RunScoped):
    """Run assets' Ray payloads on a run-scoped elastic Ray cluster.

    ``mode="slurm"`` submits to Slurm; ``mode="local"`` uses the embedded
    local scheduler (no Slurm needed), with the same code above it. Unset,
    ``$ELASTIC_RAY_SCHEDULER`` chooses when a run opens its session.
    """

    mode: Optional[str] = Field(
        default=None, description=f"'slurm' (real Slurm) or 'local' (embedded scheduler); unset: ${SCHEDULER_ENV} "
                                  "of the process that opens the run's session (an error if that is unset too).")
    slurm: Optional[SlurmResource] = Field(default=None, description="Queue defaults (required for mode='slurm').")
    allocation_scope: Literal["run"] = Field(default="run", description="Only 'run': one session per Dagster run.")
    default_launcher: RayLauncher = Field(default_factory=RayLauncher, description="How Ray starts on every node.")
    run_allocation: SlurmRunAllocationConfig = Field(
        default_factory=SlurmRunAllocationConfig,
        description="The run's first allocation: hosts the head and computes, or, with ray_head_allocation, "
                    "the first worker allocation.")
    ray_head_allocation: Optional[SlurmRunAllocationConfig] = Field(
        default=None, description="A separate head-only allocation (needs partition and time_limit).")
    session_root: Optional[str] = Field(
        default=None, description="Directory for run sessions on a filesystem all nodes see "
                                  "(default: $ELASTIC_RAY_SESSION_ROOT or ~/.elastic-ray/sessions).")
    head_timeout: float = Field(default=defaults.WAIT_TIMEOUT, gt=0,
                                description="Seconds run() waits for a queued or starting head.")
    autoscale: Optional[AutoscaleConfig] = Field(  # type: ignore[valid-type]
        default=None, description="The run grows and shrinks by itself with this policy (set when the run's "
                                  "session is created; see the Autoscaling page); unset: it does not.")

    _run_session: Optional[RunSession] = PrivateAttr(default=None)

    @pydantic.model_validator(mode="after")
    def _check_layout(self) -> "ComputeResource":
        if self.mode is not None:
            scheduler_kind(self.mode, field="mode")   # 'slurm' or 'local' (Dagster has no Optional[Literal])
        if self.mode == "slurm" and self.slurm is None:
            raise ValueError("slurm: required for mode='slurm' (SlurmResource(queue=SlurmQueueConfig(...)))")
        self.layout()  # ConfigError naming e.g. ray_head_allocation.partition
        return self

    def layout(self) -> RunLayout:
        """The session this resource creates for a run (pure; see config/queue.py)."""
        return plan_run_layout(self.run_allocation.to_core(),
                               None if self.ray_head_allocation is None else self.ray_head_allocation.to_core(),
                               _queue_of(self.slurm))

    def scheduler_kind(self) -> str:
        kind = super().scheduler_kind()
        if kind == "slurm" and self.slurm is None:   # a mode from the environment, checked here
            raise ConfigError("slurm", None, f"required for mode='slurm' (from ${SCHEDULER_ENV}): "
                                             "SlurmResource(queue=SlurmQueueConfig(...))")
        return kind

    def get_run_allocation_session(self, context: Any) -> RunSession:
        """The run's session, created on first use by any step of the run (which sets ``autoscale``'s policy)."""
        return self._open(context, self.layout(), self.default_launcher.to_core(),
                          _queue_of(self.slurm), self.session_root, self.head_timeout)

    def run(self, context: Any, payload_path: str, *, args: typing.Sequence[str] = (),
            extra_env: Optional[typing.Mapping[str, str]] = None, python: Optional[str] = None,
            extras: Optional[typing.Mapping[str, Any]] = None,
            timeout: Optional[float] = None) -> dagster.PipesClientCompletedInvocation:
        """Run a Pipes payload on the run's head; ``.get_results()`` gives what it reported.

        Raises ``SlurmAllocationEnded`` when the head is gone (call
        ``replace_head`` on the session and launch again) and
        ``SlurmStepDrained`` when the head drains during the run.
        """
        return run_pipes_payload(context, self.get_run_allocation_session(context), payload_path, args=args,
                                 extra_env=extra_env, python=python, extras=extras,
                                 head_timeout=self.head_timeout, timeout=timeout)

    def teardown_after_execution(self, context: dagster.InitResourceContext) -> None:
        self._end()


# --------------------------------------------------------------------------
# SlurmSessionResource: the head allocation's fields are the core's, generated
# like the config classes (no hand-kept list), plus the session's own fields.

class _SessionResourceBase(dagster.ConfigurableResource, _RunScoped):
    """An explicitly configured run session: its own fields describe the head
    allocation; ``ray_head_only=True`` with ``worker_allocation`` gives the
    CPU-head layout. The session is created for each run when the resource
    is set up, and the session methods are available on the resource."""

    slurm: Optional[SlurmResource] = Field(default=None, description="Queue defaults.")
    mode: Optional[str] = Field(
        default=None, description=f"'slurm' or 'local' (embedded scheduler); unset: ${SCHEDULER_ENV} (as ComputeResource).")
    ray_head_only: bool = Field(default=False, description="The head advertises no CPUs or GPUs; compute joins "
                                                           "through worker allocations.")
    worker_allocation: Optional[SlurmWorkerAllocationConfig] = Field(
        default=None, description="Submitted with the session, and again whenever no worker is left; later "
                                  "worker allocations inherit its unset fields.")
    launcher: RayLauncher = Field(default_factory=RayLauncher, description="How Ray starts on every node.")
    session_root: Optional[str] = Field(default=None, description="Directory for run sessions (shared FS).")
    head_timeout: float = Field(default=defaults.WAIT_TIMEOUT, gt=0, description="Seconds to wait for a starting head.")
    autoscale: Optional[AutoscaleConfig] = Field(  # type: ignore[valid-type]
        default=None, description="The run grows and shrinks by itself with this policy (set when the run's "
                                  "session is created; see the Autoscaling page); unset: it does not.")

    _run_session: Optional[RunSession] = PrivateAttr(default=None)

    @pydantic.model_validator(mode="after")
    def _check_layout(self) -> Any:
        if self.mode is not None:
            scheduler_kind(self.mode, field="mode")
        self.layout()
        return self

    def head_config(self) -> CoreRunAllocation:
        return CoreRunAllocation(**{f.name: _core_value(getattr(self, f.name))
                                    for f in dataclasses.fields(CoreRunAllocation)})

    def layout(self) -> RunLayout:
        return plan_session_layout(self.head_config(), ray_head_only=self.ray_head_only,
                                   worker_allocation=None if self.worker_allocation is None
                                   else self.worker_allocation.to_core(), queue=_queue_of(self.slurm))

    def setup_for_execution(self, context: dagster.InitResourceContext) -> None:
        self.get_run_allocation_session(context)

    def teardown_after_execution(self, context: dagster.InitResourceContext) -> None:
        self._end()

    def get_run_allocation_session(self, context: Any) -> RunSession:
        return self._open(context, self.layout(), self.launcher.to_core(), _queue_of(self.slurm),
                          self.session_root, self.head_timeout)

    def _session(self) -> RunSession:
        if self._run_session is None:
            raise RuntimeError("SlurmSessionResource: no run session (use it as a resource of a running job)")
        return self._run_session

    # The session methods, as on compute.get_run_allocation_session(context).
    def add_worker_allocation(self, config: Any = None) -> WorkerAllocation:
        return self._session().add_worker_allocation(config)

    def wait_for_worker_allocation(self, handle: WorkerAllocation | str,
                                   timeout: float = defaults.WAIT_TIMEOUT) -> dict[str, str]:
        return self._session().wait_for_worker_allocation(handle, timeout=timeout)

    def remove_worker_allocation(self, handle: WorkerAllocation | str, drain_timeout: float = defaults.DRAIN_TIMEOUT,
                                 wait: bool = True) -> str:
        return self._session().remove_worker_allocation(handle, drain_timeout=drain_timeout, wait=wait)

    @property
    def worker_allocations(self) -> list[WorkerAllocation]:
        return self._session().worker_allocations

    def replace_head(self, timeout: float = defaults.WAIT_TIMEOUT) -> Head:
        return self._session().replace_head(timeout=timeout)

    def run(self, context: Any, payload_path: str, **kwargs: Any) -> dagster.PipesClientCompletedInvocation:
        kwargs.setdefault("head_timeout", self.head_timeout)
        return run_pipes_payload(context, self._session(), payload_path, **kwargs)


def _core_value(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _session_resource_fields() -> dict[str, Any]:
    hints = typing.get_type_hints(CoreRunAllocation)
    return {f.name: (dagster_type(hints[f.name]), dagster_default(f)) for f in dataclasses.fields(CoreRunAllocation)}


SlurmSessionResource = pydantic.create_model("SlurmSessionResource", __base__=_SessionResourceBase,
                                             __module__=__name__, **_session_resource_fields())
SlurmSessionResource.__doc__ = _SessionResourceBase.__doc__
"""The run's session configured field by field: the fields of
``SlurmRunAllocationConfig`` (the head, or the run's
first allocation) plus ``ray_head_only``, ``worker_allocation``, ``mode``,
``launcher``, ``session_root``, ``head_timeout`` and ``autoscale``. Generated from the core
config, so it has exactly its fields and checks."""

__all__ = ["ComputeResource", "SSHConnectionResource", "SlurmResource", "SlurmSessionResource"]
