"""How many processes of this Slurm job the kernel's OOM killer ended.

Where a site enforces memory (``TaskPlugin=task/cgroup`` with
``ConstrainRAMSpace``), Slurm puts each job in a memory cgroup named
``.../job_<id>`` with one child per step. A process of the job that goes over
the grant is killed by the OOM killer, and the job goes on as long as its
batch step lives: a raylet or a task worker simply vanishes. The kernel
counts those kills per cgroup; the agent reads the count of its own job and
publishes it (``NodeState.oom_kills``), so ``session status`` can say why a
node's Ray went away instead of leaving an unexplained failure.

The counters: cgroup v1 keeps ``oom_kill`` in ``memory.oom_control`` of the
cgroup whose limit was hit (not summed into its parents), so the job's count
is the sum over the job's cgroup and every cgroup below it. cgroup v2 keeps
it in ``memory.events``, already summed over the subtree, so the job's own
file says it all.

No job cgroup (no cgroup enforcement, a cgroup namespace hiding the path,
not under Slurm): the count is unknown (None), and nothing is read again.
The pure parts take file texts; :class:`OomCounter` is the thin shell.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

_JOB_COMPONENT = re.compile(r"^job_\d+$")
_OOM_KILL = re.compile(r"^oom_kill\s+(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class JobCgroup:
    """The job's memory cgroup: its directory and the cgroup version it lives under."""

    version: int        # 1 or 2
    path: Path

    @property
    def counter_file(self) -> str:
        return "memory.oom_control" if self.version == 1 else "memory.events"


def memory_mounts(mountinfo: str) -> dict[int, str]:
    """Pure: where the memory controller is mounted, by cgroup version, from
    ``/proc/self/mountinfo`` (v1: a ``cgroup`` mount with the ``memory``
    option; v2: the ``cgroup2`` mount)."""
    found: dict[int, str] = {}
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mount_point, fstype, options = fields[4], tail[0], tail[2].split(",")
        if fstype == "cgroup" and "memory" in options:
            found.setdefault(1, mount_point)
        elif fstype == "cgroup2":
            found.setdefault(2, mount_point)
    return found


def job_path(cgroup_path: str) -> str | None:
    """Pure: the leading part of a cgroup path up to its ``job_<id>`` component
    (``/slurm_n1/uid_0/job_12/step_batch`` -> ``/slurm_n1/uid_0/job_12``), or
    None when the path names no job."""
    parts = cgroup_path.split("/")
    for i, part in enumerate(parts):
        if _JOB_COMPONENT.match(part):
            return "/".join(parts[:i + 1])
    return None


def job_cgroup(proc_cgroup: str, mountinfo: str) -> JobCgroup | None:
    """Pure: this process's job memory cgroup, from ``/proc/self/cgroup`` and
    ``/proc/self/mountinfo``; v1's memory line wins over v2's unified one (a
    hybrid host enforces memory in v1)."""
    mounts = memory_mounts(mountinfo)
    v1 = v2 = None
    for line in proc_cgroup.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hier == "0" and controllers == "":
            v2 = path
        elif "memory" in controllers.split(","):
            v1 = path
    for version, path in ((1, v1), (2, v2)):
        job = None if path is None else job_path(path)
        if job is not None and version in mounts:
            return JobCgroup(version, Path(mounts[version] + job))
    return None


def oom_kills(counter_text: str) -> int | None:
    """Pure: the ``oom_kill`` count of a ``memory.oom_control`` (v1) or
    ``memory.events`` (v2) text; None for a kernel that does not count (v1
    before 4.13)."""
    match = _OOM_KILL.search(counter_text)
    return int(match.group(1)) if match else None


class OomCounter:
    """The job's OOM kills, read on demand (a few small files; the agent asks at
    each status rewrite). ``on_kill(kills, new)`` is called each time the
    count rose since the last read, so the session's event log dates the
    kills to within one status period."""

    def __init__(self, on_kill: Callable[[int, int], None] | None = None, proc_root: str = "/proc/self") -> None:
        self.on_kill = on_kill
        self.last: int | None = None
        try:
            with open(f"{proc_root}/cgroup") as a, open(f"{proc_root}/mountinfo") as b:
                self.job = job_cgroup(a.read(), b.read())
        except OSError:
            self.job = None

    def count(self) -> int | None:
        """Kills so far in the job's cgroup and below it; None when unknown."""
        now = self._read()
        if now is not None and self.on_kill is not None and now > (self.last or 0):
            self.on_kill(now, now - (self.last or 0))
        if now is not None:
            self.last = now
        return now

    def _read(self) -> int | None:
        job = self.job
        if job is None:
            return None
        if job.version == 2:
            return _read_count(job.path / job.counter_file)
        total, known = 0, False
        for root, dirs, _files in os.walk(job.path):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            n = _read_count(Path(root) / job.counter_file)
            if n is not None:
                total, known = total + n, True
        return total if known else None


def _read_count(path: Path) -> int | None:
    try:
        return oom_kills(path.read_text())
    except OSError:
        return None


__all__ = ["JobCgroup", "OomCounter", "job_cgroup", "job_path", "memory_mounts", "oom_kills"]
