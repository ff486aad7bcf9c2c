"""The committing Pipes payload, after noting its own pid: ``PIDS COMMITS TOTAL``.

The retry test kills a run's Dagster process while this driver runs. On
Slurm the driver is a step of the head job and ends when the head job is
cancelled; on the local scheduler it is a process of its own, so the test
ends it by the pid written here, as the lost host would have.
"""

from __future__ import annotations

import os
import sys

from elastic_ray.demo.pipes_payload import main

if __name__ == "__main__":
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    sys.exit(main(sys.argv[2:]))
