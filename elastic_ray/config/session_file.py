"""A session described in a TOML file: ``elastic-ray session create --config``
and ``Session.from_config``. Pure apart from reading the file.

The file maps one to one onto the keyword arguments of ``Session.create``
(top-level keys, ``[head]``, ``[launcher]``, ``[worker_allocation]``) plus
``[[workers]]``: worker allocations added right after the session is
created, and ``[autoscale]``: the autoscaler's policy
(``AutoscalePolicy.from_dict``'s form, ``[[autoscale.pools]]`` with a
``config`` table each), set right after that. Everything is checked here, before anything is created or
submitted, and every error names the file and the dotted key
(``session.toml: launcher.port_strategy: must be one of ...``), so a typo
(``partiton``) is an error rather than a silently unset field.

A key left out is not passed on: ``Session.create`` applies its own default
(``scheduler`` included, whose rule lives there).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, packaged (a dependency there)
    import tomli as tomllib  # type: ignore[no-redef]

from .. import knobs
from ..errors import ConfigError
# Defined in errors (its docstring says why); ``X as X`` keeps it importable from here, for type checkers too.
from ..errors import SessionFileError as SessionFileError
from .autoscale import AutoscalePolicy
from .allocation import (
    SlurmRunAllocationConfig,
    SlurmWorkerAllocationConfig,
    resolve_separate_head_config,
)
from .launcher import RayLauncher
from .scheduler_choice import SCHEDULER_KINDS
from .slurm_values import check_job_name

#: The default session directory of every command that takes one.
SESSION_ENV = knobs.SESSION.name

# Top-level scalar keys: name -> (accepted types, what the error says).
_TOP: Mapping[str, tuple[tuple[type, ...], str]] = {
    "path": ((str,), "a path (string)"),
    "scheduler": ((str,), f"one of {', '.join(SCHEDULER_KINDS)}"),
    "job_name": ((str,), "a string"),
    "ray_head_only": ((bool,), "true or false"),
    "local_state_dir": ((str,), "a path (string)"),
    "claim_period": ((int, float), "a number of seconds"),
    "supervise_interval": ((int, float), "a number of seconds"),
}
_TABLES = ("head", "launcher", "worker_allocation")
_WORKER_EXTRA = ("resubmit_on_failure",)


@dataclass(frozen=True)
class WorkerToAdd:
    """One ``[[workers]]`` entry: an allocation added after the session is created."""

    config: SlurmWorkerAllocationConfig
    resubmit_on_failure: int = 0


@dataclass(frozen=True)
class SessionFile:
    """A checked session file. ``create_kwargs`` holds only the keys it sets."""

    file: str
    path: Path | None
    create_kwargs: Mapping[str, Any]
    workers: tuple[WorkerToAdd, ...] = ()
    autoscale: AutoscalePolicy | None = None

    def directory(self, given: str | os.PathLike[str] | None = None,
                  environ: Mapping[str, str] | None = None) -> Path:
        """The session directory: ``given`` (``--dir``, a ``path=`` argument),
        else the file's ``path``, else ``$ELASTIC_RAY_SESSION``."""
        chosen = given if given is not None else self.path if self.path is not None else knobs.SESSION.read(environ)
        if chosen is None:
            raise SessionFileError(self.file, "path", None, f"no session directory: set path in the file, "
                                                            f"give --dir or set ${SESSION_ENV}")
        return Path(chosen).absolute()

    def create(self, session_cls: Any, **overrides: Any) -> Any:
        """``session_cls.create(...)`` with the file's arguments (``overrides``
        win), then every ``[[workers]]`` entry. A worker that cannot be
        submitted raises after the session exists: tear it down or add the
        worker by hand."""
        kwargs = {**self.create_kwargs, **overrides}
        path = self.directory(kwargs.pop("path", None))
        session = session_cls.create(path, **kwargs)
        for worker in self.workers:
            session.add_worker_allocation(worker.config, resubmit_on_failure=worker.resubmit_on_failure)
        if self.autoscale is not None:
            session.autoscale(self.autoscale)
        return session


def _config(file: str, prefix: str, cls: type, table: Any, extra: tuple[str, ...] = ()) -> Any:
    """Build ``cls`` from a TOML table; unknown keys and refused values name ``prefix.key``."""
    if not isinstance(table, Mapping):
        raise SessionFileError(file, prefix, table, "must be a table")
    known = {f.name for f in fields(cls)}
    for key in table:
        if key not in known and key not in extra:
            raise SessionFileError(file, f"{prefix}.{key}", table[key],
                                   f"unknown key (known: {', '.join(sorted(known | set(extra)))})")
    try:
        return cls(**{k: v for k, v in table.items() if k in known})
    except ConfigError as exc:
        raise SessionFileError(file, f"{prefix}.{exc.field}", exc.value, exc.reason) from None
    except TypeError as exc:      # a value of a type the dataclass cannot even compare
        raise SessionFileError(file, prefix, table, str(exc)) from None


