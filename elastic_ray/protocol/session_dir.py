"""The session directory: the shared truth of one run.

Every process of a run (the supervisor, each payload step, every node's
agent) sees this directory on a shared filesystem. Layout::

    <session>/
      session.json              immutable after creation (SessionInfo)
      allocation.json           the mutable record (AllocationRecord), changed under a lock
      allocation.json.bak       a copy of the last good record, for repair after outside damage
      ray_head                  the current head's job id, a bare integer
      jobs/<job>/head.json      a ready head's endpoint (HeadEndpoint)
      jobs/<job>/nodes/<host>.json   each agent's published state (NodeState)
      secret                    the control channel key (0600)
      ray_token                 Ray's auth token, derived from the secret (0600; see ray_auth)
      logs/                     agent and job logs

Rules kept here so no caller can forget them: writes are atomic (see
``atomic``), ``allocation.json`` changes only under a file lock with a
timeout, every read is validated, and a malformed file is reported, never
overwritten blindly. The directory is 0700 because it holds the secret.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import filelock

from ..errors import CorruptFileError, SessionDirError
from ..atomic import atomic_write_bytes, atomic_write_json, read_bytes_bounded, read_json
from ..ray_auth import TOKEN_FILE_NAME, derive_ray_token, ray_auth_env
from .records import AllocationRecord, HeadEndpoint, NodeState, SessionInfo, check_job_id, is_job_id

log = logging.getLogger(__name__)

SECRET_BYTES = 32
DEFAULT_LOCK_TIMEOUT = 30.0


class SessionDir:
    """Access to one session directory. Cheap to create; holds no open files."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path).absolute()

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
        """Create a new session directory. Refuses to reuse one that holds a session."""
        session = cls(path)
        session.path.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(session.path, 0o700)
        if session.session_file.exists():
            raise SessionDirError(f"{session.path} already holds a session; open it instead")
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
        try:
            return SessionInfo.from_dict(read_json(self.session_file))
        except FileNotFoundError:
            raise SessionDirError(f"{self.session_file} is missing") from None
        except ValueError as exc:
            raise CorruptFileError(str(self.session_file), str(exc)) from None

    def secret(self) -> bytes:
        data = read_bytes_bounded(self.secret_file, 1024)
        if len(data) < 16:
            raise CorruptFileError(str(self.secret_file), "too short to be a session key")
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
    def read_allocation(self) -> AllocationRecord:
        """The current record. Raises CorruptFileError if it is damaged."""
        try:
            raw = read_json(self.allocation_file)
        except FileNotFoundError:
            raise CorruptFileError(str(self.allocation_file), "missing") from None
        try:
            return AllocationRecord.from_dict(raw)
        except ValueError as exc:
            raise CorruptFileError(str(self.allocation_file), str(exc)) from None

    def update_allocation(
        self,
        change: Callable[[AllocationRecord], AllocationRecord],
        *,
        timeout: float = DEFAULT_LOCK_TIMEOUT,
    ) -> AllocationRecord:
        """Read, change and write allocation.json under the lock.

        ``change`` must be a pure function of the record (it may be called
        only once, but must not have side effects that matter if the write
        fails). Returning the same object writes nothing. A damaged record is
        not overwritten: CorruptFileError is raised and the damaged file is
        left in place for ``restore_allocation_backup`` or a human.
        """
        lock = filelock.FileLock(str(self.lock_file), timeout=timeout)
        try:
            with lock:
                current = self.read_allocation()
                updated = change(current)
                if updated is current:
                    return current
                if not isinstance(updated, AllocationRecord):
                    raise TypeError("the change function must return an AllocationRecord")
                updated = replace(updated, generation=current.generation + 1)
                # Round-trip through the validator: never write what we could not read back.
                AllocationRecord.from_dict(updated.to_dict())
                atomic_write_json(self.allocation_file, updated.to_dict())
                # The backup mirrors the last good record; if we die between the
                # two writes it lags by one update, which repair can live with.
                atomic_write_json(self.backup_file, updated.to_dict())
                return updated
        except filelock.Timeout:
            raise SessionDirError(
                f"could not lock {self.allocation_file} within {timeout:.0f}s; "
                f"another process holds {self.lock_file}") from None

    def restore_allocation_backup(self) -> AllocationRecord:
        """Put the last good record back after allocation.json was damaged.

        The damaged file is kept next to it as ``allocation.json.corrupt-<time>``.
        """
        lock = filelock.FileLock(str(self.lock_file), timeout=DEFAULT_LOCK_TIMEOUT)
        with lock:
            try:
                backup = AllocationRecord.from_dict(read_json(self.backup_file))
            except (FileNotFoundError, ValueError) as exc:
                raise CorruptFileError(str(self.backup_file), f"no usable backup ({exc})") from None
            if self.allocation_file.exists():
                aside = self.path / f"allocation.json.corrupt-{int(time.time())}"
                os.replace(self.allocation_file, aside)
                log.warning("event=allocation_restored damaged=%s", aside)
            atomic_write_json(self.allocation_file, backup.to_dict())
            return backup

    # ------------------------------------------------------------ ray_head pointer
    def read_ray_head(self) -> str | None:
        """The current head's job id, or None if absent or unreadable.

        Agents poll this; a damaged pointer must make them wait, not crash.
        Opening the file anew on each read also gets fresh content on NFS
        (close-to-open consistency), which a cached stat would not.
        """
        try:
            text = read_bytes_bounded(self.ray_head_file, 64).decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None
        except (OSError, CorruptFileError) as exc:
            log.warning("event=ray_head_unreadable path=%s reason=%s", self.ray_head_file, exc)
            return None
        if not is_job_id(text):
            log.warning("event=ray_head_invalid path=%s content=%r", self.ray_head_file, text[:64])
            return None
        return text

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
            return HeadEndpoint.from_dict(read_json(path))
        except FileNotFoundError:
            return None
        except (ValueError, CorruptFileError) as exc:
            log.warning("event=head_endpoint_invalid path=%s reason=%s", path, exc)
            return None

    def write_node_state(self, state: NodeState) -> None:
        """Publish one agent's state as ``jobs/<job>/nodes/<node>.json`` (job and node from the record)."""
        host = state.node
        if not host or "/" in host or host.startswith("."):
            raise ValueError(f"node={host!r}: not a usable node name")
        # Never write what we could not read back.
        NodeState.from_dict(state.to_dict())
        directory = self.job_dir(state.job_id) / "nodes"
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_json(directory / f"{host}.json", state.to_dict(), mode=0o644)

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
                state = NodeState.from_dict(read_json(path))
                if state.job_id != job_id or state.node != path.stem:
                    raise ValueError(f"holds job {state.job_id} node {state.node}")
            except (OSError, CorruptFileError, ValueError) as exc:
                log.warning("event=node_state_invalid path=%s reason=%s", path, exc)
                continue
            states[path.stem] = state
        return states
