"""Telling every agent that the head moved, without making the mover wait.

A nudge (the ``follow`` control request) only saves an agent the rest of its
pointer period (1 s): every agent reads ``ray_head`` on its own. Sent one at
a time, each with its own socket and CURVE handshake, 200 nudges took 4.4-5.3 s
in ``bench/bench_scale.py``, and ``replace_head()`` waited for all of them,
longer than the agents took to follow by themselves. So they go out from a
background thread, several at once, and give up at a deadline: the elector
returns as soon as the pointer is written.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from ...protocol.wire.channel import ControlError

log = logging.getLogger("elastic_ray.coordinator")

#: Nudges in flight at once (each waits mostly on the network and the agent).
PARALLEL = 16
#: After this, nudges not yet sent are dropped: the agents read the pointer anyway.
DEADLINE = 3.0
REQUEST_TIMEOUT = 1.0


def nudge(endpoints: Iterable[str], job: str, control: Callable[[str], AbstractContextManager[Any]], *,
          parallel: int = PARALLEL, deadline: float = DEADLINE) -> threading.Thread:
    """Send ``follow`` for head ``job`` to every control endpoint; returns the
    (daemon) thread doing it, already started."""
    targets = list(dict.fromkeys(endpoints))

    def one(endpoint: str) -> bool:
        try:
            with control(endpoint) as client:
                client.request("follow", {"head_job": job}, timeout=REQUEST_TIMEOUT)
            return True
        except ControlError:
            return False  # the agent reads the pointer on its own within a second

    def run() -> None:
        if not targets:
            return
        t0 = time.monotonic()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(parallel, len(targets))),
                                                     thread_name_prefix="nudge")
        futures = [pool.submit(one, e) for e in targets]
        done, pending = concurrent.futures.wait(futures, timeout=deadline)
        pool.shutdown(wait=False, cancel_futures=True)
        sent = sum(1 for f in done if not f.cancelled() and f.exception() is None and f.result())
        log.info("event=agents_nudged head_job=%s sent=%d of=%d dropped=%d seconds=%.2f", job, sent, len(targets),
                 len(pending), time.monotonic() - t0)

    thread = threading.Thread(target=run, name=f"nudge-{job}", daemon=True)
    thread.start()
    return thread
