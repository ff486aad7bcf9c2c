"""What a run is programmed against, whichever object drives it.

Three objects drive a run: :class:`Session` (in a process on the cluster),
:class:`~elastic_ray.remote.client.RemoteSession` (from outside, over SSH)
and the Dagster resources' :class:`~elastic_ray.dagster.run_session.RunSession`
(which wraps either). A payload loop written against one must run against
the others unchanged, so the calls they share, with their parameter names
and defaults, are written down once here; ``tests/test_session_facade.py``
holds each of the three to it (same names, same order, same defaults; an
object may add keyword parameters with defaults of its own).

Creating and opening a session differ on purpose (a local path, an SSH
target, a Dagster run key) and are not part of it; so is the layout's
default (``ray_head_only``: ``True`` for ``Session.create`` and
``RemoteSession.create``, ``False`` for the Dagster resources, as the
Dagster integration documents it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .. import defaults

from ..scheduler.base import JobState
from .handles import Head, WorkerAllocation

Progress = Callable[[str], None]


class RunControl(Protocol):
    """The calls every run-driving object offers, with one set of defaults."""

    def add_worker_allocation(self, config: Any) -> WorkerAllocation:
        """Submit a worker allocation; returns on submission."""
        ...

    def wait_for_worker_allocation(self, handle: WorkerAllocation | str, timeout: float = defaults.WAIT_TIMEOUT,
                                   progress: Progress | None = None) -> dict[str, str]:
        """Block until every node of the allocation joined; {node: Ray node id}."""
        ...

    def remove_worker_allocation(self, handle: WorkerAllocation | str, drain_timeout: float = defaults.DRAIN_TIMEOUT,
                                 wait: bool = True, progress: Progress | None = None) -> JobState:
        """Drain a running allocation (cancel a pending one); its final state."""
        ...

    def replace_head(self, timeout: float = defaults.WAIT_TIMEOUT, progress: Progress | None = None) -> Head:
        """The healthy head, electing one first if the run has none."""
        ...

    def ready_head(self, timeout: float = defaults.WAIT_TIMEOUT, progress: Progress | None = None) -> Head:
        """The current head once it is healthy; raises instead of electing."""
        ...

    def head_is_lost(self) -> bool:
        """Whether the head must be replaced now."""
        ...

    def autoscale(self, policy: Any) -> None:
        """Scale the run by itself with ``policy`` (an AutoscalePolicy or its dict form; None: stop,
        the allocations stay); returns at once, a supervising process of the run acts on it."""
        ...

    def teardown(self, extra: Sequence[str] | None = None, *, wait: bool = False,
                 timeout: float = defaults.TEARDOWN_TIMEOUT, progress: Progress | None = None) -> tuple[str, ...]:
        """Cancel every job of the run; the ids cancelled. With ``wait``, return once
        Slurm has let go of all of them (none PENDING, RUNNING or COMPLETING)."""
        ...

    def close(self) -> None:
        """Let go of this object's resources; the run goes on."""
        ...


__all__ = ["Progress", "RunControl"]
