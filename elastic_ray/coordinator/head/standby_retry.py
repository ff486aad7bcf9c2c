"""When a warm standby that failed is started again: a growing delay with a cap.

A standby whose start keeps failing (a node short of memory, a port taken by
another user's process, a Ray that crashes at once) used to be started again
at every check of the supervisor, every 30 s for as long as the run lasted:
each try a `ray start --head` on a node that is running the user's work.
Now the delay after the n-th failure in a row is :data:`FIRST` x 2^(n-1),
at most :data:`MAX`; one start that comes up resets the count (the agent
counts, ``HostedHead.failures``, so a restarted supervisor keeps the pace).

Pure: the keeper (:mod:`.standby`) and ``elastic-ray session status`` ask
the same questions of the same published record.
"""

from __future__ import annotations

from ...protocol.disk.records import HostedHead, HostedHeadState

#: The wait after the first failure: one supervisor check, as before.
FIRST = 30.0
#: The longest wait between two tries (reached after the sixth failure in a row).
MAX = 900.0


def retry_delay(failures: int) -> float:
    """How long after its ``failures``-th failure in a row a standby is tried again."""
    if failures <= 0:
        return 0.0
    return min(MAX, FIRST * 2.0 ** min(failures - 1, 32))


def next_try_at(hosted: HostedHead | None) -> float | None:
    """When a FAILED hosted control plane may be started again as a standby;
    None when it did not fail. An agent that does not count failures (an
    older one) counts as one failure."""
    if hosted is None or hosted.state is not HostedHeadState.FAILED:
        return None
    failures = hosted.failures if hosted.failures is not None else 1
    return hosted.at + retry_delay(max(1, failures))


__all__ = ["FIRST", "MAX", "next_try_at", "retry_delay"]
