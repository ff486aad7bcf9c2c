"""``elastic-ray session events``: the run's history from its event log.

Reads ``events.jsonl`` (see :mod:`..protocol.disk.events`) and needs no
scheduler: it works on a login host, on a copy of the directory, after the
run. ``--follow`` keeps printing what is appended, like ``journalctl -f``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from pathlib import Path

import click

from ..protocol.disk import event_log
from ..protocol.disk.events import Event, describe
from ..protocol.disk.session_dir import SessionDir
from .output import JSON_OPTION, JsonCommand, echo_json, failures_as_click, session_directory

_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now: float) -> float:
    """``--since``: an age (``90s``, ``15m``, ``2h``, ``1d``) or a time (ISO 8601; UTC when no zone is given)."""
    text = text.strip()
    ago = _AGO.fullmatch(text)
    if ago:
        return now - float(ago.group(1)) * _UNIT[ago.group(2)]
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is neither an age (90s, 15m, 2h, 1d) nor a time "
                                 "(2026-12-01T19:00:00, UTC unless a zone is given)", param_hint="--since") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return when.timestamp()


def format_time(at: float) -> str:
    """``2026-12-01 19:50:33.372Z``: UTC, to the millisecond."""
    stamp = dt.datetime.fromtimestamp(at, dt.timezone.utc)
    return stamp.strftime("%Y-%m-%d %H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"


def format_line(event: Event) -> str:
    return f"{format_time(event.at)}  {event.by.value:<11} {describe(event)}"


def _follow_sleep(seconds: float) -> None:
    time.sleep(seconds)      # a module attribute, so a test can end a follow as Ctrl-C would


@click.command("events", cls=JsonCommand)
@click.argument("directory", metavar="[DIR]", required=False, type=click.Path(file_okay=False, path_type=Path))
@JSON_OPTION
@click.option("--follow", "-f", is_flag=True, help="Keep printing events as they are appended, until Ctrl-C.")
@click.option("--since", metavar="AGE|TIME", help="Only events from then on: 90s, 15m, 2h, 1d, or an ISO time (UTC).")
@failures_as_click
def events_cmd(directory: Path | None, as_json: bool, follow: bool, since: str | None) -> None:
    """The run's history: submissions, pending reasons, starts, joins, drains,
    removals, failures, elections and head moves, one line each, oldest first.

    With ``--json``: one JSON object (schema elastic-ray/1) with every event;
    with ``--follow --json``: one event object a line (JSON Lines), as they come.
    """
    start = None if since is None else parse_since(since, time.time())
    path = session_directory(directory)
    SessionDir.open(path)           # a clear error for a directory that is not a session
    if not follow:
        reading = event_log.read(path, since=start)
        if as_json:
            echo_json("session events", {"events": [e.to_dict() for e in reading.events],
                                         "skipped": {k.value: n for k, n in reading.skipped.items()}})
            return
        for event in reading.events:
            click.echo(format_line(event))
        if reading.skipped:
            click.echo("skipped lines: " + ", ".join(f"{n} {k.value}" for k, n in reading.skipped.items()),
                       err=True)
        return
    try:
        for event in event_log.follow(path, interval=0.5, sleep=_follow_sleep):
            if start is not None and event.at < start:
                continue
            click.echo(json.dumps(event.to_dict(), separators=(",", ":")) if as_json else format_line(event))
    except KeyboardInterrupt:
        pass
