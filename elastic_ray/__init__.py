"""elastic-ray: elastic Ray clusters on Slurm.

Worker allocations (Slurm jobs on any partition) join a run's Ray cluster and
leave it again while the run goes on; the head can move when the allocation
that hosts it ends.
"""

from .config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from .errors import (
    AllocationFailed,
    ConfigError,
    ElasticRayError,
    SchedulerError,
    SlurmAllocationEnded,
    SlurmStepDrained,
)

__version__ = "0.1.0"

# Imported on first use: the per-node agent imports this package too, and
# must not pay for the coordinator it never uses.
_LAZY = {"Session": "elastic_ray.coordinator.session", "WorkerAllocation": "elastic_ray.coordinator.session",
         "Head": "elastic_ray.coordinator.session", "RayLauncher": "elastic_ray.config.launcher",
         "PayloadFailed": "elastic_ray.coordinator.drivers"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'elastic_ray' has no attribute {name!r}")

__all__ = [
    "AllocationFailed",
    "Head",
    "PayloadFailed",
    "RayLauncher",
    "Session",
    "WorkerAllocation",
    "ConfigError",
    "ElasticRayError",
    "SchedulerError",
    "SlurmAllocationEnded",
    "SlurmRunAllocationConfig",
    "SlurmStepDrained",
    "SlurmWorkerAllocationConfig",
    "__version__",
]
