"""An autouse fixture for both test trees (tests/ and integration/ import it in their conftest.py)."""

from __future__ import annotations

import signal as _signal
import warnings as _warnings
from pathlib import Path

import pytest as _pytest

_GUARDED = (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP)


def _blocked_and_ignored() -> tuple[set[int], set[int]]:
    """The guarded signals this process's main thread blocks, and those it ignores (both pass to children)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("SigBlk", "SigIgn"):
            bits = int(value.strip(), 16)
            fields[key] = {int(s) for s in _GUARDED if bits >> (int(s) - 1) & 1}
    return fields.get("SigBlk", set()), fields.get("SigIgn", set())


# What the runner gave this process: a run started in the background has SIGINT (and, under nohup,
# SIGHUP) ignored from the start, which is the runner's business. SIGTERM is never ignored on purpose.
_BASELINE_IGNORED = _blocked_and_ignored()[1] - {int(_signal.SIGTERM)}


@_pytest.fixture(autouse=True)
def _signals_left_as_found(request):
    """A test that leaves SIGTERM (or SIGINT, SIGHUP) blocked, or ignored beyond what the runner gave,
    hands that to every process a later test starts: ``sleep``, a stand-in ``ray start``, a driver then
    outlive their SIGTERM and are SIGKILLed (seen in CI). Dagster does it: while a step runs it maps
    SIGTERM onto SIGINT's handler, and where SIGINT is ignored (a background run) SIGTERM stays ignored
    after ``materialize``. The guard puts the signals back after each test and names it in a warning."""
    yield
    blocked, ignored = _blocked_and_ignored()
    ignored -= _BASELINE_IGNORED
    if blocked:
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, blocked)
    for signum in ignored:
        _signal.signal(signum, _signal.default_int_handler if signum == _signal.SIGINT else _signal.SIG_DFL)
    if blocked or ignored:
        names = ", ".join(sorted(_signal.Signals(s).name for s in blocked | ignored))
        _warnings.warn(f"{request.node.nodeid} left {names} blocked or ignored in the test process; put back",
                       stacklevel=1)
