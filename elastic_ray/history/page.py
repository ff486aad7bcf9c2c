"""The timeline as one self-contained HTML page: the drawing inline, then the tables.

A page that is mailed around, attached to an issue or opened on a cluster's
login node without a route out must show everything from the one file: the
drawing is inline SVG (its text is SVG text in the reader's own fonts:
nothing to fetch), the style is inline, and a Content-Security-Policy
forbids any fetch, so a page that tried would show it, not leak it.

Under the drawing: the allocations, the usage figures, the head periods,
elections and payload runs, and the events themselves (the newest
:data:`MAX_EVENT_ROWS` of them; a run's log holds at most two 8 MB files).

Pure: strings in, a string out.
"""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Iterable, Sequence

from .runs import RunHistory
from .usage import RunUsage

MAX_EVENT_ROWS = 10_000

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
tr.total td { font-weight: bold; border-top: 2px solid #888; }
#timeline svg { max-width: 100%; height: auto; }
.note { color: #666; }
"""
# Nothing may be fetched: no script, no image, no font, no frame, no form target.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def utc(at: float | None) -> str:
    if at is None:
        return "?"
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def hours(value: float | None) -> str:
    return "?" if value is None else f"{value:.2f}"


def _cell(value: object, numeric: bool = False) -> str:
    text = "" if value is None else str(value)
    return f'<td class="n">{html.escape(text)}</td>' if numeric else f"<td>{html.escape(text)}</td>"


def _table(table_id: str, header: Sequence[str], rows: Iterable[Sequence[object]], numeric: frozenset[int] = frozenset(),
           total: Sequence[object] | None = None) -> str:
    out = [f'<table id="{table_id}"><thead><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in header)
           + "</tr></thead><tbody>"]
    for row in rows:
        out.append("<tr>" + "".join(_cell(v, i in numeric) for i, v in enumerate(row)) + "</tr>")
    if total is not None:
        out.append('<tr class="total">' + "".join(_cell(v, i in numeric) for i, v in enumerate(total)) + "</tr>")
    return "".join(out) + "</tbody></table>"


def inline_svg(svg: str) -> str:
    """matplotlib's SVG document without its XML prolog, doctype and RDF metadata, to sit inside HTML."""
    start = svg.find("<svg")
    return "" if start < 0 else re.sub(r"<metadata>.*?</metadata>\s*", "", svg[start:], count=1, flags=re.S)


def allocations_table(history: RunHistory) -> str:
    rows = []
    for a in history.allocations:
        seen = len({n.node for n in history.nodes_of(a.job)})
        rows.append((a.job, a.role, a.partition, f"{seen}/{'?' if a.nodes_requested is None else a.nodes_requested}",
                     a.gpus_per_node, utc(a.submitted_at), utc(a.started_at),
                     "live" if a.live else utc(a.ended_at), a.ended_how, a.end_state, a.replaces))
    return _table("allocations", ("job", "role", "partition", "nodes seen/asked", "GPUs/node", "submitted",
                                  "first started", "ended", "how", "state", "replaces"), rows, frozenset({3, 4}))


def usage_table(figures: RunUsage) -> str:
    rows = [(u.job, u.role, u.partition, u.nodes, hours(u.node_hours), hours(u.gpu_hours_held),
             "-" if u.gpu_hours_idle is None else hours(u.gpu_hours_idle), "live" if u.live else u.ended_how or "?",
             "yes" if u.partial else "") for u in figures.allocations]
    total = ("run", "", "", sum(u.nodes for u in figures.allocations), hours(figures.node_hours),
             hours(figures.gpu_hours_held), "-" if figures.gpu_hours_idle is None else hours(figures.gpu_hours_idle),
             "", "yes" if figures.partial else "")
    return _table("usage", ("job", "role", "partition", "nodes", "node-hours", "GPU-hours held", "GPU-hours idle",
                            "ended", "partial"), rows, frozenset({3, 4, 5, 6}), total)


def _runs_tables(history: RunHistory) -> str:
    heads = _table("heads", ("job", "since", "until", "how"),
                   ((h.job, utc(h.since), "now" if h.open else utc(h.until), h.how) for h in history.head_periods))
    elections = _table("elections", ("started", "won", "winner", "previous head", "reason"),
                       ((utc(e.started_at), utc(e.won_at), e.winner, e.previous, e.reason) for e in history.elections))
    payloads = _table("payloads", ("name", "run id", "started", "finished", "ok"),
                      ((p.name, p.run_id, utc(p.started_at), "running" if p.open else utc(p.finished_at),
                        "" if p.ok is None else "yes" if p.ok else "no") for p in history.payloads))
    return (f"<h2>Head</h2>{heads}<h2>Elections</h2>{elections}<h2>Payload runs</h2>{payloads}")


def events_table(history: RunHistory) -> str:
    shown = history.events[-MAX_EVENT_ROWS:]
    left_out = len(history.events) - len(shown)
    note = f'<p class="note">The oldest {left_out} events are left out of this list.</p>' if left_out else ""
    rows = ((utc(e.at), e.kind.value, e.by.value, e.job, e.node, e.reason,
             " ".join(f"{k}={v}" for k, v in e.details.items())) for e in shown)
    return note + _table("events", ("time (UTC)", "kind", "by", "job", "node", "reason", "details"), rows)


def render_page(history: RunHistory, figures: RunUsage, svg: str, *, title: str, skipped: int = 0) -> str:
    """The whole page. ``svg`` is the drawing; ``skipped``: lines of the log that could not be read."""
    span = f"{utc(history.first_at)} to {'now, ' + utc(history.now) if history.ended_at is None else utc(history.ended_at)}"
    facts = [f"{span} (UTC)", f"{len(history.events)} events"]
    if skipped:
        facts.append(f"{skipped} lines of the log could not be read")
    if history.events and history.events[0].kind.value != "session_created":
        facts.append("the log's oldest lines may be gone (it keeps only its newest): what they told shows as ?")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p>{html.escape('; '.join(facts))}</p>"
            f'<section id="timeline">{inline_svg(svg)}</section>'
            f"<h2>Allocations</h2>{allocations_table(history)}"
            f"<h2>Usage</h2>{usage_table(figures)}"
            '<p class="note">Node-hours count each node from its agent\'s start to its leaving. '
            "GPU-hours idle: held while no Ray task or actor had them, as each node's agent measured it "
            "once a minute (- where no agent measured).</p>"
            f"{_runs_tables(history)}"
            f"<h2>Events</h2>{events_table(history)}"
            "</body></html>\n")