def parse_session_file(data: Mapping[str, Any], file: str = "session.toml",
                       base: Path | None = None) -> SessionFile:
    """Check parsed TOML and map it to ``Session.create`` arguments. Pure.

    A relative ``path`` or ``local_state_dir`` is taken relative to ``base``
    (the file's directory), so a file means the same from any working directory.
    """
    for key in data:
        if key not in _TOP and key not in _TABLES and key not in ("workers", "autoscale"):
            raise SessionFileError(file, key, data[key], "unknown key (known: " + ", ".join(
                [*_TOP, *_TABLES, "workers", "autoscale"]) + ")")
    kwargs: dict[str, Any] = {}
    for key, (types, what) in _TOP.items():
        if key not in data:
            continue
        value = data[key]
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise SessionFileError(file, key, value, f"must be {what}")
        if key == "scheduler" and value not in SCHEDULER_KINDS:
            raise SessionFileError(file, key, value, f"must be one of {', '.join(SCHEDULER_KINDS)}")
        if key == "job_name":
            try:
                check_job_name(value)
            except ConfigError as exc:
                raise SessionFileError(file, key, value, exc.reason) from None
            except ValueError as exc:
                raise SessionFileError(file, key, value, str(exc)) from None
        if key in ("claim_period", "supervise_interval") and not value > 0:
            raise SessionFileError(file, key, value, "must be more than 0")
        if key in ("path", "local_state_dir"):
            if not value:
                raise SessionFileError(file, key, value, "must not be empty")
            value = Path(value) if base is None else base / value
        kwargs[key] = value
    if "head" not in data:
        raise SessionFileError(file, "head", None, "missing: the [head] table (partition and time_limit at least)")
    head = _config(file, "head", SlurmRunAllocationConfig, data["head"])
    launcher = _config(file, "launcher", RayLauncher, data.get("launcher", {}))
    head_only = kwargs.get("ray_head_only", True)
    # What Session.create checks before it creates anything, checked here so the error names the key.
    try:
        if head_only:
            resolve_separate_head_config(head)
    except ConfigError as exc:
        raise SessionFileError(file, f"head.{exc.field}", exc.value, exc.reason) from None
    if not head_only and not launcher.can_host_elected_head:
        raise SessionFileError(file, "launcher.port_strategy", launcher.port_strategy,
                               "with ray_head_only = false the head shares its node with a Ray worker, "
                               "which needs 'random' or 'hash_jobid'")
    kwargs["head"] = head
    if "launcher" in data:
        kwargs["launcher"] = launcher
    if "worker_allocation" in data:
        kwargs["worker_allocation"] = _config(file, "worker_allocation", SlurmWorkerAllocationConfig,
                                              data["worker_allocation"])
    workers = data.get("workers", [])
    if not isinstance(workers, list):
        raise SessionFileError(file, "workers", workers, "must be an array of tables ([[workers]])")
    added = []
    for index, table in enumerate(workers):
        prefix = f"workers[{index}]"
        config = _config(file, prefix, SlurmWorkerAllocationConfig, table, _WORKER_EXTRA)
        count = table.get("resubmit_on_failure", 0)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SessionFileError(file, f"{prefix}.resubmit_on_failure", count, "must be a whole number >= 0")
        added.append(WorkerToAdd(config, count))
    policy = None
    if "autoscale" in data:
        if not isinstance(data["autoscale"], Mapping):
            raise SessionFileError(file, "autoscale", data["autoscale"], "must be a table")
        try:
            policy = AutoscalePolicy.from_dict(data["autoscale"])
        except ConfigError as exc:
            raise SessionFileError(file, f"autoscale.{exc.field}", exc.value, exc.reason) from None
    path = kwargs.pop("path", None)
    return SessionFile(file=file, path=path, create_kwargs=kwargs, workers=tuple(added), autoscale=policy)


def load_session_file(path: str | os.PathLike[str]) -> SessionFile:
    """Read and check a session file (see :func:`parse_session_file`)."""
    name = str(path)
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise SessionFileError(name, "", None, f"not valid TOML: {exc}") from None
    except OSError as exc:
        raise SessionFileError(name, "", None, f"cannot be read: {exc.strerror or exc}") from None
    return parse_session_file(data, name, Path(path).absolute().parent)
