"""A run's usage as one small record: the figures a step's materialization reports.

Why a record of its own, apart from :class:`~.usage.RunUsage`: in the SSH
mode the event log is on the cluster, so the cluster side computes the
figures there and sends them across as plain data (``remote/wire``), while
the cluster mode computes them in the Dagster process. Both end in this
record, and the Dagster side turns it into metadata in one place
(``dagster/usage_meta.py``), so the keys and their rounding are the same in
both modes. :func:`summarize` and the record are pure; :func:`read_summary`
reads the log and draws the timeline page next to it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import atomic_write_bytes
from ..errors import ElasticRayError
from ..protocol.disk import paths
from ..protocol.disk.events import EventKind
from .read import run_usage
from .runs import RunHistory
from .usage import RunUsage


@dataclass(frozen=True)
class UsageSummary:
    """What the run held so far. ``timeline`` is the page drawn in the session
    directory (a path on the side that drew it), None when it was not drawn
    (no ``timeline`` extra there, or the page could not be written)."""

    node_hours: float
    gpu_hours_held: float
    gpu_hours_idle: float | None
    head_moves: int
    timeline: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"node_hours": self.node_hours, "gpu_hours_held": self.gpu_hours_held,
                "gpu_hours_idle": self.gpu_hours_idle, "head_moves": self.head_moves, "timeline": self.timeline}

    @classmethod
    def from_dict(cls, data: Any) -> "UsageSummary":
        """The record of :meth:`to_dict`'s value; a ValueError naming the first bad field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"usage: {data!r} must be an object of figures")
        for name in ("node_hours", "gpu_hours_held", "head_moves"):
            if name not in data:
                raise ValueError(f"usage.{name}: missing")
        hours = {name: _hours(name, data.get(name), optional=name == "gpu_hours_idle")
                 for name in ("node_hours", "gpu_hours_held", "gpu_hours_idle")}
        moves = data["head_moves"]
        if isinstance(moves, bool) or not isinstance(moves, int) or moves < 0:
            raise ValueError(f"usage.head_moves: {moves!r} must be a whole number, 0 or more")
        timeline = data.get("timeline")
        if timeline is not None and (not isinstance(timeline, str) or not timeline.startswith("/")):
            raise ValueError(f"usage.timeline: {timeline!r} must be an absolute path or null")
        return cls(node_hours=hours["node_hours"], gpu_hours_held=hours["gpu_hours_held"],  # type: ignore[arg-type]
                   gpu_hours_idle=hours["gpu_hours_idle"], head_moves=moves, timeline=timeline)


def _hours(name: str, value: Any, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"usage.{name}: {value!r} must be a number of hours, 0 or more"
                         + (" (or null)" if optional else ""))
    return float(value)


def summarize(history: RunHistory, figures: RunUsage, timeline: Path | None = None) -> UsageSummary:
    """Pure: the record of a run's history and figures (``run_usage``'s answer)."""
    return UsageSummary(node_hours=figures.node_hours, gpu_hours_held=figures.gpu_hours_held,
                        gpu_hours_idle=figures.gpu_hours_idle,
                        head_moves=sum(1 for e in history.events if e.kind is EventKind.HEAD_MOVED),
                        timeline=None if timeline is None else str(timeline))


def draw_command(session: str | Path) -> str:
    """The command that draws the timeline where it was not drawn (on the side that has the session)."""
    return f"elastic-ray session timeline {session} --output run.html"


def draw_page(session: Path, history: RunHistory) -> Path | None:
    """``<session>/timeline.html`` drawn anew (well under a second for a small run; a thousand
    allocations take seconds); None without the ``timeline`` extra or when it cannot be written."""
    try:
        from .timeline import render, title_of

        page = paths.timeline_page(session)
        atomic_write_bytes(page, render(history, "html", title=title_of(history)), mode=0o644, durable=False)
        return page
    except (ImportError, ElasticRayError, OSError):   # TimelineError (no matplotlib) is an ElasticRayError
        return None


def read_summary(session: Path) -> UsageSummary:
    """The run's figures as of now, from its event log, with its timeline page drawn.

    OSError or ValueError for a log that cannot be read; a page that cannot
    be drawn only leaves ``timeline`` None."""
    history, figures = run_usage(session)
    return summarize(history, figures, draw_page(session, history))
