"""The session directory: the shared truth of one run.

Every process of a run (the supervisor, each payload step, every node's
agent) sees this directory on a shared filesystem. What each of its files
is called, holds, and who writes and reads it, is :mod:`.paths` (its
docstring shows the whole tree); this class reads and writes the records.

Rules kept here so no caller can forget them: writes are atomic (see
``atomic``), ``allocation.json`` changes by compare-and-swap on its
generation (:mod:`.generations`; a file lock only spares writers the
retries), every read is validated, and a malformed file is reported as
CorruptFileError, never overwritten blindly (a damaged record is restored
from a good copy only when nothing newer is lost: :mod:`.recovery` decides,
:mod:`.allocation_repair` acts). The directory is 0700 and the secret 0600;
a secret that others can read is refused.

The generation files (the commit, the newest record, pruning) are
:mod:`.generations`, which both this class and :mod:`.allocation_repair`
use through its public API; the retry loop of the compare-and-swap, the
lock and the way into repair stay here.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import stat
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import ContextManager

import filelock

from ...errors import CorruptFileError, SessionDirError, UnsafePathError
from ...atomic import atomic_write_bytes, atomic_write_json, read_bytes_bounded, read_record
from ...ray_auth import derive_ray_token, ray_auth_env
from . import allocation_repair, event_log, paths
from .events import EventKind, EventSource
from .generations import GenerationFiles, check_filesystem
from .recovery import RecoveryPlan
from .records import AllocationRecord, HeadEndpoint, NodeState, SessionInfo, check_job_id, is_job_id

log = logging.getLogger(__name__)

SECRET_BYTES = 32
DEFAULT_LOCK_TIMEOUT = 30.0


def _flock(path: Path, timeout: float) -> ContextManager[object]:
    """The fast path's lock: serialises writers that share working ``flock``.

    Correctness does not rest on it (see ``update_allocation``); a test swaps
    it for a lock that does not lock, as on Lustre ``localflock``.
    """
    return filelock.FileLock(str(path), timeout=timeout)


class SessionDir:
    """Access to one session directory. Cheap to create; holds no open files."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).absolute()
        #: The record's generation files, its copy and its backup (:mod:`.generations`).
        self.generations = GenerationFiles(self.path)
        #: The last reason automatic recovery was refused, logged once rather than at every read.
        self.recovery_refusal = allocation_repair.RefusalMemory()
        # The last bad pointer content, logged once too.
        self._last_bad_pointer: str | None = None

    # ------------------------------------------------------------ paths
    # (the names are :mod:`.paths`'s; these are the ones callers ask a SessionDir for)
    @property
    def session_file(self) -> Path:
        return paths.session_file(self.path)

    @property
    def allocation_file(self) -> Path:
        return paths.allocation_file(self.path)

    @property
    def backup_file(self) -> Path:
        return paths.backup_file(self.path)

    @property
    def generation_dir(self) -> Path:
        return paths.generation_dir(self.path)

    def generation_file(self, generation: int) -> Path:
        return paths.generation_file(self.path, generation)

    @property
    def lock_file(self) -> Path:
        return paths.allocation_lock_file(self.path)

    @property
    def ray_head_file(self) -> Path:
        return paths.ray_head_file(self.path)

    @property
    def secret_file(self) -> Path:
        return paths.secret_file(self.path)

    @property
    def ray_token_file(self) -> Path:
        return paths.ray_token_file(self.path)

    @property
    def log_dir(self) -> Path:
        return paths.log_dir(self.path)

    def job_dir(self, job_id: str) -> Path:
        return paths.job_dir(self.path, job_id)

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
        for sub in paths.CREATED_DIRS:
            (session.path / sub).mkdir(mode=0o700, exist_ok=True)
        atomic_write_bytes(session.secret_file, secrets.token_bytes(SECRET_BYTES), mode=0o600)
        session.ensure_ray_token()
        atomic_write_json(session.allocation_file, AllocationRecord().to_dict())
        # session.json last: its presence means "the session is complete".
        atomic_write_json(session.session_file, info.to_dict(), mode=0o600)
        event_log.emit(session.path, EventKind.SESSION_CREATED, EventSource.COORDINATOR, at=info.created_at,
                       session_id=info.session_id, name=info.job_name, scheduler=str(info.scheduler.get("kind")),
                       layout="separate head" if info.ray_head_only else "head on the first allocation")
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
    # The compare-and-swap and why it is not a lock alone: :mod:`.generations`.

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
            return self.generations.read_newest()
        except CorruptFileError as exc:
            return self._recover(exc, locked=False)

    def _recover(self, error: CorruptFileError, *, locked: bool) -> AllocationRecord:
        if locked:
            return allocation_repair.recover_automatically(self, error)
        try:
            with _flock(self.lock_file, DEFAULT_LOCK_TIMEOUT):
                try:
                    return self.generations.read_newest()   # repaired by another process while we waited
                except CorruptFileError as again:
                    return allocation_repair.recover_automatically(self, again)
        except filelock.Timeout:
            raise CorruptFileError(error.path, f"{error.reason}; could not lock {self.lock_file} to restore "
                                               "it from a good copy") from None

    def repair_plan(self) -> RecoveryPlan | None:
        """What ``restore_allocation_backup`` would put back and whether it
        would have happened on its own; None when the record reads well."""
        try:
            self.generations.read_newest()
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
                        current = self.generations.read_newest()
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
                    if self.generations.commit(updated):
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
                self.generations.read_newest()
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
        path = paths.head_endpoint_file(self.path, endpoint.job_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(path, endpoint.to_dict(), mode=0o644)

    def read_head_endpoint(self, job_id: str) -> HeadEndpoint | None:
        """The endpoint of a ready head, None if not (yet) published or damaged."""
        path = paths.head_endpoint_file(self.path, job_id)
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
        paths.check_node_name(state.node)
        # Never write what we could not read back.
        NodeState.from_dict(state.to_dict())
        path = paths.node_state_file(self.path, state.job_id, state.node)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(path, state.to_dict(), mode=0o644, durable=durable)

    def read_node_states(self, job_id: str) -> dict[str, NodeState]:
        """Every published node state of a job, by node name.

        A damaged file, one that fails validation (a newer elastic-ray's
        included) or one that names another job or node is skipped with a
        warning: that node's state is unknown, and no reader crashes on it.
        """
        directory = paths.nodes_dir(self.path, job_id)
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
