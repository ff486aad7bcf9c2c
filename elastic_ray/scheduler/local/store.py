"""The local scheduler's state directory: the one truth shared by many processes.

A run's supervisor, every payload step and every job supervisor open the
same directory, and any of them may crash at any moment, so nothing lives in
one process's memory:

```
<state_dir>/
  cluster.json        the emulated cluster, fixed on first use (all processes agree)
  next_job_id         the id counter (a bare integer)
  lock                the filelock every read-modify-write holds
  jobs/<id>.json      one record per job (see record.JobRecord)
  scheduler.log       one structured line per event
```

Every write is atomic (temp file, fsync, rename); every read-modify-write
holds the lock; readers treat a damaged record as "unknown" and never crash.
Plain reads take no lock: a rename is atomic, so a reader sees the old or the
new record, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal as _signal
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path

import filelock

from ...errors import CorruptFileError, SchedulerError
from ...atomic import atomic_write_json, read_json
from . import procs
from ..base import JobState
from .cluster import LocalCluster
from .record import Event, JobRecord, apply_event

LOCK_TIMEOUT = 30.0


class LocalStore:
    """Paths, lock, records and the event log of one state directory."""

    def __init__(self, state_dir: str | os.PathLike[str], cluster: LocalCluster | None = None):
        self.root = Path(state_dir).expanduser().resolve()
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self._lock = filelock.FileLock(str(self.root / "lock"), timeout=LOCK_TIMEOUT)
        self.cluster = self._load_cluster(cluster)

    # ------------------------------------------------------------ paths
    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    @property
    def cluster_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def log_file(self) -> Path:
        return self.root / "scheduler.log"

    def record_path(self, job_id: str) -> Path:
        return self.jobs_dir / f"{job_id}.json"

    # ------------------------------------------------------------ lock
    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """The state directory's lock; a SchedulerError if it stays busy for LOCK_TIMEOUT."""
        try:
            with self._lock:
                yield
        except filelock.Timeout:
            raise SchedulerError(f"local scheduler: {self.root / 'lock'} stayed locked for "
                                 f"{LOCK_TIMEOUT:.0f} s") from None

    # ------------------------------------------------------------ cluster
    def _load_cluster(self, wanted: LocalCluster | None) -> LocalCluster:
        """The stored cluster; stores ``wanted`` (or the default) on first use.

        A different ``wanted`` for an existing directory is refused: jobs
        already hold nodes of the stored description, and two processes that
        disagree on the nodes would hand out the same CPUs twice.
        """
        stored = self._read_cluster()
        if stored is None:
            with self.lock():
                stored = self._read_cluster()
                if stored is None:
                    stored = wanted or LocalCluster.default()
                    atomic_write_json(self.cluster_file, stored.to_dict(), mode=0o644)
        if wanted is not None and wanted != stored:
            raise SchedulerError(f"local scheduler: {self.cluster_file} describes another cluster; "
                                 "use a new state directory for a different cluster")
        return stored

    def _read_cluster(self) -> LocalCluster | None:
        try:
            return LocalCluster.from_dict(read_json(self.cluster_file))
        except FileNotFoundError:
            return None
        except (CorruptFileError, ValueError) as exc:
            raise SchedulerError(f"local scheduler: {self.cluster_file} is damaged ({exc}); "
                                 "the cluster cannot be guessed, use a new state directory") from None

    # ------------------------------------------------------------ ids
    def next_job_id(self) -> str:
        """A new job id; call with the lock held.

        A damaged counter is rebuilt from the highest record id, so ids stay
        unique (a reused id would hand a new job an old job's identity).
        """
        counter = self.root / "next_job_id"
        try:
            text = counter.read_text().strip()
            number = int(text) if text.isdigit() else None
        except FileNotFoundError:
            number = None
        known = [int(p.stem) for p in self.jobs_dir.glob("*.json") if p.stem.isdigit()]
        floor = max(known, default=0) + 1
        number = max(number or 1, floor)
        atomic_write_json(counter, number + 1, mode=0o644)
        return str(number)

    # ------------------------------------------------------------ records
    def read(self, job_id: str) -> JobRecord:
        """One record. FileNotFoundError if absent, CorruptFileError if damaged."""
        path = self.record_path(job_id)
        data = read_json(path)
        try:
            record = JobRecord.from_dict(data)
        except ValueError as exc:
            raise CorruptFileError(str(path), str(exc)) from None
        if record.job_id != job_id:
            raise CorruptFileError(str(path), f"holds job {record.job_id}, not {job_id}")
        return record

    def write(self, record: JobRecord) -> None:
        atomic_write_json(self.record_path(record.job_id), record.to_dict(), mode=0o644)

    def scan(self) -> tuple[dict[str, JobRecord], dict[str, str]]:
        """Every record, in one directory scan: (records by id, damage reason by id)."""
        records: dict[str, JobRecord] = {}
        damaged: dict[str, str] = {}
        try:
            entries = list(os.scandir(self.jobs_dir))
        except FileNotFoundError:
            return records, damaged
        for entry in entries:
            stem, dot, ext = entry.name.rpartition(".")
            if ext != "json" or not dot or not stem.isdigit():
                continue  # temp files of writes in flight, strays
            try:
                records[stem] = self.read(stem)
            except FileNotFoundError:
                continue
            except (CorruptFileError, OSError) as exc:
                damaged[stem] = str(exc)
        return dict(sorted(records.items(), key=lambda kv: int(kv[0]))), damaged

    def update(self, job_id: str, change: Callable[[JobRecord], JobRecord]) -> JobRecord:
        """Read, change and write one record under the lock; returns the new record.

        ``change`` gets the freshest record, so concurrent writers (a
        canceller, the supervisor, a reaper) never undo each other.
        """
        with self.lock():
            record = self.read(job_id)
            new = change(record)
            if new != record:
                self.write(new)
            return new

    # ------------------------------------------------------------ liveness
    def supervisor_alive(self, record: JobRecord, now: float) -> bool:
        """Does someone still look after this job?

        A record without a supervisor is being submitted; it gets
        ``startup_grace`` seconds before it counts as abandoned.
        """
        if record.supervisor is None:
            return now - record.submit_time < self.cluster.startup_grace
        return procs.is_alive(record.supervisor)

    def reap_lost(self, records: dict[str, JobRecord], now: float) -> dict[str, JobRecord]:
        """End the active jobs whose supervisor died; return the updated records.

        Their node processes are killed (verified by pid and start time) and
        their nodes freed by the state change, so a crashed supervisor never
        leaves a job RUNNING forever nor its CPUs held. Cheap when nothing
        died: the lock is taken only for a job that looks lost.
        """
        lost = [r for r in records.values() if r.state.is_active and not self.supervisor_alive(r, now)]
        if not lost:
            return records
        out = dict(records)
        freed = False
        with self.lock():
            for suspect in lost:
                try:
                    record = self.read(suspect.job_id)
                except (FileNotFoundError, CorruptFileError, OSError):
                    continue
                if record.state.is_final or self.supervisor_alive(record, time.time()):
                    out[record.job_id] = record
                    continue
                for proc in record.node_procs:
                    procs.send_group(proc, _signal.SIGKILL)
                why = ("supervisor never registered" if record.supervisor is None
                       else f"supervisor pid {record.supervisor.pid} died")
                new = apply_event(record, Event.SUPERVISOR_LOST, now, why)
                self.write(new)
                out[new.job_id] = new
                freed = freed or record.holds_resources
                self.log("job.lost", job=new.job_id, name=new.name, state=new.state.value,
                         node=",".join(new.nodes) or "-", reason=why)
        if freed:
            self.wake_pending(out)
        return out

    def wake_pending(self, records: dict[str, JobRecord]) -> None:
        """Tell pending jobs' supervisors that nodes were freed (SIGUSR2 = look again)."""
        for record in records.values():
            if record.state is JobState.PENDING and record.supervisor is not None:
                procs.send(record.supervisor, _signal.SIGUSR2)

    # ------------------------------------------------------------ log
    def log(self, event: str, **fields: object) -> None:
        """Append one structured line (logfmt) to scheduler.log; never raises.

        One ``write`` of one line with O_APPEND: lines from many processes
        interleave whole, not mixed.
        """
        stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        parts = [f"time={stamp}", f"event={event}", f"pid={os.getpid()}"]
        parts += [f"{key}={_logfmt(value)}" for key, value in fields.items()]
        line = (" ".join(parts) + "\n").encode("utf-8", "replace")
        try:
            fd = os.open(self.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        except OSError:
            pass


def _logfmt(value: object) -> str:
    text = str(value)
    if text == "" or any(ch in text for ch in ' "=\n\t\\'):
        return json.dumps(text)
    return text
