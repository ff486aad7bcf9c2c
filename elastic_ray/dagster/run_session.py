"""One session per Dagster run: where it lives, who creates it, who ends it.

A run's steps may run in one process or in many (Dagster's multiprocess
executor), so the session is found by a key every step computes alike: the
run's *root* run id, which a retried or re-executed run shares with its
original, so it finds the session (and the Slurm jobs) the original left.
The first step to arrive creates the session under a file lock next to the
session directory; every other step, in any process, opens it.

Dagster-free on purpose except for reading the run id off a context, so the
rules here stay testable without running assets.
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from .. import defaults, knobs
from ..config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from ..config.launcher import RayLauncher
from ..config.queue import RunLayout, SlurmQueue, resolve_worker_allocation
from ..coordinator.facade import RunControl
from ..coordinator.session import Head, Session, WorkerAllocation
from ..protocol.disk import paths
from ..scheduler.base import JobState

log = logging.getLogger("elastic_ray.dagster")

SESSION_ROOT_ENV = knobs.SESSION_ROOT.name
LOCK_TIMEOUT = 300.0
# The marker the orphan sensor leaves after tearing a session down
# (paths.ended_marker); reopening the session (a re-execution) removes it.


def session_root(configured: str | None) -> Path:
    """The directory that holds run sessions: the configured one, else
    ``$ELASTIC_RAY_SESSION_ROOT``, else ``~/.elastic-ray/sessions`` (home
    directories are on the shared filesystem on most clusters)."""
    if configured:
        return Path(configured).expanduser().absolute()
    env = knobs.SESSION_ROOT.read()
    if env:
        return Path(env).expanduser().absolute()
    return Path.home() / ".elastic-ray" / "sessions"


def run_key(context: Any) -> str:
    """The root run id of the run ``context`` belongs to (asset, op or resource context)."""
    run = getattr(context, "run", None)
    if run is None:
        raise ValueError("context: no Dagster run attached (build it with a run, or use materialize())")
    return run.root_run_id or run.run_id


def job_name_for(key: str) -> str:
    """Slurm job name of a run's jobs: short, and the same in every step."""
    return f"er-{key.replace('-', '')[:12]}"


def in_multiprocess_step() -> bool:
    """True in a step child of Dagster's multiprocess executor, which ends
    after its own step: tearing the session down there would end the run's
    cluster under the steps still to come."""
    return multiprocessing.parent_process() is not None


@dataclass
class RunSession:
    """The object assets program against: the core session plus the queue
    rules for new worker allocations. Same methods in every process."""

    session: RunControl   # a Session here, a RemoteSession in the SSH mode (dagster/ssh_mode.py)
    queue: SlurmQueue
    created: bool = False
    healed: bool = False  # opened with its head gone (a re-execution after the run's end), and given a head

    # -- views
    @property
    def path(self) -> Path:
        return self.session.path

    @property
    def job_name(self) -> str:
        return self.session.job_name

    @property
    def head(self) -> Head | None:
        return self.session.head

    @property
    def worker_allocations(self) -> list[WorkerAllocation]:
        return self.session.worker_allocations

    # -- worker allocations
    def resolve_worker_config(self, config: Any) -> SlurmWorkerAllocationConfig:
        """The queue rule for a new worker allocation (see config/queue.py)."""
        from .configs import core_of

        core = core_of(config, SlurmWorkerAllocationConfig, "config") if config is not None \
            else SlurmWorkerAllocationConfig()
        info, rec = self.session.info, self.session.record()
        first = None
        if info.worker_allocation is not None:
            first = SlurmWorkerAllocationConfig.from_dict(info.worker_allocation)
        elif rec.workers:
            first = SlurmWorkerAllocationConfig.from_dict(rec.workers[min(rec.workers, key=int)].config)
        return resolve_worker_allocation(core, queue=self.queue, first_worker=first,
                                         head=SlurmRunAllocationConfig.from_dict(info.head),
                                         head_computes=not info.ray_head_only)

    def add_worker_allocation(self, config: Any = None) -> WorkerAllocation:
        """Submit a worker allocation (Dagster or core config); returns on submission."""
        return self.session.add_worker_allocation(self.resolve_worker_config(config))

    def wait_for_worker_allocation(self, handle: WorkerAllocation | str, timeout: float = defaults.WAIT_TIMEOUT,
                                   progress: Callable[[str], None] | None = None) -> dict[str, str]:
        return self.session.wait_for_worker_allocation(handle, timeout=timeout, progress=progress)

    def remove_worker_allocation(self, handle: WorkerAllocation | str, drain_timeout: float = defaults.DRAIN_TIMEOUT,
                                 wait: bool = True, progress: Callable[[str], None] | None = None) -> JobState:
        return self.session.remove_worker_allocation(handle, drain_timeout=drain_timeout, wait=wait,
                                                     progress=progress)

    def autoscale(self, policy: Any) -> None:
        """Scale the run by itself with ``policy`` (None: stop); see ``Session.autoscale``."""
        self.session.autoscale(policy)

    # -- head
    def replace_head(self, timeout: float = defaults.WAIT_TIMEOUT, progress: Callable[[str], None] | None = None) -> Head:
        return self.session.replace_head(timeout=timeout, progress=progress)

    def ready_head(self, timeout: float = defaults.WAIT_TIMEOUT, progress: Callable[[str], None] | None = None) -> Head:
        """The current head once it is healthy, never electing (see :mod:`coordinator.head.ready`)."""
        return self.session.ready_head(timeout=timeout, progress=progress)

    def head_is_lost(self) -> bool:
        """Whether the head must be replaced now (ended, stopped, draining, replaced)."""
        return self.session.head_is_lost()

    # -- end
    def teardown(self, extra: Sequence[str] | None = None, *, wait: bool = False,
                 timeout: float = defaults.TEARDOWN_TIMEOUT, progress: Progress | None = None) -> tuple[str, ...]:
        """End the run's jobs (and ``extra`` ids of it); returns the ids cancelled
        (with ``wait``, once Slurm has let go of them: ``Session.teardown``)."""
        return self.session.teardown(list(extra) if extra is not None else None, wait=wait, timeout=timeout,
                                     progress=progress)

    def close(self) -> None:
        self.session.close()


def open_or_create(root: Path, key: str, *, layout: RunLayout, scheduler: str, launcher: RayLauncher,
                   queue: SlurmQueue, heal_timeout: float = defaults.WAIT_TIMEOUT) -> RunSession:
    """The run's session, created by the first caller of any process.

    On open, a head that is gone is replaced at once (a retried run whose
    supervisor died elects a running worker allocation, or submits a head
    shaped like the first one).
    """
    root.mkdir(parents=True, exist_ok=True)
    path = root / key
    with FileLock(str(paths.creation_lock_file(path)), timeout=LOCK_TIMEOUT):
        if paths.session_file(path).exists():
            session, created = Session.open(path, supervise=True), False
        else:
            session = Session.create(path, head=layout.head, scheduler=scheduler, launcher=launcher,
                                     ray_head_only=layout.ray_head_only, worker_allocation=layout.worker_allocation,
                                     job_name=job_name_for(key), supervise=True)
            created = True
        paths.ended_marker(path).unlink(missing_ok=True)
    run_session = RunSession(session, queue, created)
    log.info("event=run_session session=%s path=%s created=%s", session.job_name, path, created)
    if not created and run_session.head_is_lost():
        log.info("event=run_session_heal session=%s head=%s", session.job_name, session.record().head_job)
        run_session.replace_head(timeout=heal_timeout)
        run_session.healed = True
    return run_session
