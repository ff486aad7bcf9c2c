"""Issue 24: when no head can be had (the head lost, no worker allocation to
host one, the scheduler refusing a new head allocation), the run's status
says so until a head is elected again: ``session status`` shows the reason,
``--check`` counts it as a lost head."""

from __future__ import annotations

import pytest
from rich.console import Console

from elastic_ray.cli.status_model import CHECK_HEAD_LOST, failed_election, health
from elastic_ray.cli.status_view import render_status
from elastic_ray.protocol.disk.events import Event, EventKind, EventSource
from tests.test_cli import NOW, _status

WHY = "head 4 is COMPLETING, no worker allocation can host the head, and the scheduler refused a new head allocation"


def ev(at: float, kind: EventKind, **kw) -> Event:
    return Event(at, kind, EventSource.COORDINATOR, **kw)


@pytest.mark.parametrize("events, expected", [
    pytest.param([], None, id="none"),
    pytest.param([ev(1, EventKind.ELECTION_STARTED), ev(2, EventKind.ELECTION_FAILED, reason=WHY)],
                 {"at": 2, "reason": WHY}, id="failed"),
    pytest.param([ev(2, EventKind.ELECTION_FAILED, reason="first"), ev(3, EventKind.ELECTION_FAILED, reason=WHY)],
                 {"at": 3, "reason": WHY}, id="the-last-one"),
    pytest.param([ev(2, EventKind.ELECTION_FAILED, reason=WHY), ev(9, EventKind.ELECTION_WON, job="7")],
                 None, id="a-head-elected-after"),
    pytest.param([ev(2, EventKind.ELECTION_FAILED, reason=WHY), ev(9, EventKind.HEAD_MOVED, job="7")],
                 None, id="the-head-moved-after"),
    pytest.param([ev(1, EventKind.ELECTION_WON, job="7"), ev(2, EventKind.ELECTION_FAILED, reason=WHY)],
                 {"at": 2, "reason": WHY}, id="failed-after-an-earlier-win"),
])
def test_the_last_failed_election_counts_until_a_head_comes(events, expected):
    assert failed_election(events) == expected


def test_status_and_check_say_no_head_can_be_had():
    status = _status()
    status["head"]["election_failed"] = {"at": NOW - 42, "reason": WHY}
    code, reasons = health(status)
    assert code == CHECK_HEAD_LOST and f"no head can be had: {WHY}" in reasons
    console = Console(width=300, record=True, file=open("/dev/null", "w"))
    console.print(render_status(status))
    assert f"no head can be had (42s ago): {WHY}" in console.export_text()


def test_without_a_failed_election_nothing_is_said():
    status = _status()
    status["head"]["election_failed"] = None
    assert not any("no head can be had" in r for r in health(status)[1])
