"""How much memory and object store a Ray node may use: what Slurm granted, not the host's RAM.

Why: Ray sizes a node from the host. On a shared node that over-commits the
job: measured on the lab, a 1 GB allocation got a 7.6 GB object store (30 %
of the host's RAM) and a warning that ``/dev/shm`` was too small. Where Slurm
enforces memory with cgroups, a node sized that way is killed by the OOM
killer once its objects grow; where it does not, it takes memory other jobs
were promised.

:func:`plan_memory` is pure: it takes the facts the caller read
(``SLURM_MEM_PER_NODE``, ``SLURM_MEM_PER_CPU`` x ``SLURM_CPUS_ON_NODE``, the
cgroup limit, free space of ``/dev/shm``), the launcher's
``object_store_memory`` and the user's ``ray_start_args``, and returns the
``--memory`` and ``--object-store-memory`` of one Ray node:

* the *grant* is the Slurm memory of this node; a readable cgroup limit that
  is lower wins (it is what the kernel enforces); with neither, nothing is
  passed and Ray keeps its own defaults;
* the *share* is the part of the grant this Ray node may use. Two Ray nodes
  live on the first node of a worker allocation that may host an elected
  head (the default layout's first allocation, or any later election): the
  hosted head gets :data:`HEAD_SHARE_FRACTION` of the grant, within
  :func:`head_share`'s bounds (a head-only control plane measured 0.5-1.9 GB of
  RSS; drivers' ``ray.put`` objects land in its store), and the worker gets
  the rest. The worker keeps the head's part free from its start, because an
  elected head arrives while the worker is running and a Ray node cannot be
  resized without a restart;
* the object store is the user's ``--object-store-memory``, else the
  launcher's ``object_store_memory``, else :data:`OBJECT_STORE_FRACTION` of
  the share (Ray's own default fraction, applied to the grant instead of the
  host) but at least Ray's minimum of 75 MiB and at most 95 % of the free
  space of ``/dev/shm`` (as Ray caps it: a larger store falls back to slow
  disk and warns);
* ``--memory`` (Ray's heap resource) is the user's ``--memory``, else the
  share minus the object store, so the two add up to the share; an explicit
  object store that leaves less than a tenth of the share still gets a
  tenth (Ray needs a positive value, and the explicit store is the user's
  choice).

The user's ``ray_start_args`` win on the command line anyway (they come last,
see ``ray_args.merge_options``); the plan reads them only so the other value
is the complement of what the user chose.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .ray_args import option_name, slurm_memory_bytes

MIB = 1024 * 1024
GIB = 1024 * MIB
OBJECT_STORE_FRACTION = 0.3
OBJECT_STORE_MIN = 75 * MIB          # Ray's OBJECT_STORE_MINIMUM_MEMORY_BYTES
SHM_USABLE_FRACTION = 0.95           # Ray's own cap of the default store by /dev/shm
HEAD_SHARE_FRACTION = 0.25
HEAD_SHARE_MAX = 4 * GIB
HEAD_SHARE_MIN = 256 * MIB           # but never more than half the grant
MIN_HEAP_FRACTION = 0.1
#: cgroup limits at or above this are "no limit" (v1 writes 2^63 rounded down to a page).
CGROUP_UNLIMITED = 1 << 60

SHARES = ("whole", "worker_beside_head", "hosted_head")


@dataclass(frozen=True)
class MemoryPlan:
    """One Ray node's memory: what was granted, this node's part, and the two options."""

    grant: int | None          # bytes Slurm/cgroup granted this node; None: unknown
    source: str                # where the grant came from: SLURM_MEM_PER_NODE, SLURM_MEM_PER_CPU, cgroup, none
    share: int | None          # this Ray node's part of the grant
    memory: int | None         # --memory (None: not passed)
    object_store: int | None   # --object-store-memory (None: not passed, Ray's default)


def user_memory_options(args: Sequence[str]) -> tuple[int | None, int | None]:
    """The user's ``--memory`` and ``--object-store-memory`` (the last of each),
    None where absent or not a positive whole number (Ray then reports it)."""
    found: dict[str, int | None] = {"memory": None, "object-store-memory": None}
    for arg in args:
        name = option_name(arg)
        if name in found:
            value = arg.split("=", 1)[1].strip() if "=" in arg else ""
            found[name] = int(value) if value.isdigit() and int(value) > 0 else None
    return found["memory"], found["object-store-memory"]


def head_share(grant: int) -> int:
    """A hosted head's part of its worker allocation's grant: a quarter, between
    :data:`HEAD_SHARE_MIN` (room for Ray's minimum store) and :data:`HEAD_SHARE_MAX`,
    and never more than half."""
    return min(max(int(grant * HEAD_SHARE_FRACTION), HEAD_SHARE_MIN), HEAD_SHARE_MAX, grant // 2)


def plan_memory(environ: Mapping[str, str], *, cgroup_limit: int | None, shm_free: int | None,
                launcher_object_store: int | None, user_args: Sequence[str] = (),
                share: str = "whole") -> MemoryPlan:
    """The memory options of one Ray node (see the module docstring).

    ``share``: ``whole`` (the only Ray node of its allocation on this host),
    ``worker_beside_head`` (a worker on a node that may host an elected head)
    or ``hosted_head``.
    """
    if share not in SHARES:
        raise ValueError(f"share={share!r}: must be one of {', '.join(SHARES)}")
    slurm = slurm_memory_bytes(environ)
    source = "none"
    grant: int | None = None
    if slurm is not None:
        grant = slurm
        per_node = environ.get("SLURM_MEM_PER_NODE", "").strip()
        source = "SLURM_MEM_PER_NODE" if per_node.isdigit() and int(per_node) > 0 else "SLURM_MEM_PER_CPU"
    if cgroup_limit is not None and 0 < cgroup_limit < CGROUP_UNLIMITED and (grant is None or cgroup_limit < grant):
        grant, source = cgroup_limit, "cgroup"
    user_memory, user_store = user_memory_options(user_args)
    if grant is None:
        return MemoryPlan(None, "none", None, user_memory, user_store or launcher_object_store)

    part = {"whole": grant, "hosted_head": head_share(grant), "worker_beside_head": grant - head_share(grant)}[share]
    store = user_store or launcher_object_store
    if store is None:
        store = max(OBJECT_STORE_MIN, int(part * OBJECT_STORE_FRACTION))
        if shm_free is not None:
            store = max(OBJECT_STORE_MIN, min(store, int(shm_free * SHM_USABLE_FRACTION)))
    memory = user_memory or max(part - store, int(part * MIN_HEAP_FRACTION), 1)
    return MemoryPlan(grant, source, part, memory, store)


# --------------------------------------------------------------------------
# Reading the facts (the only impure part).

def cgroup_memory_limit(proc_cgroup: str, mounts: str, read: Callable[[str], str | None]) -> int | None:
    """The lowest memory limit on this process's cgroup and its ancestors, or None.

    ``proc_cgroup`` and ``mounts`` are the texts of ``/proc/self/cgroup`` and
    ``/proc/self/mounts``; ``read(path)`` returns a file's text or None. Both
    cgroup v2 (``memory.max``) and v1 (``memory.limit_in_bytes``) are read,
    since hybrid hosts have both. Pure given ``read``.
    """
    v2_roots, v1_roots = [], []
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[2] == "cgroup2":
            v2_roots.append(parts[1])
        elif parts[2] == "cgroup" and "memory" in parts[3].split(","):
            v1_roots.append(parts[1])
    places: list[tuple[str, str, str]] = []
    for line in proc_cgroup.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if controllers == "":
            places += [(root, path, "memory.max") for root in v2_roots]
        elif "memory" in controllers.split(","):
            places += [(root, path, "memory.limit_in_bytes") for root in v1_roots]
    limits: list[int] = []
    for root, path, name in places:
        parts = [p for p in path.split("/") if p and p != ".."]
        for depth in range(len(parts), -1, -1):
            text = read(os.path.join(root, *parts[:depth], name))
            value = (text or "").strip()
            if value.isdigit() and 0 < int(value) < CGROUP_UNLIMITED:
                limits.append(int(value))
    return min(limits) if limits else None


def _read_text(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read(limit)
    except OSError:
        return None


def read_cgroup_limit() -> int | None:
    """This process's cgroup memory limit in bytes, None if unlimited or unreadable."""
    proc_cgroup, mounts = _read_text("/proc/self/cgroup"), _read_text("/proc/self/mounts")
    if proc_cgroup is None or mounts is None:
        return None
    return cgroup_memory_limit(proc_cgroup, mounts, _read_text)


def shm_free_bytes(path: str = "/dev/shm") -> int | None:
    """Free space of the shared-memory filesystem Ray's object store lives in."""
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize
