"""Every public exception of elastic-ray, and their one base class.

They live in one module so that callers can catch them without importing the
part that raised them (a Dagster asset catching ``SlurmAllocationEnded`` should
not need to import the coordinator's internals, a notebook catching
``SshError`` not the SSH client's). Each is an :class:`ElasticRayError`, so
one ``except ElasticRayError`` covers everything the package raises on
purpose; some keep a built-in base as well, so that ``except ValueError``
(``ConfigError``, ``NewerProtocolError``) and ``except TimeoutError``
(``ControlTimeout``, ``WaitTimeout``) go on catching them.

The modules that raise them import them from here, and each name is still
importable from the module it was first defined in (``elastic_ray.polling``
``WaitTimeout``, ``elastic_ray.protocol.wire.channel`` ``ControlTimeout``,
...): those imports are kept for code written against them.

This module belongs to no room and imports only the standard library, so
every room, the small agent included, may use it at no cost. For that reason
``SshError`` describes the ``SshTarget`` it is given by the attributes it
reads (``host``, ``user``, ``port``) instead of importing the SSH client.

Left where they are, because no program using the package catches them:
the GCS probe's ``_UsageError`` and ``_AuthError`` (private to the probe
process, which turns them into its one JSON answer and its exit status; the
agent sees a ``ProbeError``), the local scheduler's ``InvalidTransition``
(the emulation's record refusing an event its state cannot have: a bug in
the emulation, not something a user can meet or fix) and the CLI's
``OptionError`` (a ``click.UsageError``, so that click prints it and exits
with status 2; it must keep click's base, and only the ``elastic-ray``
command raises it).
"""

from __future__ import annotations

import enum
import os
import shlex
from collections.abc import Sequence
from typing import Protocol


class ElasticRayError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(ElasticRayError, ValueError):
    """A configuration value was refused.

    ``field`` names the offending field (``"time_limit"``,
    ``"ray_resources['CPU']"``...) so that a user reading the message, or a UI
    showing it next to a form field, knows exactly what to fix.
    """

    def __init__(self, field: str, value: object, reason: str):
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"{field}={value!r}: {reason}")


class SchedulerError(ElasticRayError):
    """A scheduler command failed; the message carries the command's stderr."""

    def __init__(self, message: str, *, argv: tuple[str, ...] = (), returncode: int | None = None,
                 stderr: str = ""):
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(message)


class SessionDirError(ElasticRayError):
    """The session directory is missing, unreadable or inconsistent."""


class CorruptFileError(SessionDirError):
    """A file in the session directory could not be parsed or failed validation.

    Readers that can live without the file treat this as "unknown"; writers
    never overwrite such a file blindly (the original is kept for inspection).
    """

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class TeardownIncomplete(ElasticRayError):
    """A teardown tried every job it could learn of, and some steps failed.

    Raised only at the end: ``cancelled`` holds the ids whose cancel was
    accepted, ``errors`` one line per step that failed (reading the record,
    asking the scheduler, cancelling a job).
    """

    def __init__(self, cancelled: tuple[str, ...], errors: tuple[str, ...]):
        self.cancelled = cancelled
        self.errors = errors
        super().__init__(f"teardown incomplete ({len(errors)} problem(s); cancelled "
                         f"{', '.join(cancelled) or 'nothing'}): " + "; ".join(errors))


class UnsafePathError(ElasticRayError):
    """A file or directory we were about to trust is not safely ours.

    Raised for a private directory owned by another user or open to group or
    others, a secret readable by others, or a symlink or FIFO where a regular
    file belongs. ``path`` names it; the message says how to fix it.
    """

    def __init__(self, path: str, reason: str):
        self.path = path
        self.reason = reason
        super().__init__(f"{path}: {reason}")


class AllocationFailed(ElasticRayError):
    """An allocation ended before it was ready (a worker before all its nodes
    joined, a head before its Ray answered). ``log_path`` names its job log."""

    def __init__(self, message: str, *, state: str, job_id: str, log_path: str | None = None):
        self.state = state
        self.job_id = job_id
        self.log_path = log_path
        super().__init__(message)


