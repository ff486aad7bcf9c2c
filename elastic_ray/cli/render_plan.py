"""``elastic-ray render``: the batch scripts a session file would submit. Pure.

Builds the same job specs ``Session.create`` and ``add_worker_allocation``
build (``coordinator.allocations.submit``), with the same inheritance
(``config.inherit_worker_config``), but writes nothing: the session
directory is only named, and each worker's spec file is shown by the name
it would get, not written.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

from ..config import SlurmWorkerAllocationConfig, inherit_worker_config, resolve_separate_head_config
from ..config.launcher import RayLauncher
from ..config.session_file import SessionFile
from ..coordinator.allocations import submit
from ..protocol.disk import paths
from ..protocol.disk.session_dir import SessionDir
from ..scheduler.render import render_batch_script


@dataclass(frozen=True)
class PlannedJob:
    """One submission of the plan: what it is for, and its batch script."""

    role: str           # "head", "worker+head" (default layout), "worker"
    source: str         # the file's table it comes from: "head", "worker_allocation", "workers[0]"
    script: str
    resubmit_on_failure: int = 0


def plan_jobs(sf: SessionFile, directory: Path, job_name: str | None = None) -> list[PlannedJob]:
    """Every batch script ``Session.from_config`` would submit at start, in order."""
    session = SessionDir(directory)          # names paths only; nothing is created
    name = sf.create_kwargs.get("job_name") or job_name or f"er-{uuid.uuid4().hex[:8]}"
    launcher = sf.create_kwargs.get("launcher") or RayLauncher()
    head = sf.create_kwargs["head"]
    jobs: list[PlannedJob] = []
    spec_no = iter(range(1, 1000))

    def spec_path() -> Path:
        return paths.worker_spec_file(session.path, f"dryrun{next(spec_no)}")

    first: SlurmWorkerAllocationConfig | None = None    # the earliest worker allocation, as resolved
    if sf.create_kwargs.get("ray_head_only", True):
        head = resolve_separate_head_config(head)
        jobs.append(PlannedJob("head", "head", render_batch_script(submit.head_spec(session, name, head, launcher))))
    else:
        first = SlurmWorkerAllocationConfig.from_dict(head.to_dict())
        jobs.append(PlannedJob("worker+head", "head", render_batch_script(
            submit.worker_spec(session, name, first, launcher, spec_path()))))
    template = sf.create_kwargs.get("worker_allocation")
    wanted = ([("worker_allocation", template, 0)] if template is not None else []) + [
        (f"workers[{i}]", w.config, w.resubmit_on_failure) for i, w in enumerate(sf.workers)]
    for source, config, resubmit in wanted:
        # As Session.add_worker_allocation: the parent is the first worker (else the template), else the head.
        resolved = inherit_worker_config(config, first if first is not None else template, head)
        first = first or resolved
        jobs.append(PlannedJob("worker", source, render_batch_script(
            submit.worker_spec(session, name, resolved, launcher, spec_path())), resubmit))
    return jobs
