"""Dagster integration (``pip install elastic-ray[dagster]``).

The only package of elastic-ray that imports Dagster. Names and fields
follow the published dagster-slurm integration where they can; the
differences are listed in docs/dagster.md.
"""

from ..errors import SlurmAllocationEnded, SlurmStepDrained
from .configs import (AutoscaleConfig, AutoscalePoolConfig, RayLauncher, SlurmQueueConfig, SlurmRunAllocationConfig,
                      SlurmWorkerAllocationConfig)
from .resources import ComputeResource, SlurmResource, SlurmSessionResource
from .ssh_mode import SSHConnectionResource
from .run_session import RunSession
from .sensor import build_orphan_sensor

__all__ = [
    "AutoscaleConfig",
    "AutoscalePoolConfig",
    "ComputeResource",
    "RayLauncher",
    "RunSession",
    "SSHConnectionResource",
    "SlurmAllocationEnded",
    "SlurmQueueConfig",
    "SlurmResource",
    "SlurmRunAllocationConfig",
    "SlurmSessionResource",
    "SlurmStepDrained",
    "SlurmWorkerAllocationConfig",
    "build_orphan_sensor",
]