class AllocationState(str, enum.Enum):
    """Why an allocation is gone, as ``SlurmAllocationEnded.allocation_state``
    says it: Slurm's final state of the job, or what the session saw instead.
    A ``str`` enum: ``exc.allocation_state == "TIMEOUT"`` keeps working.

    Slurm's names are those of ``scheduler.base.JobState``; the others are the
    head conditions that call for an election (``coordinator.head.election``)
    in capitals, and ``REPLACED`` (a newer head took over) and ``DRAINING`` (the
    head phases out). ``tests/test_errors.py`` holds the list to both enums.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETING = "COMPLETING"
    SUSPENDED = "SUSPENDED"
    COMPLETED = "COMPLETED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    ENDED_UNKNOWN = "ENDED_UNKNOWN"
    HEALTHY = "HEALTHY"
    STARTING = "STARTING"
    QUEUED = "QUEUED"
    UNREPORTED = "UNREPORTED"
    NO_HEAD = "NO_HEAD"
    JOB_ENDED = "JOB_ENDED"
    RAY_STOPPED = "RAY_STOPPED"
    DRAINING = "DRAINING"
    REPLACED = "REPLACED"

    def __str__(self) -> str:   # printed and formatted as the plain name
        return self.value


class SlurmAllocationEnded(ElasticRayError):
    """The allocation that hosted a payload driver is gone (or was replaced).

    ``allocation_state`` is an :class:`AllocationState` (a name outside the
    list, from a newer Slurm, stays the plain string rather than fail here)."""

    def __init__(self, message: str, *, allocation_state: str, job_id: str | None = None):
        self.allocation_state: AllocationState | str = allocation_state
        try:
            self.allocation_state = AllocationState(allocation_state)
        except ValueError:
            pass   # a name outside the list (a newer Slurm's) stays the plain string
        self.job_id = job_id
        super().__init__(message)


class SlurmStepDrained(SlurmAllocationEnded):
    """A payload driver was asked to stop because its head allocation drains.

    A kind of ``SlurmAllocationEnded`` (``allocation_state`` is
    ``"DRAINING"``, ``job_id`` the draining head): a head phasing out before
    its walltime is the common way a head goes, and the one failover loop
    (``except SlurmAllocationEnded: replace_head()``) must cover it too.
    Catch this class first to tell a planned hand-over from a lost head.
    """

    def __init__(self, message: str, *, job_id: str | None = None):
        super().__init__(message, allocation_state="DRAINING", job_id=job_id)


class PayloadFailed(ElasticRayError):
    """The driver exited non-zero while its head stayed healthy.

    ``step_state`` is how the scheduler's accounting says the driver's step
    ended, where it keeps one (``OUT_OF_MEMORY``: the OOM killer ended it for
    going over the allocation's memory grant; Slurm's srun exits 1 then, like
    any failure), and ``step`` that step's id; both None where not known.
    """

    def __init__(self, returncode: int, argv: Sequence[str], *, step_state: str | None = None,
                 step: str | None = None):
        self.returncode = returncode
        self.step_state = step_state
        self.step = step
        why = ""
        if step_state == "OUT_OF_MEMORY":
            why = (f": the OOM killer ended it (its step {step} went over the head allocation's memory grant; "
                   f"Slurm says OUT_OF_MEMORY)")
        elif step_state:
            why = f" (its step {step} ended {step_state})"
        super().__init__(f"payload {' '.join(argv)!r} exited with {returncode}{why}")


class SessionFileError(ConfigError):
    """A refused session file: ``file`` is its path as given, ``field`` the dotted key."""

    def __init__(self, file: str | os.PathLike[str], field: str, value: object, reason: str):
        super().__init__(field, value, reason)
        self.file = str(file)
        # The value is left out of the message: it may be long (a script line) or secret.
        self.args = (f"{self.file}: {field}: {reason}" if field else f"{self.file}: {reason}",)


class NewerProtocolError(ElasticRayError, ValueError):
    """A record written by a newer elastic-ray, in a protocol this one cannot read.

    A ``ValueError`` like every other refusal of a record, so the session
    directory reports it with the file's path; a class of its own so that
    "upgrade" can be told apart from "damaged".
    """


class WaitTimeout(ElasticRayError, TimeoutError):
    """The awaited condition did not come in time. Names what was awaited
    (``what``) and what the last look saw (``last``)."""

    def __init__(self, what: str, timeout: float, last: object):
        self.what = what
        self.timeout = timeout
        self.last = last
        super().__init__(f"timed out after {timeout:g} s waiting for {what}; last seen: {last!r}")


# ---------------------------------------------------------------- the control channel

class ControlError(ElasticRayError):
    """A request failed: the reply was not authentic, or did not answer the request."""


class ControlTimeout(ControlError, TimeoutError):
    """No authentic reply within the timeout. The request may or may not have run."""


class FrameRejected(ElasticRayError):
    """A frame was refused. ``reason`` is a short fixed token (safe to count by);
    ``detail`` says what exactly was wrong, for the log."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class CurveUnavailable(ElasticRayError):
    """The installed libzmq was built without CURVE; the channel refuses to run
    unauthenticated rather than fall back silently."""


