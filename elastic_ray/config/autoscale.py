"""The autoscaler's policy: which shapes it may submit, how many, and when it sheds.

Pure records, checked when they are built: a bad value raises a
:class:`~elastic_ray.errors.ConfigError` naming the field
(``pools[1].max_allocations``, ``idle_timeout``...), and nothing is stored.
The policy is stored in the session directory as :meth:`AutoscalePolicy.to_dict`
gives it, so any process of the run (the one that holds the autoscaler's
lease) reads the same policy back with :meth:`AutoscalePolicy.from_dict`.

The decisions made from it are :mod:`elastic_ray.autoscale.decide`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..errors import ConfigError
from .allocation import SlurmWorkerAllocationConfig

#: Seconds an unserved demand must have been pending before anything is
#: submitted for it: a task that a free CPU takes a moment later is no
#: reason to ask Slurm for a node (see ``decide`` on hysteresis).
DEFAULT_DEMAND_DELAY = 1.0
#: Seconds a queued submission must have been unneeded before it is
#: cancelled: demand that comes back within this time finds it still queued.
DEFAULT_CANCEL_DELAY = 30.0


@dataclass(frozen=True)
class Pool:
    """One shape the autoscaler may submit: a worker allocation config and how
    many allocations of it the run may hold at once (queued ones included)."""

    config: SlurmWorkerAllocationConfig
    max_allocations: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.config, SlurmWorkerAllocationConfig):
            raise ConfigError("config", self.config, "must be a SlurmWorkerAllocationConfig")
        _check_count("max_allocations", self.max_allocations, 1)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "max_allocations": self.max_allocations}

    @classmethod
    def from_dict(cls, data: Any) -> "Pool":
        data = _mapping("pool", data, {"config", "max_allocations"})
        if "config" not in data:
            raise ConfigError("config", None, "is required: the worker allocation this pool submits")
        try:
            config = SlurmWorkerAllocationConfig.from_dict(data["config"])
        except ConfigError as exc:   # named by its place in the dict (and a TOML file): pools[i].config.<key>
            where = "config" if exc.field == SlurmWorkerAllocationConfig.__name__ else f"config.{exc.field}"
            raise ConfigError(where, exc.value, exc.reason) from None
        return cls(config=config, max_allocations=data.get("max_allocations", 1))


@dataclass(frozen=True)
class AutoscalePolicy:
    """How a session grows and shrinks by itself (``Session.autoscale(policy)``).

    ``pools``: the shapes it may submit, in the order of preference used when
    Slurm's start estimates do not tell them apart. ``min_allocations`` /
    ``max_nodes``: bounds over the allocations it submitted. ``idle_timeout``:
    seconds an allocation's nodes ran nothing before it is drained.
    ``backlog``: submissions of one pool queued in Slurm at once, at most.
    ``replace_before_walltime``: seconds before a busy allocation's walltime
    at which a replacement is submitted (0: never). ``demand_delay`` and
    ``cancel_delay``: the hysteresis (seconds demand waits before a submit,
    seconds a queued submission stays unneeded before it is cancelled).
    ``race``: when no pool's start is known, submit to every pool that fits
    (each within its bounds) and cancel the others once one starts.
    """

    pools: tuple[Pool, ...]
    min_allocations: int = 0
    max_nodes: int | None = None
    idle_timeout: float = 300.0
    backlog: int = 1
    replace_before_walltime: float = 900.0
    demand_delay: float = DEFAULT_DEMAND_DELAY
    cancel_delay: float = DEFAULT_CANCEL_DELAY
    race: bool = False

    def __post_init__(self) -> None:
        pools = self.pools
        if isinstance(pools, (str, bytes)) or not isinstance(pools, Sequence):
            raise ConfigError("pools", pools, "must be a list of Pool")
        if not pools:
            raise ConfigError("pools", [], "must name at least one Pool: the shapes the autoscaler may submit")
        for i, pool in enumerate(pools):
            if not isinstance(pool, Pool):
                raise ConfigError(f"pools[{i}]", pool, "must be a Pool")
        object.__setattr__(self, "pools", tuple(pools))
        _check_count("min_allocations", self.min_allocations, 0)
        if self.max_nodes is not None:
            _check_count("max_nodes", self.max_nodes, 1)
        ceiling = sum(p.max_allocations for p in self.pools)
        if self.min_allocations > ceiling:
            raise ConfigError("min_allocations", self.min_allocations,
                              f"is more than the pools' max_allocations allow together ({ceiling})")
        if self.max_nodes is not None:
            smallest = min(_nodes(p) for p in self.pools)
            if self.max_nodes < smallest:
                raise ConfigError("max_nodes", self.max_nodes,
                                  f"is below the smallest pool's num_nodes ({smallest}): nothing could be submitted")
            if self.min_allocations * smallest > self.max_nodes:
                raise ConfigError("min_allocations", self.min_allocations,
                                  f"needs at least {self.min_allocations * smallest} nodes, above "
                                  f"max_nodes={self.max_nodes}")
        _check_count("backlog", self.backlog, 1)
        for name in ("idle_timeout", "demand_delay", "cancel_delay"):
            _check_seconds(name, getattr(self, name), allow_zero=name != "idle_timeout")
        _check_seconds("replace_before_walltime", self.replace_before_walltime, allow_zero=True)
        if not isinstance(self.race, bool):
            raise ConfigError("race", self.race, "must be true or false")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        out["pools"] = [p.to_dict() for p in self.pools]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "AutoscalePolicy":
        """The policy of :meth:`to_dict`'s value (a stored policy, a session
        file's ``[autoscale]`` table, Dagster run config); unknown keys are refused."""
        data = _mapping("autoscale", data, {f.name for f in fields(cls)})
        raw = data.get("pools")
        if isinstance(raw, (str, bytes)) or not isinstance(raw, Sequence):
            raise ConfigError("pools", raw, "must be a list of pools")
        pools = []
        for i, item in enumerate(raw):
            try:
                pools.append(Pool.from_dict(item))
            except ConfigError as exc:
                raise ConfigError(f"pools[{i}].{exc.field}", exc.value, exc.reason) from None
        return cls(**{**data, "pools": tuple(pools)})


def _nodes(pool: Pool) -> int:
    return pool.config.num_nodes or 1


def _mapping(what: str, data: Any, known: set[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(what, data, "must be a mapping")
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(unknown[0], data[unknown[0]], f"is not a field of {what} (known: {', '.join(sorted(known))})")
    return data


def _check_count(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, "must be a whole number")
    if value < minimum:
        raise ConfigError(name, value, f"must be {minimum} or more")


def _check_seconds(name: str, value: Any, *, allow_zero: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(name, value, "must be a number of seconds")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(name, value, "must be a finite number of seconds " + ("(0 or more)" if allow_zero
                                                                                 else "above zero"))


__all__ = ["AutoscalePolicy", "Pool", "DEFAULT_DEMAND_DELAY", "DEFAULT_CANCEL_DELAY"]
