"""elastic-ray: elastic Ray clusters on Slurm.

Worker allocations (Slurm jobs on any partition) join a run's Ray cluster and
leave it again while the run goes on; the head can move when the allocation
that hosts it ends.
"""

from typing import TYPE_CHECKING

from .config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from .errors import (
    AllocationFailed,
    ConfigError,
    ControlError,
    ControlTimeout,
    CorruptFileError,
    ElasticRayError,
    PayloadFailed,
    ProtocolError,
    RemoteError,
    RemoteSetupError,
    RemoteVersionMismatch,
    SchedulerError,
    SessionDirError,
    SlurmAllocationEnded,
    SlurmStepDrained,
    SshError,
    TeardownIncomplete,
)

__version__ = "0.1.0"

# Imported on first use: the per-node agent imports this package too, and
# must not pay for the coordinator it never uses.
_LAZY = {"Session": "elastic_ray.coordinator.session", "WorkerAllocation": "elastic_ray.coordinator.session",
         "Head": "elastic_ray.coordinator.session", "RayLauncher": "elastic_ray.config.launcher"}

if TYPE_CHECKING:
    # What the lazy names are, for IDEs and type checkers; never run. They see
    # no __getattr__ either, so a misspelt name is reported, not taken as Any.
    from .config.launcher import RayLauncher
    from .coordinator.handles import Head, WorkerAllocation
    from .coordinator.session import Session
else:
    def __getattr__(name: str) -> object:
        if name in _LAZY:
            import importlib

            return getattr(importlib.import_module(_LAZY[name]), name)
        raise AttributeError(f"module 'elastic_ray' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy names too, so that completion and dir() list what __getattr__ gives.
    return sorted(set(globals()) | set(__all__))


# The errors a program meets and catches (docs/api/errors.md); the others
# (the agent's, the control channel's frames, ...) are in elastic_ray.errors.
__all__ = [
    "AllocationFailed",
    "ConfigError",
    "ControlError",
    "ControlTimeout",
    "CorruptFileError",
    "ElasticRayError",
    "Head",
    "PayloadFailed",
    "ProtocolError",
    "RayLauncher",
    "RemoteError",
    "RemoteSetupError",
    "RemoteVersionMismatch",
    "SchedulerError",
    "Session",
    "SessionDirError",
    "SlurmAllocationEnded",
    "SlurmRunAllocationConfig",
    "SlurmStepDrained",
    "SlurmWorkerAllocationConfig",
    "SshError",
    "TeardownIncomplete",
    "WorkerAllocation",
    "__version__",
]
