"""What a user asks for, validated before anything is submitted.

``allocation`` holds the Slurm allocation configs with their inheritance and
head-default rules (pure functions); ``launcher`` holds :class:`RayLauncher`,
how Ray starts on every node; ``slurm_values`` is the one vocabulary of Slurm
value forms (times, memory, signals, job ids and names, host lists) that the
configs, the records and the scheduler backends all check against.
"""

from .allocation import (
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
    inherit_worker_config,
    rejoin_timeout_warning,
    resolve_head_config,
    resolve_separate_head_config,
)
from .launcher import RayLauncher

__all__ = [
    "RayLauncher",
    "SlurmRunAllocationConfig",
    "SlurmWorkerAllocationConfig",
    "inherit_worker_config",
    "rejoin_timeout_warning",
    "resolve_head_config",
    "resolve_separate_head_config",
]
