"""Dagster config classes generated from the core's frozen dataclasses.

The core configs (``elastic_ray.config``) are the one definition of every
field, its default and its checks. Dagster wants pydantic models, so each
Dagster class here is *generated* from ``dataclasses.fields`` of its core
class: adding a field to the core adds it to Dagster, with nothing to keep in
step by hand. Validation is the core's too: a model validator builds the core
object, and the core's ``ConfigError`` (a ``ValueError`` naming the field)
becomes pydantic's validation error. ``to_core()`` gives the core object.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Optional, Union

import dagster
import pydantic

from ..config import SlurmRunAllocationConfig as CoreRunAllocation
from ..config import SlurmWorkerAllocationConfig as CoreWorkerAllocation
from ..config.autoscale import AutoscalePolicy as CorePolicy
from ..config.autoscale import Pool as CorePool
from ..config.launcher import RayLauncher as CoreRayLauncher
from ..config.queue import SlurmQueue as CoreQueue


def dagster_type(hint: Any) -> Any:
    """Map a core annotation to one Dagster's config system accepts:
    tuples become lists, read-only mappings become dicts, ``X | None`` stays optional."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (Union, getattr(__import__("types"), "UnionType", Union)):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and len(args) == 2:
            return Optional[dagster_type(inner[0])]
        raise TypeError(f"unsupported union {hint!r}")
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return list[dagster_type(args[0])]
    if origin in (Mapping, dict) or origin is typing.Mapping:
        return dict[dagster_type(args[0]), dagster_type(args[1])]
    return hint


def dagster_default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        kind = list if isinstance(value, tuple) else dict if isinstance(value, Mapping) else None
        if kind is None:
            return pydantic.Field(default_factory=f.default_factory)  # type: ignore[misc]
        return pydantic.Field(default_factory=lambda: kind(f.default_factory()))  # type: ignore[misc]
    if f.default is dataclasses.MISSING:
        return ...
    if isinstance(f.default, tuple):
        return pydantic.Field(default_factory=lambda: list(f.default))
    return f.default


def _to_core_value(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(value)
    return value


class _CoreBacked(dagster.Config):
    """Shared behaviour of every generated class (the core class is set per subclass)."""

    __core__: typing.ClassVar[type]
    __core_fields__: typing.ClassVar[tuple[str, ...]]

    def to_core(self) -> Any:
        """The core object these values describe (validated by the core)."""
        return self.__core__(**{name: _to_core_value(getattr(self, name)) for name in self.__core_fields__})

    @pydantic.model_validator(mode="after")
    def _core_checks(self) -> Any:
        self.to_core()  # raises the core's ConfigError, a ValueError naming the field
        return self

    @classmethod
    def from_core(cls, core: Any) -> Any:
        values = {}
        for name in cls.__core_fields__:
            value = getattr(core, name)
            values[name] = list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) \
                else value
        return cls(**values)


def generate_config(name: str, core: type, *, base: type = _CoreBacked, doc: str | None = None) -> type:
    """A ``dagster.Config`` subclass with the fields of dataclass ``core``.

    Fields already defined by ``base`` (when ``base`` was itself generated
    from a parent core class) are not repeated.
    """
    hints = typing.get_type_hints(core)
    inherited = set(getattr(base, "model_fields", {}))
    definitions: dict[str, Any] = {}
    for f in dataclasses.fields(core):
        if f.name in inherited:
            continue
        definitions[f.name] = (dagster_type(hints[f.name]), dagster_default(f))
    model = pydantic.create_model(name, __base__=base, __module__=__name__, **definitions)
    model.__core__ = core
    model.__core_fields__ = tuple(f.name for f in dataclasses.fields(core))
    model.__doc__ = doc or core.__doc__
    return model


SlurmRunAllocationConfig = generate_config("SlurmRunAllocationConfig", CoreRunAllocation)
SlurmWorkerAllocationConfig = generate_config("SlurmWorkerAllocationConfig", CoreWorkerAllocation,
                                              base=SlurmRunAllocationConfig)
RayLauncher = generate_config("RayLauncher", CoreRayLauncher)
SlurmQueueConfig = generate_config("SlurmQueueConfig", CoreQueue)


class AutoscalePoolConfig(dagster.Config):
    """One pool of an autoscaling policy: the worker allocation it submits and how many at once."""

    config: SlurmWorkerAllocationConfig  # type: ignore[valid-type]
    max_allocations: int = 1

    def to_core(self) -> CorePool:
        return CorePool(self.config.to_core(), self.max_allocations)  # type: ignore[attr-defined]


class _AutoscaleBase(_CoreBacked):
    def to_core(self) -> Any:
        from ..errors import ConfigError

        values = {name: getattr(self, name) for name in self.__core_fields__}
        pools = []
        for i, pool in enumerate(values["pools"]):
            try:
                pools.append(pool.to_core())
            except ConfigError as exc:   # named by its place: pools[i].max_allocations
                raise ConfigError(f"pools[{i}].{exc.field}", exc.value, exc.reason) from None
        return CorePolicy(**{**values, "pools": tuple(pools)})


def _autoscale_config() -> type:
    """The policy's fields generated from the core (``pools`` a list of :class:`AutoscalePoolConfig`)."""
    hints = typing.get_type_hints(CorePolicy)
    definitions: dict[str, Any] = {"pools": (list[AutoscalePoolConfig], ...)}
    for f in dataclasses.fields(CorePolicy):
        if f.name != "pools":
            definitions[f.name] = (dagster_type(hints[f.name]), dagster_default(f))
    model = pydantic.create_model("AutoscaleConfig", __base__=_AutoscaleBase, __module__=__name__, **definitions)
    model.__core__ = CorePolicy
    model.__core_fields__ = tuple(f.name for f in dataclasses.fields(CorePolicy))
    model.__doc__ = CorePolicy.__doc__
    return model


AutoscaleConfig = _autoscale_config()


def core_of(value: Any, core: type, field: str) -> Any:
    """Accept either the Dagster config or the core object for ``field``."""
    if value is None or isinstance(value, core):
        return value
    to_core = getattr(value, "to_core", None)
    if to_core is not None:
        converted = to_core()
        if isinstance(converted, core):
            return converted
    from ..errors import ConfigError

    raise ConfigError(field, value, f"must be a {core.__name__}")
