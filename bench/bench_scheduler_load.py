"""How many scheduler queries a session costs per hour (issue 11, slurmctld load).

Prints figures; asserts nothing. Run it (real Ray and agents on the local
scheduler; serialize it with the other heavy work on a small machine) as

    flock /tmp/elastic-heavy.lock .venv/bin/python bench/bench_scheduler_load.py [--seconds 60]

It counts the calls of the scheduler object's ``query`` (every squeue a
session would send to slurmctld) while three things go on, each for
``--seconds``:

* idle: one supervised session, a head and a pending worker allocation;
* busy: the same, plus 10 callers waiting for a worker allocation that
  stays PENDING (it asks for two whole nodes of a partition whose first node
  hosts the head) and 4 payload drivers (``sleep``), each with its own
  Session object as a separate process would have;
* status: ``elastic-ray session status`` started every second (its
  ``collect_status``, each from a fresh Session, in its own thread as from
  many shells), on top of the idle session;
* failover: 4 electors each waiting for a successor head allocation that
  stays PENDING (``Failover.wait_head_ready`` on the pending allocation,
  each with its own Session), on top of the idle session.

It also removes one idle single-node worker allocation with
``remove_worker_allocation(wait=True)`` per mode and prints how many
queries that took and how long.

Each is measured "before" (``ELASTIC_RAY_SHARED_ANSWERS=0``: every watcher
asks the scheduler itself, at the old pace) and "after" (the shared answer
and the paced waits). The local scheduler stands in for Slurm: this counts
queries, it is not a timing benchmark.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elastic_ray.cli.session import collect_status  # noqa: E402
from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig  # noqa: E402
from elastic_ray.config.launcher import RayLauncher  # noqa: E402
from elastic_ray.coordinator.allocations import answers  # noqa: E402
from elastic_ray.coordinator.head.failover import Failover  # noqa: E402
from elastic_ray.coordinator.allocations.pacing import STATUS_MAX_AGE, watch_max_age  # noqa: E402
from elastic_ray.coordinator.session import Session  # noqa: E402
from elastic_ray.polling import wait_for  # noqa: E402
from elastic_ray.scheduler.local.scheduler import LocalScheduler  # noqa: E402

WAITERS = 10
DRIVERS = 4
ELECTORS = 4
WARMUP = 3.0


class Counter:
    """Wraps a scheduler's ``query`` and counts its calls (from every thread)."""

    def __init__(self, scheduler: LocalScheduler):
        self._query = scheduler.query
        self._lock = threading.Lock()
        self.calls = 0
        scheduler.query = self  # type: ignore[method-assign]

    def __call__(self, *args, **kwargs):
        with self._lock:
            self.calls += 1
        return self._query(*args, **kwargs)

    def reset(self) -> None:
        with self._lock:
            self.calls = 0


def measure(counter: Counter, seconds: float) -> float:
    time.sleep(WARMUP)
    counter.reset()
    time.sleep(seconds)
    return counter.calls * 3600.0 / seconds


def idle(session: Session, counter: Counter, seconds: float) -> float:
    return measure(counter, seconds)


def busy(session: Session, sched: LocalScheduler, pending: str, counter: Counter, seconds: float) -> float:
    lasting = WARMUP + seconds + 1.0
    threads: list[threading.Thread] = []
    opened: list[Session] = []

    def waiter() -> None:
        s = Session.open(session.path, sched, supervise=False)
        opened.append(s)
        try:
            s.wait_for_worker_allocation(pending, timeout=lasting)
        except TimeoutError:
            pass

    def driver() -> None:
        s = Session.open(session.path, sched, supervise=False)
        opened.append(s)
        head = s.replace_head(timeout=60)
        run = s.run(["sleep", str(int(lasting) + 30)], head=head)
        try:
            run.wait(timeout=lasting)
        except TimeoutError:
            pass

    for target, n in ((driver, DRIVERS), (waiter, WAITERS)):
        for _ in range(n):
            threads.append(threading.Thread(target=target, daemon=True))
            threads[-1].start()
    time.sleep(2.0)   # the drivers' replace_head and launch are not part of the steady state
    return _measure_then_end(counter, seconds, threads, lasting, opened)


def _measure_then_end(counter: Counter, seconds: float, threads: list[threading.Thread], lasting: float,
                      opened: list[Session]) -> float:
    """Measure the rate while ``threads`` run, then let them end and close their sessions."""
    rate = measure(counter, seconds)
    for t in threads:
        t.join(lasting + 30)
    for s in opened:
        s.close()
    return rate


