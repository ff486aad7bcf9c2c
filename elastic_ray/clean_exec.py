"""``python -m elastic_ray.clean_exec CMD [ARG...]``: run CMD with the stop signals as a fresh process has them.

A signal a process ignores or blocks stays so in every child, through fork
and exec. A parent may leave SIGTERM so without knowing: Dagster maps
SIGTERM onto SIGINT's handler while it runs a step, and where SIGINT is
ignored (a job started in the background, a test runner's worker) SIGTERM
ends up ignored too. A driver started from such a process would outlive the
SIGTERM that asks it to stop and be SIGKILLed after its grace, with no
chance to clean up. The session starts its local drivers through this
module, which sets SIGTERM, SIGINT, SIGHUP and SIGQUIT back to their
defaults, unblocks them, and execs CMD: a Python CMD then installs its own
Ctrl-C handler as usual. (Under Slurm, ``srun`` and ``slurmstepd`` start the
driver and the agent afresh on the node.)
"""

from __future__ import annotations

import os
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def reset_stop_signals() -> None:
    """This process's stop signals to their defaults, none blocked (what its children inherit)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m elastic_ray.clean_exec CMD [ARG...]", file=sys.stderr)
        return 2
    reset_stop_signals()
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"elastic_ray.clean_exec: cannot run {argv[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0   # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
