"""The session directory: the shared truth of one run.

Every process of a run (the supervisor, each payload step, every node's
agent) sees this directory on a shared filesystem. Layout::

    <session>/
      session.json              immutable after creation (SessionInfo)
      allocation.json           the mutable record (AllocationRecord), changed under a lock
      allocation.json.bak       a copy of the last good record, for repair after outside damage
      allocation.gen/<n>.json   the record of generation n, created once (the commit point)
      ray_head                  the current head's job id, a bare integer
      jobs/<job>/head.json      a ready head's endpoint (HeadEndpoint)
      jobs/<job>/nodes/<host>.json   each agent's published state (NodeState)
      secret                    the control channel key (0600)
      ray_token                 Ray's auth token, derived from the secret (0600; see ray_auth)
      logs/                     agent and job logs

Rules kept here so no caller can forget them: writes are atomic (see
``atomic``), ``allocation.json`` changes by compare-and-swap on its
generation (a file lock only spares writers the retries), every read is
validated, and a malformed file is reported as CorruptFileError, never
overwritten blindly (a damaged record is restored from a good copy only
when nothing newer is lost: :mod:`.recovery` decides, :mod:`.allocation_repair`
acts). The directory is 0700 and the secret 0600; a secret that others can
read is refused.

Why one module: the record's compare-and-swap, its readers and its repair
share one set of private invariants (the generation files, the mirror, the
backup, the lock); keeping them on one class keeps them out of every other
module's reach.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import ContextManager

import filelock

from ...errors import CorruptFileError, SessionDirError, UnsafePathError
from ...atomic import (
    _fsync_dir,
    _naming,
    atomic_write_bytes,
    atomic_write_json,
    read_bytes_bounded,
    read_record,
)
from ...ray_auth import TOKEN_FILE_NAME, derive_ray_token, ray_auth_env
from . import allocation_repair
from .recovery import RecoveryPlan
from .records import AllocationRecord, HeadEndpoint, NodeState, SessionInfo, check_job_id, is_job_id

log = logging.getLogger(__name__)

SECRET_BYTES = 32
DEFAULT_LOCK_TIMEOUT = 30.0
# Generation files kept in allocation.gen/ (see update_allocation). A reader
# whose copy of allocation.json lags by more than this many updates still
# finds the newest by listing the directory; the number only bounds clutter.
KEEP_GENERATIONS = 32
_GENERATION_NAME = re.compile(r"(0|[1-9][0-9]{0,18})\.json")


def _flock(path: Path, timeout: float) -> ContextManager[object]:
    """The fast path's lock: serialises writers that share working ``flock``.

    Correctness does not rest on it (see ``update_allocation``); a test swaps
    it for a lock that does not lock, as on Lustre ``localflock``.
    """
    return filelock.FileLock(str(path), timeout=timeout)


def _same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _no_hard_links(directory: Path, exc: OSError) -> SessionDirError:
    return SessionDirError(
        f"{directory}: the filesystem refused a hard link ({exc.strerror or exc}); a session directory needs "
        "a POSIX filesystem with hard links and atomic rename (local, NFS, Lustre, GPFS, BeeGFS, CephFS), "
        "not an object-store or SMB mount")


def check_filesystem(directory: Path) -> None:
    """Refuse a filesystem the session cannot commit on: one without hard
    links (allocation.json's compare-and-swap creates its generation files by
    link). Whether flock is cluster-wide cannot be told from one node, and
    need not be: the compare-and-swap does not depend on it."""
    fd, probe = tempfile.mkstemp(prefix=".fs-check.", dir=directory)
    os.close(fd)
    linked = probe + ".link"
    try:
        os.link(probe, linked)
        if not _same_file(probe, linked):
            raise SessionDirError(f"{directory}: a hard link did not name the same file; unsupported filesystem")
    except OSError as exc:
        raise _no_hard_links(directory, exc) from None
    finally:
        for name in (linked, probe):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)


class SessionDir:
    """Access to one session directory. Cheap to create; holds no open files."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).absolute()
        # The last reason automatic recovery was refused, and the last bad
        # pointer content, each logged once rather than at every read.
        self._last_refusal: str | None = None
        self._last_bad_pointer: str | None = None

    # ------------------------------------------------------------ paths
    @property
    def session_file(self) -> Path:
        return self.path / "session.json"

    @property
    def allocation_file(self) -> Path:
        return self.path / "allocation.json"

    @property
    def backup_file(self) -> Path:
        return self.path / "allocation.json.bak"

    @property
    def generation_dir(self) -> Path:
        return self.path / "allocation.gen"

    def generation_file(self, generation: int) -> Path:
        return self.generation_dir / f"{generation}.json"

    @property
    def lock_file(self) -> Path:
        return self.path / ".allocation.lock"

    @property
    def ray_head_file(self) -> Path:
        return self.path / "ray_head"

    @property
    def secret_file(self) -> Path:
        return self.path / "secret"

    @property
    def ray_token_file(self) -> Path:
        return self.path / TOKEN_FILE_NAME

    @property
    def log_dir(self) -> Path:
        return self.path / "logs"

    def job_dir(self, job_id: str) -> Path:
        return self.path / "jobs" / check_job_id(job_id)

    # ------------------------------------------------------------ create / open
    @classmethod
    def create(cls, path: str | os.PathLike[str], info: SessionInfo) -> "SessionDir":
        """Create a new session directory, new or empty.

        A directory that holds anything is refused: files left there (an old
        session's, or planted by someone) would be trusted as this session's.
        An existing empty directory must be ours, since we chmod it 0700 and
        keep the secret in it.
        """
        session = cls(path)
        try:
            session.path.mkdir(parents=True, mode=0o700)
        except FileExistsError:
            if not session.path.is_dir():
                raise SessionDirError(f"{session.path} exists and is not a directory") from None
            if session.session_file.exists():
                raise SessionDirError(f"{session.path} already holds a session; open it instead") from None
            entries = sorted(p.name for p in session.path.iterdir())
            if entries:
                shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
                raise SessionDirError(
                    f"{session.path} is not empty ({shown}); a new session needs a new or empty "
                    "directory") from None
            owner = session.path.stat().st_uid
            if owner != os.geteuid():
                raise UnsafePathError(str(session.path), f"is owned by uid {owner}, not by us (uid {os.geteuid()}); "
                                      "a session directory must be our own") from None
        os.chmod(session.path, 0o700)
        check_filesystem(session.path)
        # Validate what we are about to write by round-tripping it.
        SessionInfo.from_dict(info.to_dict())
        for sub in ("jobs", "logs"):
            (session.path / sub).mkdir(mode=0o700, exist_ok=True)
        atomic_write_bytes(session.secret_file, secrets.token_bytes(SECRET_BYTES), mode=0o600)
        session.ensure_ray_token()
        atomic_write_json(session.allocation_file, AllocationRecord().to_dict())
        # session.json last: its presence means "the session is complete".
        atomic_write_json(session.session_file, info.to_dict(), mode=0o600)
        return session

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "SessionDir":
        session = cls(path)
        if not session.session_file.exists():
            raise SessionDirError(f"{session.path} is not a session directory (no session.json)")
        session.info()  # validates
        return session

    def info(self) -> SessionInfo:
        """session.json, validated. CorruptFileError for any malformed content."""
        try:
            return read_record(self.session_file, SessionInfo.from_dict)
        except FileNotFoundError:
            raise SessionDirError(f"{self.session_file} is missing") from None

    def secret(self) -> bytes:
        """The control channel key. Refused when group or others could read it:
        a key that others may have read authenticates nobody."""
        path = self.secret_file
        data = read_bytes_bounded(path, 1024)
        mode = stat.S_IMODE(os.stat(path, follow_symlinks=False).st_mode)
        if mode & 0o077:
            raise UnsafePathError(str(path), f"has mode {mode:04o}, readable by group or others; "
                                  f"the key must be private: run chmod 600 {path}")
        if len(data) < 16:
            raise CorruptFileError(str(path), "too short to be a session key")
        return data

    def ensure_ray_token(self) -> Path:
        """The path of the Ray token file, (re)written (0600) unless it already
        holds the token derived from the secret.

        Every process that starts Ray or a driver calls this before pointing
        ``RAY_AUTH_TOKEN_PATH`` at the file, so a session created before the
        file existed, or one whose file was damaged, still works; all writers
        write the same bytes, atomically.
        """
        token = derive_ray_token(self.secret()).encode()
        try:
            current = read_bytes_bounded(self.ray_token_file, 1024)
        except (OSError, CorruptFileError):
            current = b""
        mode = None
        try:
            mode = os.stat(self.ray_token_file).st_mode & 0o777
        except OSError:
            pass
        if current != token or mode != 0o600:
            atomic_write_bytes(self.ray_token_file, token, mode=0o600)
        return self.ray_token_file

    def ray_auth_env(self, auth_mode: str) -> dict[str, str]:
        """The Ray auth variables of every process of this run (``ray_auth.ray_auth_env``),
        with the token file ensured in token mode."""
        return ray_auth_env(auth_mode, str(self.ensure_ray_token()) if auth_mode == "token" else None)

    # ------------------------------------------------------------ allocation.json
    #
    # Why not a lock alone: flock is node-local on some cluster filesystems
    # (Lustre mounted with localflock, BeeGFS without global locks, NFS
    # without a lock manager), so two nodes can both "hold" it and the later
    # rename silently drops the earlier update. Correctness rests instead on
    # one operation every POSIX filesystem makes atomic, also across nodes:
    # creating a name that must not exist yet. Each update is committed by
    # hard-linking its fully written record to allocation.gen/<n>.json, where
    # n is the generation it was computed from plus one; of two writers that
    # read the same generation exactly one link succeeds, the other re-reads
    # and computes its change again. allocation.json is then replaced by the
    # same record, a copy for people and older readers that may lag behind
    # the newest generation file for a moment (or for good, if the writer
    # died in between); readers therefore move forward to the newest
    # generation file. The flock stays as a fast path: where it works,
    # writers never collide and never retry.

    def _read_mirror(self) -> AllocationRecord:
        try:
            return read_record(self.allocation_file, AllocationRecord.from_dict)
        except FileNotFoundError:
            raise CorruptFileError(str(self.allocation_file), "missing") from None

    def _generations(self) -> list[int]:
        try:
            names = os.listdir(self.generation_dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for name in names if (m := _GENERATION_NAME.fullmatch(name)))

    def _read_generation(self, generation: int) -> AllocationRecord:
        path = self.generation_file(generation)
        record = read_record(path, AllocationRecord.from_dict)
        if record.generation != generation:
            raise CorruptFileError(str(path), f"holds generation {record.generation}, not {generation}")
        return record

    def read_allocation(self) -> AllocationRecord:
        """The current record.

        Starts from allocation.json and moves forward to the newest committed
        generation (listing allocation.gen/, then probing past the listing,
        which a client cache may show stale). A damaged record is put back
        from a good copy, under the file lock, when the directory shows that
        nothing newer is lost (:mod:`.recovery`); otherwise CorruptFileError
        says why not and names ``elastic-ray session repair``.
        """
        try:
            return self._read_newest()
        except CorruptFileError as exc:
            return self._recover(exc, locked=False)

    def _read_newest(self) -> AllocationRecord:
        for _ in range(10):
            record = self._read_mirror()
            newest = max([record.generation, *self._generations()])
            while self.generation_file(newest + 1).exists():
                newest += 1
            if newest == record.generation:
                return record
            try:
                return self._read_generation(newest)
            except FileNotFoundError:
                continue   # pruned by a writer meanwhile: look again
        raise SessionDirError(f"{self.allocation_file}: the record kept changing while read; try again")

    def _recover(self, error: CorruptFileError, *, locked: bool) -> AllocationRecord:
        if locked:
            return allocation_repair.recover_automatically(self, error)
        try:
            with _flock(self.lock_file, DEFAULT_LOCK_TIMEOUT):
                try:
                    return self._read_newest()   # repaired by another process while we waited
                except CorruptFileError as again:
                    return allocation_repair.recover_automatically(self, again)
        except filelock.Timeout:
            raise CorruptFileError(error.path, f"{error.reason}; could not lock {self.lock_file} to restore "
                                               "it from a good copy") from None

    def repair_plan(self) -> RecoveryPlan | None:
        """What ``restore_allocation_backup`` would put back and whether it
        would have happened on its own; None when the record reads well."""
        try:
            self._read_newest()
            return None
        except CorruptFileError as exc:
            return allocation_repair.plan(self, allocation_repair.damaged_file(exc.path, exc.reason))

    def update_allocation(
        self,
        change: Callable[[AllocationRecord], AllocationRecord],
        *,
        timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> AllocationRecord:
        """Read, change and write allocation.json by compare-and-swap on its generation.

        ``change`` must be a pure function of the record: when another writer
        commits first, it is called again on the newer record. Returning the
        same object writes nothing. A damaged record is not overwritten:
        it is restored first when that provably loses nothing (see
        ``read_allocation``), else CorruptFileError is raised and the damaged
        file is left in place for ``elastic-ray session repair`` or a human.
        """
        deadline = time.monotonic() + timeout
        try:
            with _flock(self.lock_file, timeout):
                attempt = 0
                while True:
                    attempt += 1
                    try:
                        current = self._read_newest()
                    except CorruptFileError as exc:
                        current = self._recover(exc, locked=True)
                    updated = change(current)
                    if updated is current:
                        return current
                    if not isinstance(updated, AllocationRecord):
                        raise TypeError("the change function must return an AllocationRecord")
                    updated = replace(updated, generation=current.generation + 1)
                    # Round-trip through the validator: never write what we could not read back.
                    AllocationRecord.from_dict(updated.to_dict())
                    if self._commit(updated):
                        return updated
                    if time.monotonic() > deadline:
                        raise SessionDirError(
                            f"could not update {self.allocation_file} within {timeout:.0f}s: other writers "
                            f"committed first {attempt} times")
                    time.sleep(random.uniform(0.001, 0.02) * min(attempt, 10))
        except filelock.Timeout:
            raise SessionDirError(
                f"could not lock {self.allocation_file} within {timeout:.0f}s; "
                f"another process holds {self.lock_file}") from None

    def _commit(self, record: AllocationRecord) -> bool:
        """Commit ``record`` as its generation; False if another writer did first."""
        text = json.dumps(record.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
        # A write that fails (a full filesystem) commits nothing; the error
        # names the record, whose current content stays as it was.
        try:
            self.generation_dir.mkdir(mode=0o700, exist_ok=True)
            # The temporary file lives next to its link: some filesystems (older
            # BeeGFS) make hard links only within one directory.
            fd, tmp_name = tempfile.mkstemp(prefix=".allocation.", suffix=".tmp", dir=self.generation_dir)
        except OSError as exc:
            raise _naming(exc, self.allocation_file) from exc
        try:
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(text.encode("utf-8"))
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as exc:
                raise _naming(exc, self.allocation_file) from exc
            finally:
                os.close(fd)
            target = self.generation_file(record.generation)
            try:
                os.link(tmp_name, target)
            except FileExistsError:
                # Over NFS a LINK retransmitted after a lost reply answers
                # "exists" for our own link: the inode tells.
                if not _same_file(tmp_name, target):
                    return False
            except OSError as exc:
                raise _no_hard_links(self.generation_dir, exc) from None
            _fsync_dir(self.generation_dir)
            # Committed. The copy may only lag, never go back: skip it when a
            # newer generation is already there (its writer puts its own).
            if not self.generation_file(record.generation + 1).exists():
                os.replace(tmp_name, self.allocation_file)
                _fsync_dir(self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
        # The backup mirrors the last good record; if we die between the
        # writes it lags, which repair can live with.
        # A failed backup write (a full filesystem) must not fail the update:
        # it is committed, and a caller that saw an error would apply it twice.
        try:
            atomic_write_json(self.backup_file, record.to_dict())
        except OSError as exc:
            log.warning("event=allocation_backup_failed path=%s generation=%s error=%s", self.backup_file,
                        record.generation, exc)
        self._prune_generations(record.generation)
        return True

    def _prune_generations(self, newest: int) -> None:
        for generation in self._generations():
            if generation <= newest - KEEP_GENERATIONS:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.generation_file(generation))

    def restore_allocation_backup(self) -> AllocationRecord:
        """Put the newest good copy back, whatever the evidence says (the
        command ``elastic-ray session repair --yes``; automatic recovery is
        in ``read_allocation``).

        The newest record that still reads well (a generation file,
        allocation.json.bak, or allocation.json itself when only a generation
        file is damaged) is committed again as a new generation, so writers
        continue from it. The damaged file is kept as
        ``allocation.json.corrupt-<time>``. A record that reads well is put
        back unchanged under a new generation.
        """
        with _flock(self.lock_file, DEFAULT_LOCK_TIMEOUT):
            try:
                self._read_newest()
                damaged = None
            except CorruptFileError as exc:
                damaged = allocation_repair.damaged_file(exc.path, exc.reason)
            recovery = allocation_repair.plan(
                self, damaged or allocation_repair.damaged_file("", "no damage found"))
            restored, aside = allocation_repair.restore(self, recovery)
            log.warning("event=allocation_restored path=%s source=%s generation=%s kept_as=%s refusals=%r",
                        recovery.damaged.path, recovery.source.source if recovery.source else None,
                        restored.generation, aside, recovery.refusals)
            return restored

    # ------------------------------------------------------------ ray_head pointer
    def read_ray_head(self) -> str | None:
        """The current head's job id, or None if absent or unreadable.

        Agents poll this; a damaged pointer must make them wait, not crash.
        Opening the file anew on each read also gets fresh content on NFS
        (close-to-open consistency), which a cached stat would not.
        """
        return self.ray_head_state()[0]

    def ray_head_state(self) -> tuple[str | None, bool]:
        """``(job, damaged)``: the job ``ray_head`` names (None if absent or
        unreadable), and whether the file is there but unreadable. A damaged
        pointer means "unknown" (keep the head you follow), an absent one
        "none yet". Each bad content is logged once, not at every poll."""
        try:
            text = read_bytes_bounded(self.ray_head_file, 64).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None, False
        except (OSError, CorruptFileError) as exc:
            self._pointer_warning(str(exc), "event=ray_head_unreadable path=%s reason=%s", exc)
            return None, True
        if not is_job_id(text):
            self._pointer_warning(text, "event=ray_head_invalid path=%s content=%r", text[:64])
            return None, True
        self._last_bad_pointer = None
        return text, False

    def _pointer_warning(self, key: str, fmt: str, detail: object) -> None:
        if self._last_bad_pointer != key:
            self._last_bad_pointer = key
            log.warning(fmt, self.ray_head_file, detail)

    def write_ray_head(self, job_id: str) -> None:
        atomic_write_bytes(self.ray_head_file, (check_job_id(job_id) + "\n").encode(), mode=0o644)

    # ------------------------------------------------------------ per-job files
    def write_head_endpoint(self, endpoint: HeadEndpoint) -> None:
        HeadEndpoint.from_dict(endpoint.to_dict())
        directory = self.job_dir(endpoint.job_id)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(directory / "head.json", endpoint.to_dict(), mode=0o644)

    def read_head_endpoint(self, job_id: str) -> HeadEndpoint | None:
        """The endpoint of a ready head, None if not (yet) published or damaged."""
        path = self.job_dir(job_id) / "head.json"
        try:
            return read_record(path, HeadEndpoint.from_dict)
        except FileNotFoundError:
            return None
        except (OSError, CorruptFileError) as exc:
            log.warning("event=head_endpoint_invalid path=%s reason=%s", path, exc)
            return None

    def write_node_state(self, state: NodeState, *, durable: bool = True) -> None:
        """Publish one agent's state as ``jobs/<job>/nodes/<node>.json`` (job and node from the record).

        ``durable=False`` skips the fsyncs: for a periodic refresh that only moves ``updated_at``."""
        host = state.node
        if not host or "/" in host or host.startswith("."):
            raise ValueError(f"node={host!r}: not a usable node name")
        # Never write what we could not read back.
        NodeState.from_dict(state.to_dict())
        directory = self.job_dir(state.job_id) / "nodes"
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(directory / f"{host}.json", state.to_dict(), mode=0o644, durable=durable)

    def read_node_states(self, job_id: str) -> dict[str, NodeState]:
        """Every published node state of a job, by node name.

        A damaged file, one that fails validation (a newer elastic-ray's
        included) or one that names another job or node is skipped with a
        warning: that node's state is unknown, and no reader crashes on it.
        """
        directory = self.job_dir(job_id) / "nodes"
        states: dict[str, NodeState] = {}
        try:
            entries = sorted(directory.glob("*.json"))
        except OSError:
            return states
        for path in entries:
            try:
                state = read_record(path, NodeState.from_dict)
                if state.job_id != job_id or state.node != path.stem:
                    raise CorruptFileError(str(path), f"holds job {state.job_id} node {state.node}")
            except (OSError, CorruptFileError) as exc:
                log.warning("event=node_state_invalid path=%s reason=%s", path, exc)
                continue
            states[path.stem] = state
        return states
