"""Pick a Scheduler implementation by name.

Kept apart from both implementations so that importing the local scheduler
never needs the Slurm CLI and vice versa.
"""

from __future__ import annotations

import os
from pathlib import Path

from .base import Scheduler

KINDS = ("local", "slurm")


def make_scheduler(kind: str, *, state_dir: str | os.PathLike[str] | None = None,
                   slurm_conf: str | None = None) -> Scheduler:
    """``local`` keeps its state in ``state_dir`` (shared by every process of a
    run); ``slurm`` talks to the Slurm CLI (``slurm_conf`` overrides SLURM_CONF)."""
    if kind == "local":
        from .local import LocalScheduler

        if state_dir is None:
            raise ValueError("state_dir: the local scheduler needs a directory for its state")
        return LocalScheduler(Path(state_dir))
    if kind == "slurm":
        from .slurm import SlurmScheduler

        return SlurmScheduler(slurm_conf=slurm_conf)
    raise ValueError(f"scheduler={kind!r}: must be one of {', '.join(KINDS)}")
