"""Which scheduler a new session submits to: named by the caller, or from
``ELASTIC_RAY_SCHEDULER``; never a silent default.

A default of ``local`` once made a forgotten argument on a real cluster
start a whole run of emulated jobs on the login node; a default of
``slurm`` makes a laptop try to call sbatch. So the choice is explicit, in
the code (``scheduler="slurm"``) or in the environment of the process that
creates the session (``ELASTIC_RAY_SCHEDULER=slurm``), and without either
the error says both ways.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..errors import ConfigError

SCHEDULER_ENV = "ELASTIC_RAY_SCHEDULER"
SCHEDULER_KINDS = ("local", "slurm")


def scheduler_kind(named: str | None, environ: Mapping[str, str] | None = None, *,
                   field: str = "scheduler") -> str:
    """``named`` when given, else the environment's choice; ConfigError
    naming ``field`` (or the variable) for a bad or missing choice. Pure
    apart from reading ``os.environ`` when ``environ`` is None."""
    if named is not None:
        if named not in SCHEDULER_KINDS:
            raise ConfigError(field, named, "must be 'local' or 'slurm' (or a Scheduler)")
        return named
    value = (os.environ if environ is None else environ).get(SCHEDULER_ENV, "").strip()
    if not value:
        raise ConfigError(field, None, f"no scheduler chosen: pass {field}='slurm' (or 'local'), "
                                       f"or set {SCHEDULER_ENV}=slurm (or local) in the environment")
    if value not in SCHEDULER_KINDS:
        raise ConfigError(SCHEDULER_ENV, value, "must be 'local' or 'slurm'")
    return value
