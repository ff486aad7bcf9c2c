"""Exceptions shared by every part of elastic-ray.

They live in one module so that callers can catch them without importing the
part that raised them (a Dagster asset catching ``SlurmAllocationEnded`` should
not need to import the coordinator's internals).
"""

from __future__ import annotations


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


class SlurmAllocationEnded(ElasticRayError):
    """The allocation that hosted a payload driver is gone (or was replaced)."""

    def __init__(self, message: str, *, allocation_state: str, job_id: str | None = None):
        self.allocation_state = allocation_state
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
