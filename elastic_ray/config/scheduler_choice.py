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

import enum
from collections.abc import Mapping

from .. import knobs
from ..errors import ConfigError

SCHEDULER_ENV = knobs.SCHEDULER.name


class SchedulerKind(str, enum.Enum):
    """Which scheduler a session submits to: a ``str`` enum, so ``== "slurm"`` keeps working."""

    LOCAL = "local"
    SLURM = "slurm"

    def __str__(self) -> str:   # printed and formatted as the plain value
        return self.value


SCHEDULER_KINDS = tuple(kind.value for kind in SchedulerKind)


def scheduler_kind(named: str | None, environ: Mapping[str, str] | None = None, *,
                   field: str = "scheduler") -> SchedulerKind:
    """``named`` when given, else the environment's choice; ConfigError
    naming ``field`` (or the variable) for a bad or missing choice. Pure
    apart from reading ``os.environ`` when ``environ`` is None."""
    if named is not None:
        if named not in SCHEDULER_KINDS:
            raise ConfigError(field, named, "must be 'local' or 'slurm' (or a Scheduler)")
        return SchedulerKind(named)
    value = knobs.SCHEDULER.read(environ)     # a KnobError (a ConfigError) names the variable
    if value is None:
        raise ConfigError(field, None, f"no scheduler chosen: pass {field}='slurm' (or 'local'), "
                                       f"or set {SCHEDULER_ENV}=slurm (or local) in the environment")
    return SchedulerKind(value)
