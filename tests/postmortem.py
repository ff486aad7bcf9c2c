"""What a failed test leaves for the reader of CI's output: the tails of the logs its sessions wrote.

A flake in CI is seen once, on a machine that is gone afterwards; the assertion alone ("timed out
waiting for ...") rarely says why. For a test that failed in its call phase, this hook adds one
report section with the last lines of every local-scheduler log, agent log and event log found
under the test's ``tmp_path`` (a few directory levels down), and the stacks of the test process's
own ``elastic-ray-*`` threads (a supervisor stuck in a call shows where). Both test trees register
it from their conftest.py. Bounded: ``TAIL_LINES`` a file, ``MAX_CHARS`` in all.
"""

from __future__ import annotations

import sys
import threading
import traceback
from pathlib import Path

import pytest

TAIL_LINES = 25
MAX_CHARS = 24_000
PATTERNS = ("*/local-scheduler/scheduler.log", "*/logs/agent-*.log", "*/events.jsonl")
MAX_DEPTH = 3


def _log_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for depth in range(MAX_DEPTH):
        prefix = "*/" * depth
        for pattern in PATTERNS:
            found.extend(root.glob(prefix + pattern))
    return sorted(set(p for p in found if p.is_file()), key=lambda p: (p.stat().st_mtime, str(p)))


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"(unreadable: {exc})"
    return "\n".join(text.splitlines()[-lines:])


def _our_thread_stacks() -> str:
    frames = sys._current_frames()
    out = []
    for thread in threading.enumerate():
        if not thread.name.startswith("elastic-ray") or thread.ident not in frames:
            continue
        stack = "".join(traceback.format_stack(frames[thread.ident])[-8:])
        out.append(f"--- thread {thread.name}\n{stack}")
    return "\n".join(out)


def story(root: Path) -> str:
    """The section's text for the logs under ``root`` (empty when there are none)."""
    parts = []
    for path in _log_files(root):
        parts.append(f"--- {path.relative_to(root)} (last {TAIL_LINES} lines)\n{tail(path)}")
    stacks = _our_thread_stacks()
    if stacks:
        parts.append(stacks)
    text = "\n".join(parts)
    return text if len(text) <= MAX_CHARS else "[...]\n" + text[-MAX_CHARS:]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    root = getattr(item, "funcargs", {}).get("tmp_path")
    if not isinstance(root, Path):
        return
    try:
        text = story(root)
    except Exception as exc:  # noqa: BLE001 - a post-mortem must never hide the failure itself
        text = f"(post-mortem failed: {type(exc).__name__}: {exc})"
    if text:
        report.sections.append(("session logs (tests/postmortem.py)", text))
