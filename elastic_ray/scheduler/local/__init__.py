"""The embedded local scheduler: Slurm's job life emulated with local processes.

Each allocation is a group of local agent processes on 127.0.0.x with
pending, walltime, the pre-walltime signal, cancel and job states emulated,
so that everything above the :class:`~elastic_ray.scheduler.base.Scheduler`
interface runs the same code on a laptop as on a real cluster.

Modules: ``scheduler`` (the :class:`LocalScheduler` facade), ``cluster``
(nodes and placement, pure), ``record`` (a job's record and its event
transitions, pure), ``store`` (records on disk, shared by processes), ``job``
(the detached per-job supervisor process) and ``procs`` (process groups by
PID).
"""

from .cluster import LocalCluster
from .scheduler import LocalScheduler, resolve_output

__all__ = ["LocalCluster", "LocalScheduler", "resolve_output"]
