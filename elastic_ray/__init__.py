"""elastic-ray: elastic Ray clusters on Slurm.

Worker allocations (Slurm jobs on any partition) join a run's Ray cluster and
leave it again while the run goes on; the head can move when the allocation
that hosts it ends.
"""

from .config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from .errors import (
    ConfigError,
    ElasticRayError,
    SchedulerError,
    SlurmAllocationEnded,
    SlurmStepDrained,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ElasticRayError",
    "SchedulerError",
    "SlurmAllocationEnded",
    "SlurmRunAllocationConfig",
    "SlurmStepDrained",
    "SlurmWorkerAllocationConfig",
    "__version__",
]
