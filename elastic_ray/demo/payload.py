"""The demo's payload driver: units of Ray work, each committed to a file once.

Run as ``python -m elastic_ray.demo.payload COMMITS TOTAL``. A relaunch skips
committed units, which is how a payload survives a head failover: the new
head is a new Ray cluster, so the only state that carries over is what was
committed outside Ray.
"""

from __future__ import annotations

import os
import socket
import sys
import time


def main() -> int:
    import ray

    path, total = sys.argv[1], int(sys.argv[2])
    ray.init(logging_level="ERROR", log_to_driver=False)
    done = set(open(path).read().split()) if os.path.exists(path) else set()

    @ray.remote(num_cpus=1, max_retries=3)
    def work(unit: int) -> tuple[int, str]:
        time.sleep(0.3)
        return unit, os.environ.get("SLURMD_NODENAME", socket.gethostname())

    todo = [u for u in range(total) if str(u) not in done]
    print(f"payload: {len(done)} units already committed, {len(todo)} to go", flush=True)
    while todo:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        wave, todo = todo[:cpus], todo[cpus:]
        nodes = set()
        for unit, node in ray.get([work.remote(u) for u in wave]):
            nodes.add(node)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            os.write(fd, f"{unit}\n".encode())
            os.fsync(fd)
            os.close(fd)
        print(f"payload: committed {len(wave)} units on {sorted(nodes)}; cluster CPUs {cpus}; "
              f"{len(todo)} left", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
