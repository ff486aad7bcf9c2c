"""A process the agent watches, and the cheap look whether it still runs.

An idle agent looks at its raylet once a second (``wakeups.RAYLET_CHECK_SECONDS``:
a drained raylet exits while ``ray start --block`` stays up, so the start
process's exit alone does not tell). psutil's ``is_running()`` and
``status()`` cost three reads of ``/proc/PID/stat`` and a new ``Process``
object per look, a visible part of the idle agent's 0.1 % budget (issue 11).
:class:`ProcWatch` remembers the process's start time once and then needs one
read per look; comparing the start time keeps a reused PID from being taken
for the process that ended.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Process states that no longer run: zombie, dead (``x`` on old kernels).
_ENDED_STATES = (b"Z", b"X", b"x")
#: Index of ``starttime`` (field 22 of proc(5)) among the fields after ``comm``.
_START_INDEX = 19


def stat_fields(pid: int, proc_root: str = "/proc") -> list[bytes] | None:
    """The fields of ``/proc/PID/stat`` after the command name (``state``
    first), or None when there is no such process. The name is skipped by
    its last ``)``: it may hold blanks and parentheses itself."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    end = data.rfind(b")")
    fields = data[end + 2:].split() if end >= 0 else []
    return fields if len(fields) > _START_INDEX else None


@dataclass(frozen=True)
class ProcWatch:
    """A process by PID and start time (in clock ticks since boot)."""

    pid: int
    start: bytes
    proc_root: str = "/proc"

    @classmethod
    def find(cls, pid: int | None, proc_root: str = "/proc") -> ProcWatch | None:
        """The running process ``pid`` (None: no PID, or no such process)."""
        if not pid:
            return None
        fields = stat_fields(pid, proc_root)
        if fields is None or fields[0] in _ENDED_STATES:
            return None
        return cls(pid, fields[_START_INDEX], proc_root)

    def alive(self) -> bool:
        """Still running: the PID exists, is not a zombie, and is the same process."""
        fields = stat_fields(self.pid, self.proc_root)
        return fields is not None and fields[0] not in _ENDED_STATES and fields[_START_INDEX] == self.start


__all__ = ["ProcWatch", "stat_fields"]
