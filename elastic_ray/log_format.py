"""Log lines as text (the default) or as one JSON object each, for log shippers.

``--log-format json`` of ``elastic-agent run`` and ``elastic-ray`` (or
``ELASTIC_AGENT_LOG_FORMAT`` / ``ELASTIC_RAY_LOG_FORMAT``) turns every log
record into one line holding a JSON object: ``time`` (UTC, ISO 8601 with
milliseconds), ``level``, ``logger``, ``message`` (the text line as the text
format shows it), then the record's fields as keys of their own (``event``,
``job``, ``node``, ``role``, ``state``, ...), so a shipper indexes them
without a parser of ours.

Where the fields come from: a caller that has them as values passes them in
``extra={"fields": {...}}`` (the agent's ``_log`` does), and they keep their
JSON types; otherwise they are read back from the ``key=value`` words of the
message, the form every event line of the project has (values with blanks
are quoted as Python's ``repr`` quotes them), as strings. A field never
replaces one of the four base keys; it is kept as ``<name>_`` instead.

Pure apart from :class:`JsonFormatter` (a ``logging.Formatter``) and
:func:`formatter`; belongs to no room (the agent and the CLI both use it)
and imports only the standard library.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import shlex
from collections.abc import Mapping
from typing import Any

FORMATS = ("text", "json")
#: The text format's layout (the agent's log files have always had it).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(message)s"
#: The ``extra`` key a caller passes structured fields under.
FIELDS_ATTR = "fields"
BASE_KEYS = ("time", "level", "logger", "message")

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def utc_time(created: float) -> str:
    """``1764618639.5`` -> ``2025-12-01T19:50:39.500Z``."""
    stamp = datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc)
    return stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message_fields(message: str) -> dict[str, str]:
    """The ``key=value`` words of an event line, in order; other words are left out.

    A line that does not split as a shell would split it (an unbalanced
    quote) gives only the words before the damage: nothing is guessed.
    """
    try:
        words = shlex.split(message, posix=True)
    except ValueError:
        words = []
        lexer = shlex.shlex(message, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        try:
            for word in lexer:
                words.append(word)
        except ValueError:
            pass
    fields: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if sep and _KEY.fullmatch(key):
            fields[key] = value
    return fields


def json_line(*, created: float, level: str, logger: str, message: str,
              fields: Mapping[str, Any] | None = None, exc_text: str | None = None) -> str:
    """One log record as one line of JSON (no newline inside: ``json.dumps`` escapes them)."""
    out: dict[str, Any] = {"time": utc_time(created), "level": level, "logger": logger, "message": message}
    for key, value in (message_fields(message) if fields is None else fields).items():
        out[f"{key}_" if key in BASE_KEYS else str(key)] = value
    if exc_text:
        out["exception"] = exc_text
    return json.dumps(out, default=str, ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    """A ``logging.Formatter`` that writes :func:`json_line`."""

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, FIELDS_ATTR, None)
        exc_text = self.formatException(record.exc_info) if record.exc_info else None
        return json_line(created=record.created, level=record.levelname, logger=record.name,
                         message=record.getMessage(),
                         fields=fields if isinstance(fields, Mapping) else None, exc_text=exc_text)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter of ``log_format`` (one of :data:`FORMATS`)."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"log format {log_format!r}: must be one of {', '.join(FORMATS)}")
