"""Reading a run's history off its session directory: the effects around :mod:`.runs` and :mod:`.usage`.

The event log (every event still on disk) and, for nodes still in the run,
their node files (where each agent keeps its GPU figures until it writes
them in ``node_left``). Nothing here writes, locks or asks a scheduler.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..atomic import read_record
from ..errors import ElasticRayError
from ..protocol.disk import event_log, paths
from ..protocol.disk.records import NodeState
from .runs import RunHistory, build
from .usage import RunUsage, usage


def read_history(path: Path) -> tuple[RunHistory, int]:
    """The run's history as of now, and how many lines of its log could not be read."""
    reading = event_log.read(path)
    return build(reading.events, time.time()), sum(reading.skipped.values())


def live_idle(path: Path, history: RunHistory) -> dict[tuple[str, str], float]:
    """GPU-seconds idle of the nodes still in the run, from their node files (where their agents keep them).

    A node file that is missing or unreadable just leaves that node unmeasured."""
    found: dict[tuple[str, str], float] = {}
    for interval in history.nodes:
        if not interval.open:
            continue
        try:
            state = read_record(paths.node_state_file(path, interval.job, interval.node), NodeState.from_dict)
        except (OSError, ValueError, ElasticRayError):
            continue
        if state.gpu_usage is not None:
            found[(interval.job, interval.node)] = state.gpu_usage.idle_gpu_seconds
    return found


def run_usage(path: Path) -> tuple[RunHistory, RunUsage]:
    """The run's history and its figures as of now, live nodes' idle GPU-seconds included."""
    history, _ = read_history(path)
    return history, usage(history, live_idle(path, history))