def status_every_second(session: Session, sched: LocalScheduler, counter: Counter, seconds: float) -> float:
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def one() -> None:
        s = Session.open(session.path, sched, supervise=False)
        try:
            collect_status(s, max_age=watch_max_age(STATUS_MAX_AGE))
        finally:
            s.close()

    def starter() -> None:
        while not stop.is_set():
            threads.append(threading.Thread(target=one, daemon=True))
            threads[-1].start()
            stop.wait(1.0)

    feeder = threading.Thread(target=starter, daemon=True)
    feeder.start()
    rate = measure(counter, seconds)
    stop.set()
    feeder.join()
    for t in threads:
        t.join(30)
    return rate


def failover_waits(session: Session, sched: LocalScheduler, pending: str, counter: Counter,
                   seconds: float) -> float:
    lasting = WARMUP + seconds + 1.0
    opened: list[Session] = []

    def elector() -> None:
        s = Session.open(session.path, sched, supervise=False)
        opened.append(s)
        failover = Failover(s)
        failover.keep_claim = lambda: None   # type: ignore[method-assign]  # no claim is held here
        failover.wait_head_ready(pending, time.monotonic() + lasting)

    threads = [threading.Thread(target=elector, daemon=True) for _ in range(ELECTORS)]
    for t in threads:
        t.start()
    return _measure_then_end(counter, seconds, threads, lasting, opened)


def removal(session: Session, counter: Counter) -> tuple[int, float, str]:
    """Queries and seconds of one ``remove_worker_allocation(wait=True)`` of an idle worker."""
    handle = session.add_worker_allocation(SlurmWorkerAllocationConfig(
        partition="gpu-a", num_nodes=1, cpus_per_task=1, mem="512M", time_limit="60"))
    session.wait_for_worker_allocation(handle, timeout=180)
    counter.reset()
    started = time.monotonic()
    final = session.remove_worker_allocation(handle, drain_timeout=60)
    return counter.calls, time.monotonic() - started, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long each scenario is measured")
    args = parser.parse_args()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # (agents may still write their last state while the directory goes)
    with tempfile.TemporaryDirectory(prefix="er-bench-load-", ignore_cleanup_errors=True) as tmp:
        sched = LocalScheduler(Path(tmp) / "local-scheduler")
        counter = Counter(sched)
        session = Session.create(Path(tmp) / "session", head=SlurmRunAllocationConfig(
            partition="cpu", time_limit="60", mem="2G"), scheduler=sched,
            launcher=RayLauncher(object_store_memory=100_000_000), supervise=True, supervise_interval=30.0)
        try:
            session.wait_for_head(timeout=180)
            # Two whole nodes of "cpu", whose first node hosts the head: it stays PENDING.
            pending = session.add_worker_allocation(SlurmWorkerAllocationConfig(
                partition="cpu", num_nodes=2, cpus_per_task=4, mem="1G", time_limit="60")).job_id
            rows, removals = [], []
            for label, sharing in (("before (every watcher asks)", "0"), ("after (shared answer)", "1")):
                os.environ[answers.ENV_SWITCH] = sharing
                rows.append((label, idle(session, counter, args.seconds),
                             busy(session, sched, pending, counter, args.seconds),
                             status_every_second(session, sched, counter, args.seconds),
                             failover_waits(session, sched, pending, counter, args.seconds)))
                removals.append((label, *removal(session, counter)))
        finally:
            os.environ.pop(answers.ENV_SWITCH, None)
            session.teardown()
            # The directory goes when this block ends: an agent still stopping
            # its Ray then loses the files it reads, and a head's `ray start`
            # (a session of its own) was left running that way twice. Wait
            # until the local scheduler has seen every job end.
            wait_for(lambda: all(i.state.is_final for i in session.query().values()), timeout=120,
                     interval=0.5, what="every job of the bench's session ended after teardown")
    print(f"scheduler queries per hour (each scenario measured {args.seconds:g} s; the local scheduler "
          f"stands in for Slurm: this counts calls, it is not a timing benchmark)")
    print(f"{'':30} {'idle session':>14} {f'{WAITERS} waits + {DRIVERS} drivers':>22} {'status every 1 s':>18} "
          f"{f'{ELECTORS} successor waits':>20}")
    for label, a, b, c, d in rows:
        print(f"{label:30} {a:14.0f} {b:22.0f} {c:18.0f} {d:20.0f}")
    print("\nremove_worker_allocation(wait=True) of an idle single-node worker allocation")
    print(f"{'':30} {'queries':>8} {'seconds':>8} {'final':>10}")
    for label, calls, took, final in removals:
        print(f"{label:30} {calls:8d} {took:8.1f} {final:>10}")


if __name__ == "__main__":
    main()
