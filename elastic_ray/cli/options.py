"""From command-line option values to a validated worker config. Pure.

The CLI names options after Slurm's own (``--nodes``, ``--time``); the
config names fields after the published integration (``num_nodes``,
``time_limit``). This module maps one to the other both ways, so a
:class:`~elastic_ray.errors.ConfigError`, which names the field, is
reported against the option the user actually typed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import click

from ..config import SlurmWorkerAllocationConfig
from ..errors import ConfigError

# =============================================================== pure: options -> config

# The CLI option that sets each config field, so a ConfigError (which names
# the field) is reported against what the user actually typed.
FIELD_OPTIONS: Mapping[str, str] = {
    "partition": "--partition",
    "num_nodes": "--nodes",
    "gpus_per_node": "--gpus-per-node",
    "cpus_per_task": "--cpus-per-task",
    "mem": "--mem",
    "mem_per_cpu": "--mem-per-cpu",
    "time_limit": "--time",
    "time_min": "--time-min",
    "signal_before_timeout": "--signal",
    "nodelist": "--nodelist",
    "exclude": "--exclude",
    "qos": "--qos",
    "account": "--account",
    "reservation": "--reservation",
    "constraint": "--constraint",
    "extra_sbatch_directives": "--sbatch-arg",
    "ray_resources": "--ray-resource",
    "ray_start_args": "--ray-start-arg",
    "rejoin_timeout": "--rejoin-timeout",
}


def option_for_field(field: str) -> str:
    """``"ray_resources['a40']"`` -> ``"--ray-resource"``; unknown fields are returned as they are."""
    base = re.split(r"[\[.]", field, maxsplit=1)[0]
    return FIELD_OPTIONS.get(base, field)


def parse_ray_resource(text: str) -> tuple[str, float]:
    """``"accelerator:a40=1"`` -> ``("accelerator:a40", 1.0)``. Raises ValueError with a reason.

    The amount follows the last ``=``, so a name may hold anything but ``=``.
    Reserved names are left to the config's own check, which says why.
    """
    name, sep, amount = text.rpartition("=")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"{text!r} is not NAME=AMOUNT (for example a40=1)")
    # float() would also read digits of other scripts ('١' is 1.0); an amount
    # is written in ASCII, as in every other number the CLI takes.
    if not amount.isascii():
        raise ValueError(f"{text!r}: the amount {amount!r} is not a number")
    try:
        value = float(amount)
    except ValueError:
        raise ValueError(f"{text!r}: the amount {amount!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{text!r}: the amount must be finite and not negative")
    return name, value


def parse_ray_resources(values: Iterable[str]) -> dict[str, float]:
    """Every ``--ray-resource`` given; a name given twice is refused (which one was meant?)."""
    out: dict[str, float] = {}
    for text in values:
        name, amount = parse_ray_resource(text)
        if name in out:
            raise ValueError(f"{name!r} is given twice")
        out[name] = amount
    return out


class OptionError(click.UsageError):
    """A bad option value: exit status 2, message ``--option: what is wrong``."""

    def __init__(self, option: str, message: str, ctx: click.Context | None = None):
        self.option = option
        super().__init__(f"{option}: {message}", ctx=ctx)


def worker_config(options: Mapping[str, Any]) -> SlurmWorkerAllocationConfig:
    """Build the worker config from option values keyed by config field.

    ``None`` (and an empty tuple or mapping) means the option was not given,
    so the field stays unset and is inherited by the session. Raises
    :class:`OptionError` naming the option.
    """
    unknown = sorted(set(options) - set(FIELD_OPTIONS))
    if unknown:
        raise ValueError(f"not config fields: {unknown}")
    if options.get("mem") is not None and options.get("mem_per_cpu") is not None:
        raise OptionError("--mem-per-cpu", "--mem and --mem-per-cpu are exclusive; give one")
    given = {k: v for k, v in options.items() if v is not None and not (isinstance(v, (tuple, list, Mapping))
                                                                        and len(v) == 0)}
    try:
        return SlurmWorkerAllocationConfig(**given)
    except ConfigError as exc:
        raise OptionError(option_for_field(exc.field), f"{exc.value!r}: {exc.reason}") from None
