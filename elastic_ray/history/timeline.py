"""Draw a run's history: PNG, SVG, or a self-contained HTML page, chosen by the file's suffix.

One horizontal bar per node of each allocation, the allocations grouped by
partition, each bar coloured by the node's phase (pending, starting,
joined, draining); above them a band of the head's periods (which job was
the head, from when) and a row per payload run; vertical lines where an
election started, was won, and where the head moved. The time axis is UTC:
a run's nodes, its users and its logs seldom share one time zone.

matplotlib comes with the ``timeline`` extra and is imported only when a
drawing is asked for, so the rest of elastic-ray (and ``session usage``)
runs without it. Figures are drawn on a ``Figure`` of their own, never
through pyplot's global state, so a long-lived process can draw many.
"""

from __future__ import annotations

from collections.abc import Mapping

import datetime as dt
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ElasticRayError
from .page import render_page, utc
from .runs import HeadChange, RunHistory
from .usage import usage

FORMATS = (".html", ".png", ".svg")
INSTALL_HINT = "pip install 'elastic-ray[timeline]'"

PHASE_COLOURS = {"pending": "#d9d9d9", "starting": "#f2b134", "joined": "#3a86c8", "draining": "#d1495b"}
HEAD_COLOURS = ("#6a4c93", "#9b7fc4")
PAYLOAD_COLOURS = {True: "#2a9d5c", False: "#c0392b", None: "#7f8c8d"}
ELECTION_COLOUR = "#e07b00"
MOVE_COLOUR = "#6a4c93"
ROW_INCHES = 0.3
MAX_HEIGHT_INCHES = 160.0      # matplotlib refuses images past 2**16 pixels a side
DPI = 100


class TimelineError(ElasticRayError, ValueError):
    """A timeline that cannot be drawn as asked (its format, or matplotlib missing)."""


def output_format(output: str | Path) -> str:
    """``html``, ``png`` or ``svg`` from the output's suffix; a clear error naming ``output`` otherwise."""
    suffix = Path(output).suffix.lower()
    if suffix not in FORMATS:
        raise TimelineError(f"output: {str(output)!r} must end in .html, .png or .svg "
                            f"(the suffix chooses the format), not {suffix or 'no suffix'!r}")
    return suffix[1:]


def _matplotlib() -> Any:
    try:
        import matplotlib
        from matplotlib import dates, patches
        from matplotlib.figure import Figure
    except ImportError:
        raise TimelineError(f"drawing a timeline needs matplotlib, which is not installed: {INSTALL_HINT}") from None
    return matplotlib, dates, patches, Figure


@dataclass(frozen=True)
class _Row:
    label: str
    group: str | None = None          # the partition, for the node rows


def _x(dates: Any, at: float) -> float:
    return float(dates.date2num(dt.datetime.fromtimestamp(at, dt.timezone.utc)))


def _span(ax: Any, dates: Any, y: float, begin: float | None, end: float | None, colour: str, height: float,
          *, hatch: str | None = None, label: str | None = None, label_min: float = 0.0) -> None:
    """One bar from ``begin`` to ``end``; its label only where it fits (``label_min``: the narrowest that does)."""
    if begin is None or end is None or end < begin:
        return
    left = _x(dates, begin)
    width = max(_x(dates, end) - left, 1e-9)
    ax.barh(y, width, left=left, height=height, color=colour, edgecolor="#333" if hatch else colour,
            linewidth=0.4, hatch=hatch)
    if label and width >= label_min:
        ax.text(left, y, " " + label, va="center", ha="left", fontsize=7, color="white", clip_on=True)


def _rows(history: RunHistory) -> list[tuple[_Row, Any]]:
    """Top to bottom: the head band, the payload runs, then each partition's allocations' nodes."""
    rows: list[tuple[_Row, Any]] = [(_Row("head"), "head")]
    rows += [(_Row(f"payload {p.name or p.run_id or '?'}"), p) for p in history.payloads]
    partitions: dict[str, list[Any]] = {}
    for allocation in history.allocations:
        partitions.setdefault(allocation.partition or "?", []).append(allocation)
    for partition, allocations in partitions.items():
        for allocation in allocations:
            nodes = history.nodes_of(allocation.job)
            if not nodes:
                rows.append((_Row(f"job {allocation.job} (no node started)", partition), (allocation, None)))
            for interval in nodes:
                rows.append((_Row(f"job {allocation.job} {interval.node}", partition), (allocation, interval)))
    return rows


