"""The demo's payload driver: units of Ray work, each committed to a file once.

Run as ``python -m elastic_ray.demo.payload COMMITS TOTAL``. A relaunch skips
committed units, which is how a payload survives a head failover: the new
head is a new Ray cluster, so the only state that carries over is what was
committed outside Ray. :func:`commit_units` is the loop itself, shared with
the Dagster Pipes variant (``elastic_ray.demo.pipes_payload``).

Two optional environment knobs serve the fault matrix (``integration/faults``),
which must tell a unit computed twice from a unit committed twice:
``ELASTIC_RAY_PAYLOAD_TRACE`` names a file that gets one line per attempt
(``start UNIT TIME NODE``, written by the task on its node) and per commit
(``commit UNIT TIME``, written by the driver), and ``driver begun TIME`` /
``driver connected TIME`` when a driver's process began and its ``ray.init()``
returned; ``ELASTIC_RAY_PAYLOAD_UNIT_SECONDS``
sets how long a unit computes (0.3 s by default).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable

from .. import knobs


def commit_units(path: str, total: int, say: Callable[[str], None] = print) -> dict[str, int]:
    """Compute and commit every unit of ``range(total)`` not yet in ``path``.

    Needs a connected Ray. Returns counts: already committed, committed now,
    and the number of distinct nodes that computed them.
    """
    import ray

    done = set(open(path).read().split()) if os.path.exists(path) else set()
    trace = knobs.PAYLOAD_TRACE.read()
    seconds = knobs.PAYLOAD_UNIT_SECONDS.value()

    @ray.remote(num_cpus=1, max_retries=3)
    def work(unit: int) -> tuple[int, str]:
        node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
        if trace:
            _append(trace, f"start {unit} {time.time():.3f} {node}\n")
        time.sleep(seconds)
        return unit, node

    todo = [u for u in range(total) if str(u) not in done]
    say(f"payload: {len(done)} units already committed, {len(todo)} to go")
    all_nodes: set[str] = set()
    committed = 0
    while todo:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        wave, todo = todo[:cpus], todo[cpus:]
        nodes = set()
        for unit, node in ray.get([work.remote(u) for u in wave]):
            nodes.add(node)
            _append(path, f"{unit}\n")
            if trace:
                _append(trace, f"commit {unit} {time.time():.3f}\n")
            committed += 1
        all_nodes |= nodes
        say(f"payload: committed {len(wave)} units on {sorted(nodes)}; cluster CPUs {cpus}; {len(todo)} left")
    return {"already_committed": len(done), "committed_now": committed, "nodes": len(all_nodes)}


def _append(path: str, line: str) -> None:
    """One durable append: a crash after it returns cannot lose the line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def main() -> int:
    trace = knobs.PAYLOAD_TRACE.read()
    if trace:   # when the driver began and connected: phases of a relaunch (bench_head_capacity)
        _append(trace, f"driver begun {time.time():.3f}\n")
    import ray

    path, total = sys.argv[1], int(sys.argv[2])
    ray.init(logging_level="ERROR", log_to_driver=False)
    if trace:
        _append(trace, f"driver connected {time.time():.3f}\n")
    commit_units(path, total, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
