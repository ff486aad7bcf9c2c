"""What a failed test leaves for the reader of CI's output: the tails of the logs its sessions wrote.

A flake in CI is seen once, on a machine that is gone afterwards; the assertion alone ("timed out
waiting for ...") rarely says why. For a test that failed in its call phase, this hook adds one
report section with the last lines of every local-scheduler log, agent log, job output and event
log found under the test's ``tmp_path`` (a few directory levels down) and, for a lab test
(marked ``slurm``), under the lab's shared directory where its sessions live, written in the last
``LAB_RECENT`` seconds (the lab's `down` removes them when the run ends); then the stacks of the
test process's own ``elastic-ray-*`` threads (a supervisor stuck in a call shows where). Both
test trees register it from their conftest.py. Bounded: ``TAIL_LINES`` a file, ``MAX_CHARS`` in
all, the most recent kept.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from pathlib import Path

import pytest

TAIL_LINES = 25
MAX_CHARS = 24_000
PATTERNS = ("*/local-scheduler/scheduler.log", "*/logs/agent-*.log", "*/logs/*.out", "*/events.jsonl")
MAX_DEPTH = 3
#: Lab sessions sit deeper (shared/<module>/<run>/session/...), and the files of every earlier lab
#: test are there too: only those written this recently count.
LAB_DEPTH = 5
LAB_RECENT = 900.0


def _log_files(root: Path, depth: int = MAX_DEPTH, since: float | None = None) -> list[Path]:
    found: list[Path] = []
    for level in range(depth):
        prefix = "*/" * level
        for pattern in PATTERNS:
            found.extend(root.glob(prefix + pattern))
    files = [(p.stat().st_mtime, str(p), p) for p in set(found) if p.is_file()]
    return [p for mtime, _, p in sorted(files) if since is None or mtime >= since]


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


def story(root: Path | None, lab: Path | None = None, now: float | None = None) -> str:
    """The section's text for the logs under ``root`` and the recent ones under ``lab`` (empty when
    there are none)."""
    found: list[tuple[Path, Path]] = []     # (the root it was found under, the file)
    if root is not None and root.is_dir():
        found += [(root, p) for p in _log_files(root)]
    if lab is not None and lab.is_dir():
        found += [(lab, p) for p in _log_files(lab, LAB_DEPTH, (now or time.time()) - LAB_RECENT)]
    parts = [f"--- {path.relative_to(base)} (last {TAIL_LINES} lines)\n{tail(path)}" for base, path in found]
    stacks = _our_thread_stacks()
    if stacks:
        parts.append(stacks)
    text = "\n".join(parts)
    return text if len(text) <= MAX_CHARS else "[...]\n" + text[-MAX_CHARS:]


def _lab_shared_dir() -> Path | None:
    try:
        from integration import labctl
        return labctl.settings_from_env().shared_dir
    except Exception:  # noqa: BLE001 - no lab package or bad knobs: nothing to add
        return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    root = getattr(item, "funcargs", {}).get("tmp_path")
    lab = _lab_shared_dir() if item.get_closest_marker("slurm") is not None else None
    if not isinstance(root, Path):
        root = None
    if root is None and lab is None:
        return
    try:
        text = story(root, lab)
    except Exception as exc:  # noqa: BLE001 - a post-mortem must never hide the failure itself
        text = f"(post-mortem failed: {type(exc).__name__}: {exc})"
    if text:
        report.sections.append(("session logs (tests/postmortem.py)", text))