def draw(history: RunHistory, title: str) -> Any:
    """The timeline as a matplotlib ``Figure``."""
    _, dates, patches, Figure = _matplotlib()
    rows = _rows(history)
    height = min(MAX_HEIGHT_INCHES, 2.2 + ROW_INCHES * len(rows))
    fig = Figure(figsize=(14, height), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=11, loc="left", pad=14)
    end = history.ended_at if history.ended_at is not None else history.now
    first = history.first_at if history.first_at is not None else end
    fits = (_x(dates, end) - _x(dates, first)) * 0.04      # a label needs about 4 % of the width
    for y, (row, item) in enumerate(rows):
        if item == "head":
            for i, head in enumerate(history.head_periods):
                since = head.since if head.since is not None else history.first_at
                _span(ax, dates, y, since, head.until, HEAD_COLOURS[i % 2], 0.7, hatch="//" if head.open else None,
                      label=f"head {head.job}", label_min=fits)
        elif isinstance(item, tuple):
            allocation, interval = item
            if interval is None:
                _span(ax, dates, y, allocation.submitted_at, allocation.ended_at or end, PHASE_COLOURS["pending"], 0.25)
                continue
            begin = interval.started_at if interval.started_at is not None else interval.joined_at
            _span(ax, dates, y, allocation.submitted_at, begin, PHASE_COLOURS["pending"], 0.25)
            hatch = "//" if interval.open else None
            joined, draining = interval.joined_at, interval.draining_at
            _span(ax, dates, y, begin, joined or draining or interval.left_at, PHASE_COLOURS["starting"], 0.6,
                  hatch=hatch if joined is None and draining is None else None)
            if joined is not None:
                _span(ax, dates, y, joined, draining or interval.left_at, PHASE_COLOURS["joined"], 0.6,
                      hatch=hatch if draining is None else None, label=allocation.job, label_min=fits)
            if draining is not None:
                _span(ax, dates, y, draining, interval.left_at, PHASE_COLOURS["draining"], 0.6, hatch=hatch)
        else:
            _span(ax, dates, y, item.started_at, item.finished_at, PAYLOAD_COLOURS[item.ok], 0.6,
                  hatch="//" if item.open else None, label=item.run_id or item.name, label_min=fits)
    _groups(ax, rows)
    _markers(ax, dates, history)
    ax.set_yticks(range(len(rows)), [row.label for row, _ in rows], fontsize=8)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    if history.first_at is not None:
        pad = max(2.0, (end - history.first_at) * 0.03)   # a short run fills the width too
        ax.set_xlim(_x(dates, history.first_at - pad), _x(dates, end + pad))
    else:
        ax.text(0.5, 0.5, "no events", transform=ax.transAxes, ha="center", va="center")
    locator = dates.AutoDateLocator(tz=dt.timezone.utc, minticks=4, maxticks=12)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=dt.timezone.utc, show_offset=False))
    ax.set_xlabel(f"time (UTC), from {utc(history.first_at)}")
    ax.grid(axis="x", color="#ddd", linewidth=0.5)
    fig.legend(handles=_legend(patches), loc="outside lower center", ncol=6, fontsize=8, frameon=False)
    return fig


def _groups(ax: Any, rows: list[tuple[_Row, Any]]) -> None:
    """A light band behind each partition's rows, its name at the right."""
    start, shade = 0, False
    for y in range(1, len(rows) + 1):
        group = rows[y - 1][0].group
        if y < len(rows) and rows[y][0].group == group:
            continue
        if group is not None:
            if shade:
                ax.axhspan(start - 0.5, y - 0.5, color="#f4f4f4", zorder=0)
            ax.text(1.002, (start + y - 1) / 2, f"partition {group}", transform=ax.get_yaxis_transform(),
                    fontsize=8, va="center", ha="left", rotation=0)
            shade = not shade
        start = y


def _markers(ax: Any, dates: Any, history: RunHistory) -> None:
    for election in history.elections:
        if election.started_at is not None:
            ax.axvline(_x(dates, election.started_at), color=ELECTION_COLOUR, linestyle="--", linewidth=1)
        if election.won_at is not None:
            ax.axvline(_x(dates, election.won_at), color=ELECTION_COLOUR, linewidth=1.2)
            ax.annotate(f"elected {election.winner}", (_x(dates, election.won_at), 1), xycoords=("data", "axes fraction"),
                        xytext=(2, 3), textcoords="offset points", fontsize=7, color=ELECTION_COLOUR,
                        annotation_clip=False)
    for head in history.head_periods:
        if head.how in (HeadChange.ELECTED, HeadChange.MOVED) and head.since is not None:
            ax.plot([_x(dates, head.since)], [0], marker="v", markersize=9, color=MOVE_COLOUR, clip_on=False)
            ax.axvline(_x(dates, head.since), color=MOVE_COLOUR, linestyle=":", linewidth=1)


def _legend(patches: Any) -> list[Any]:
    handles = [patches.Patch(color=colour, label=phase) for phase, colour in PHASE_COLOURS.items()]
    handles.append(patches.Patch(color=HEAD_COLOURS[0], label="head"))
    handles.append(patches.Patch(color=PAYLOAD_COLOURS[True], label="payload ok"))
    handles.append(patches.Patch(color=PAYLOAD_COLOURS[False], label="payload failed"))
    handles.append(patches.Patch(facecolor="white", edgecolor="#333", hatch="//", label="open at now"))
    handles.append(patches.Patch(color=ELECTION_COLOUR, label="election (dashed: started)"))
    handles.append(patches.Patch(color=MOVE_COLOUR, label="head moved"))
    return handles


def render(history: RunHistory, fmt: str, *, title: str = "elastic-ray run", skipped: int = 0,
           live_idle: Mapping[tuple[str, str], float] | None = None) -> bytes:
    """The timeline as the bytes of a ``png``, ``svg`` or ``html`` file."""
    if fmt not in ("html", "png", "svg"):
        raise TimelineError(f"fmt: {fmt!r} is not one of html, png, svg")
    fig = draw(history, title)
    buffer = io.BytesIO()
    if fmt == "png":
        fig.savefig(buffer, format="png", metadata={"Software": None})
        return buffer.getvalue()
    matplotlib = _matplotlib()[0]
    with matplotlib.rc_context({"svg.fonttype": "none"}):     # text stays text: searchable, selectable, small
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue().decode()
    if fmt == "svg":
        return svg.encode()
    return render_page(history, usage(history, live_idle), svg, title=title, skipped=skipped).encode()


def title_of(history: RunHistory) -> str:
    return f"elastic-ray run {history.session_id}" if history.session_id else "elastic-ray run"
