"""What the SSH mode sends across: one request in, a stream of events out.

A client call is one remote command (``python -m elastic_ray.remote.server``)
over the multiplexed SSH connection. The request is the first line of its
stdin; the stdin then stays open, and its end tells the cluster side that
the caller went away (a killed notebook stops its payload driver instead of
leaving it running unseen). The answer is a stream of lines on stdout, each
starting with :data:`MARK` so that anything else a login shell or a library
prints there is ignored, never parsed. Events: ``progress`` (a wait's
news), ``out`` (a payload's output), ``pipes`` (a Dagster Pipes message),
then exactly one ``result`` or ``error``.

Errors travel as their type's name and their attributes, and are rebuilt as
the same type on the client: a failover loop catching
``SlurmAllocationEnded`` and reading ``allocation_state`` works unchanged.
Only the types listed in :func:`error_types` are rebuilt; anything else
arrives as :class:`RemoteError` with the cluster side's traceback.

Everything here is pure, so both ends and the tests share it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .. import errors
from ..errors import ElasticRayError
# Defined in errors (its docstring says why); ``X as X`` keeps them importable from here, for type checkers too.
from ..errors import ProtocolError as ProtocolError
from ..errors import RemoteError as RemoteError
from ..errors import RemoteSetupError as RemoteSetupError
from ..errors import RemoteVersionMismatch as RemoteVersionMismatch
from ..history.summary import UsageSummary

SCHEMA = "elastic-ray-remote/1"
MARK = "\x1eER1 "
KEEPALIVE = 10.0  # s between the client's keep-alive bytes on a call's stdin
CLIENT_SILENCE = 6 * KEEPALIVE  # s without one before the cluster side takes the client for gone


# The types a client rebuilds by name, one by one rather than "every class of
# elastic_ray.errors": that module also holds the errors of the control
# channel, the agent's node and the SSH client, which a remote call has never
# rebuilt; they, like any type not named here, arrive as RemoteError.
REBUILT: tuple[type[BaseException], ...] = (
    errors.ElasticRayError, errors.ConfigError, errors.SchedulerError, errors.SessionDirError,
    errors.CorruptFileError, errors.TeardownIncomplete, errors.UnsafePathError, errors.AllocationFailed,
    errors.SlurmAllocationEnded, errors.SlurmStepDrained,
    errors.PayloadFailed, errors.WaitTimeout,
    RemoteError, RemoteVersionMismatch, RemoteSetupError, ProtocolError,
    TimeoutError, ValueError, TypeError, KeyError, FileNotFoundError, PermissionError, FileExistsError,
    NotADirectoryError, OSError,
)


def error_types() -> dict[str, type[BaseException]]:
    """The exception types rebuilt on the client, by name."""
    return {cls.__name__: cls for cls in REBUILT}


def _plain(value: Any) -> Any:
    """A JSON value for an attribute: tuples are marked so they come back as tuples."""
    if isinstance(value, tuple):
        return {"__tuple__": [_plain(v) for v in value]}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _unplain(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__tuple__"}:
            return tuple(_unplain(v) for v in value["__tuple__"])
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


def error_event(exc: BaseException, traceback: str = "") -> dict[str, Any]:
    """Pure: the ``error`` event for ``exc``."""
    attrs = {k: _plain(v) for k, v in vars(exc).items() if not k.startswith("_")}
    return {"ev": "error", "type": type(exc).__name__, "message": str(exc), "attrs": attrs,
            "traceback": traceback}


def rebuild_error(event: Mapping[str, Any]) -> BaseException:
    """Pure: the exception an ``error`` event stands for, as the same type where known."""
    name, message = str(event.get("type", "")), str(event.get("message", ""))
    cls = error_types().get(name)
    if cls is None:
        return RemoteError(name or "unknown", message, str(event.get("traceback", "")))
    attrs = {k: _unplain(v) for k, v in dict(event.get("attrs") or {}).items()}
    if not issubclass(cls, ElasticRayError) and not attrs:
        return cls(message)
    exc = cls.__new__(cls)
    BaseException.__init__(exc, message)
    exc.__dict__.update(attrs)
    return exc


def encode(event: Mapping[str, Any]) -> bytes:
    """Pure: one marked line."""
    return (MARK + json.dumps(event, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict[str, Any] | None:
    """Pure: the event of a marked line; None for any other line (noise from
    login scripts); :class:`ProtocolError` for a marked line that is not an event."""
    text = line.decode(errors="replace")
    if not text.startswith(MARK):
        return None
    try:
        event = json.loads(text[len(MARK):])
    except ValueError as exc:
        raise ProtocolError(f"unreadable event from the cluster side: {text[:200]!r}") from exc
    if not isinstance(event, dict) or not isinstance(event.get("ev"), str):
        raise ProtocolError(f"not an event: {text[:200]!r}")
    return event


def request(op: str, args: Mapping[str, Any], version: str) -> bytes:
    """Pure: the request line of one call."""
    return (json.dumps({"schema": SCHEMA, "version": version, "op": op, "args": dict(args)}) + "\n").encode()


def parse_request(line: bytes, cluster_version: str) -> tuple[str, dict[str, Any]]:
    """Pure: (op, args) of a request line, or the error to answer with."""
    try:
        req = json.loads(line) if line.strip() else None
    except ValueError as exc:
        raise ProtocolError(f"the request line is not JSON: {line[:200]!r}") from exc
    return check_request(req, cluster_version)


def check_request(req: Any, cluster_version: str) -> tuple[str, dict[str, Any]]:
    """Pure: (op, args) of a request line's value, or the error to answer with."""
    if not isinstance(req, dict):
        raise ProtocolError("a request must be one JSON object on the first line")
    if req.get("schema") != SCHEMA:
        raise RemoteVersionMismatch(f"wire {req.get('schema')}", f"wire {SCHEMA}")
    if req.get("version") != cluster_version:
        raise RemoteVersionMismatch(str(req.get("version")), cluster_version)
    op, args = req.get("op"), req.get("args")
    if not isinstance(op, str) or not isinstance(args, dict):
        raise ProtocolError("a request needs an op (string) and args (object)")
    return op, args


def usage_answer(value: Any) -> UsageSummary:
    """Pure: the record a ``usage`` call answers with; :class:`ProtocolError` naming the bad field."""
    try:
        return UsageSummary.from_dict(value)
    except ValueError as exc:
        raise ProtocolError(f"the cluster side's answer to usage: {exc}") from None
