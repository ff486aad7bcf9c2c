"""What every ``elastic-ray`` command shares about output, errors and its session directory.

Output rule: results go to stdout in a form a script can read (a job id, a
state; with ``--json`` one JSON object and nothing else); progress and
human context go to stderr. Errors are one line on stderr, exit status 2
for a bad argument and 1 for a failure; with ``--json`` the same error is
also a JSON object on stdout, so a script that parses stdout always gets one.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from .. import knobs
from ..config.session_file import SESSION_ENV
from ..errors import ElasticRayError

#: Names the layout of every ``--json`` document; raised when a field changes meaning or goes.
SCHEMA = "elastic-ray/1"


def out_console() -> Console:
    # Wide enough for the table when piped (a log, a test), natural width on a terminal.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def err_console() -> Console:
    return Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


def one_line(exc: BaseException) -> str:
    """An error as one line: the first line of the message, a log tail replaced by its path."""
    text = str(exc).strip() or type(exc).__name__
    first = text.splitlines()[0]
    return re.sub(r"last lines of (\S+):$", r"see \1", first)


def failures_as_click(func: Callable[..., Any]) -> Callable[..., Any]:
    """Expected failures become one-line errors with exit status 1, never tracebacks."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except click.ClickException:
            raise
        except (ElasticRayError, TimeoutError, OSError, ValueError) as exc:
            # ElasticRayError covers ConfigError, SessionDirError, SchedulerError,
            # AllocationFailed; ValueError is what the Session raises for a bad handle.
            raise click.ClickException(one_line(exc)) from None

    return wrapper


# =============================================================== JSON documents

def document(command: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """Pure: a command's ``--json`` result; ``schema`` and ``command`` come first."""
    return {"schema": SCHEMA, "command": command, **fields}


def error_document(command: str, exc: click.ClickException) -> dict[str, Any]:
    """Pure: a failed command's ``--json`` answer. ``type`` is ``usage`` (exit 2) or ``failure`` (exit 1)."""
    kind = "usage" if isinstance(exc, click.UsageError) else "failure"
    return document(command, {"error": {"type": kind, "message": exc.format_message(),
                                        "exit_code": exc.exit_code}})


def echo_json(command: str, fields: Mapping[str, Any]) -> None:
    click.echo(json.dumps(document(command, fields), indent=2, sort_keys=False, default=str))


def _command_name(parent: click.Context | None, info_name: str | None) -> str:
    # "session status", "render": the command path without the program's own name.
    words = [info_name or ""]
    while parent is not None and parent.parent is not None:
        words.insert(0, parent.info_name or "")
        parent = parent.parent
    return " ".join(words).strip()


class JsonCommand(click.Command):
    """A command with ``--json``: any error it ends with, a bad option included
    (click finds those before the command runs), is also a JSON object on stdout."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        wants_json = "--json" in args      # looked at before parsing: a parse error must answer in JSON too
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.ClickException as exc:
            if wants_json:
                click.echo(json.dumps(error_document(_command_name(parent, info_name), exc), indent=2))
            raise

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if ctx.params.get("as_json"):
                click.echo(json.dumps(error_document(_command_name(ctx.parent, ctx.info_name), exc), indent=2))
            raise


JSON_OPTION = click.option("--json", "as_json", is_flag=True,
                           help="Print one JSON object (schema elastic-ray/1) on stdout and nothing else.")


# =============================================================== the session directory

def session_directory(given: Path | None, environ: Mapping[str, str] | None = None) -> Path:
    """DIR as given, else ``$ELASTIC_RAY_SESSION``; a usage error (exit 2) naming both when neither is set."""
    if given is not None:
        return given
    value = knobs.SESSION.read(environ)
    if value is None:
        raise click.UsageError(f"DIR: no session directory given; pass DIR or set {SESSION_ENV}")
    return Path(value)


class Progress:
    """A spinner with the latest progress text on a terminal; on anything else
    (a log file, CI) each new text as a timestamped line on stderr."""

    def __init__(self, console: Console, initial: str):
        self.console = console
        self.initial = initial
        self._status: Any = None
        self._last = ""

    def __enter__(self) -> "Progress":
        if self.console.is_terminal:
            self._status = self.console.status(self.initial)
            self._status.__enter__()
        else:
            self(self.initial)
        return self

    def __call__(self, text: str) -> None:
        if text == self._last:
            return
        self._last = text
        if self._status is not None:
            self._status.update(text)
        else:
            self.console.print(f"{time.strftime('%H:%M:%S')} {text}", markup=False)

    def __exit__(self, *exc: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc)