# ---------------------------------------------------------------- the agent's node

class ProbeError(ElasticRayError):
    """A probe failed: ``kind`` is ``timeout`` (killed), ``unreachable`` (no GCS
    answered), ``auth`` (token missing or wrong), ``usage``, ``malformed`` (no
    valid answer) or the Python exception name raised inside the probe."""

    def __init__(self, op: str, kind: str, message: str, *, returncode: int | None = None,
                 stderr_tail: str = ""):
        self.op = op
        self.kind = kind
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        detail = f"; stderr: {stderr_tail.strip()[-500:]}" if stderr_tail.strip() else ""
        super().__init__(f"gcs probe {op}: {kind}: {message}{detail}")


class NodeAddressError(ElasticRayError):
    """This node's address could not be resolved (one line, names the node)."""


# ---------------------------------------------------------------- the SSH mode

class _SshLogin(Protocol):
    """What :class:`SshError` reads of the ``SshTarget`` it is given."""

    @property
    def host(self) -> str: ...

    @property
    def user(self) -> str | None: ...

    @property
    def port(self) -> int | None: ...


class SshError(ElasticRayError):
    """ssh could not run a command on the cluster (connect, authenticate, or spawn)."""

    def __init__(self, target: _SshLogin, command: Sequence[str], returncode: int | None, stderr: str):
        self.host = target.host
        self.user = target.user
        self.command = tuple(command)
        self.returncode = returncode
        self.stderr = stderr.strip()
        who = f"{target.user}@{target.host}" if target.user else target.host
        port = f" port {target.port}" if target.port else ""
        said = self.stderr.splitlines()[-1] if self.stderr else "no message"
        super().__init__(f"ssh to {who}{port} failed (exit {returncode}) running {shlex.join(command)!r}: {said}")


class RemoteError(ElasticRayError):
    """The cluster side failed with an error of a type the client does not rebuild."""

    def __init__(self, type_name: str, message: str, traceback: str = ""):
        self.type_name = type_name
        self.traceback = traceback
        super().__init__(f"{type_name} on the cluster side: {message}")


class RemoteVersionMismatch(ElasticRayError):
    """Client and cluster side run different elastic-ray versions (or wire schemas)."""

    def __init__(self, client_version: str, cluster_version: str, remote_python: str = ""):
        self.client_version = client_version
        self.cluster_version = cluster_version
        self.remote_python = remote_python
        where = f" ({remote_python})" if remote_python else ""
        super().__init__(f"elastic-ray {client_version} here but {cluster_version} on the cluster side{where}; "
                         f"install the same version in both places")


class RemoteSetupError(ElasticRayError):
    """The cluster side could not start (no Python there, elastic-ray not installed)."""


class ProtocolError(ElasticRayError):
    """The cluster side answered something that is not this wire format."""
