"""Shared pieces of the Dagster tests: a session root that is cleaned up.

Every session a test's assets create lives under one temporary root; the
fixture tears down whatever is still there afterwards (a test that failed
half-way must not leave agents and Ray behind), then waits for the jobs to end.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from elastic_ray.coordinator.session import Session
from tests.helpers import wait_until


def teardown_all(root: Path) -> None:
    for path in sorted(p for p in root.iterdir() if (p / "session.json").is_file()) if root.is_dir() else []:
        session = Session.open(path, supervise=False)
        try:
            session.teardown()
            wait_until(lambda: all(i.state.is_final for i in session.query().values()), timeout=60,
                       message=f"jobs of {path.name} did not end after teardown")
        finally:
            session.close()


@pytest.fixture(name="session_root")
def session_root_fixture(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_AGENT_BACKOFF_BASE", "1")
    monkeypatch.setenv("ELASTIC_AGENT_POLL_INTERVAL", "0.5")
    root = tmp_path / "sessions"
    monkeypatch.setenv("ELASTIC_RAY_SESSION_ROOT", str(root))
    yield root
    teardown_all(root)


def all_jobs_final(root: Path) -> bool:
    for path in (p for p in root.iterdir() if (p / "session.json").is_file()):
        session = Session.open(path, supervise=False)
        try:
            if not all(i.state.is_final for i in session.query().values()):
                return False
        finally:
            session.close()
    return True
