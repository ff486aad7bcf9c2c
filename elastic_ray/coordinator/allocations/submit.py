"""Turn a session's configs into the JobSpecs that launch the agents.

Pure apart from writing the worker spec file: what runs on each node is
``python -m elastic_ray.agent run --session DIR --role ROLE [--spec FILE]``
with the launcher's ``python_executable``, else the interpreter of this very
environment (the session directory and the environment are on a filesystem
every node sees), so a batch script never depends on what PATH holds on a
compute node.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

from ... import knobs
from ...config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from ...config.launcher import RayLauncher
from ...atomic import atomic_write_json
from ...protocol.disk import paths
from ...protocol.disk.records import AllocationRecord
from ...protocol.disk.session_dir import SessionDir
from ...scheduler.base import JobSpec


def agent_argv(session: SessionDir, role: str, spec: Path | None = None,
               python: str | None = None) -> tuple[str, ...]:
    argv = [python or sys.executable, "-m", "elastic_ray.agent", "run", "--session", str(session.path),
            "--role", role]
    if spec is not None:
        argv += ["--spec", str(spec)]
    return tuple(argv)


def agent_env(launcher: RayLauncher, forwarded: Mapping[str, str] | None = None,
              environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment plus the session's ``ELASTIC_AGENT_*`` tuning.

    ``forwarded`` is what the session recorded when it was created
    (``SessionInfo.agent_env``: the creating process's ``ELASTIC_AGENT_*``
    variables), so every job of the run, submitted by any process (a
    restarted supervisor, a resubmission, the SSH mode's detached
    supervisor), configures its nodes alike. sbatch hands a job the whole
    environment of its submitter (the local scheduler does the same), so a
    variable of the submitting process (``environ``, default this one's)
    that the session did not record is exported blank, which every reader
    takes for unset, unless the launcher's env sets it. None (a session
    created before it was recorded, or a plan with no session yet) takes
    this process's own, as every submission did before.
    """
    env = dict(launcher.env)
    if forwarded is None:
        env.update(knobs.forwarded_agent_env(environ))
        return env
    env.update({name: "" for name in knobs.forwarded_agent_env(environ)
                if name not in forwarded and name not in launcher.env})
    env.update(forwarded)
    return env


def head_spec(session: SessionDir, job_name: str, head: SlurmRunAllocationConfig,
              launcher: RayLauncher, forwarded: Mapping[str, str] | None = None) -> JobSpec:
    return JobSpec(job_name=job_name, role="head", allocation=head,
                   node_argv=agent_argv(session, "head", python=launcher.python_executable),
                   workdir=session.path, output=str(paths.job_output_template(session.path, "head")),
                   env=agent_env(launcher, forwarded), pre_start_commands=launcher.pre_start_commands)


def write_worker_spec(session: SessionDir, config: SlurmWorkerAllocationConfig, *,
                      host_head: bool = False) -> Path:
    """The worker's resolved config, written before submission so the agent
    never races the coordinator's record of the job. ``host_head``: the
    allocation's first node hosts the run's head from the start (the
    default layout, where the run's first allocation hosts the head and
    computes)."""
    path = paths.worker_spec_file(session.path, uuid.uuid4().hex[:12])
    path.parent.mkdir(mode=0o700, exist_ok=True)
    body: dict = {"config": config.to_dict()}
    if host_head:
        body["host_head"] = True
    atomic_write_json(path, body, mode=0o644)
    return path


def worker_spec(session: SessionDir, job_name: str, config: SlurmWorkerAllocationConfig,
                launcher: RayLauncher, spec_path: Path, forwarded: Mapping[str, str] | None = None) -> JobSpec:
    return JobSpec(job_name=job_name, role="worker", allocation=config,
                   node_argv=agent_argv(session, "worker", spec_path, python=launcher.python_executable),
                   workdir=session.path, output=str(paths.job_output_template(session.path, "worker")),
                   env=agent_env(launcher, forwarded), pre_start_commands=launcher.pre_start_commands)


def first_worker_config(record: AllocationRecord,
                        template: Mapping | None) -> SlurmWorkerAllocationConfig | None:
    """The session's first worker allocation AS RESOLVED, which later worker
    allocations inherit from. Pure.

    That is the earliest worker allocation in the record (its config was
    resolved when it was submitted, so it carries what it took from the
    head); before any was submitted, the session's worker template.
    Inheriting from the raw template instead would lose what the first
    worker inherited.
    """
    if record.workers:
        earliest = min(record.workers, key=int)
        return SlurmWorkerAllocationConfig.from_dict(record.workers[earliest].config)
    if template is not None:
        return SlurmWorkerAllocationConfig.from_dict(template)
    return None
