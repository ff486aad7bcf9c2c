"""Per-user private directories on a node: status files and Ray's temp dirs.

A compute node's /tmp is shared by every user with a job there. A directory
we keep files in must therefore be ours alone: one another user created
first (with a name we predict) could hold a planted symlink or FIFO, or let
them read Ray's sockets and spilled objects; a shared parent (the old
``/tmp/er``) belonged to whoever came first and locked every other user out.
So each user gets ``<tmp>/elastic-agent-<uid>`` and ``<tmp>/er-<uid>``, mode
0700, and we check on every use that the directory is a real directory,
owned by us and closed to group and others.

Stale temp dirs (an agent killed before it cleaned up, an ended run) are
removed by the next agent that starts on the node: see
:func:`stale_temp_dirs` for the rule.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from ...errors import UnsafePathError

# /tmp, not $TMPDIR: Ray puts Unix sockets under its temp dir, and a socket
# path is limited to 107 bytes; Slurm's per-job TMPDIR is often too long.
NODE_TMP = "/tmp"
# The directory of Ray temp dirs an older elastic-ray shared between users.
LEGACY_TEMP_ROOT = "/tmp/er"
# A temp dir younger than this is never swept: its agent may have made it and
# not yet started the Ray that names it on its command line.
SWEEP_MIN_AGE = 120.0


def ensure_private_dir(path: str | os.PathLike[str], *, create: bool = True) -> Path:
    """Make sure ``path`` is a directory that only we can use, and return it.

    Created with mode 0700 when absent (``create``). Refused with
    UnsafePathError when it is a symlink or not a directory, when another
    user owns it, or when group or others may write into it (anything in it
    may then be planted). A directory of ours that group or others may only
    read, as older elastic-ray versions made it, is closed to them (chmod
    700): nothing in it can be foreign, and refusing it would stop every
    agent on a node that ran an older version.
    """
    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            pass
    info = os.lstat(path)
    me = os.geteuid()
    if stat.S_ISLNK(info.st_mode):
        raise UnsafePathError(str(path), "is a symbolic link, not a directory; remove it")
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePathError(str(path), f"is not a directory ({stat.filemode(info.st_mode)}); remove it")
    if info.st_uid != me:
        raise UnsafePathError(str(path), f"is owned by uid {info.st_uid}, not by us (uid {me}); it must be "
                                         "our own: ask its owner or an admin to remove it")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        raise UnsafePathError(str(path), f"has mode {mode:04o}: group or others may write into it, so its "
                                         f"content cannot be trusted; remove it (rm -rf {path})")
    if mode & 0o077:
        os.chmod(path, 0o700)
    return path


def user_temp_root() -> Path:
    """This user's root of Ray temp dirs on this node."""
    return Path(NODE_TMP) / f"er-{os.geteuid()}"


def user_runtime_dir() -> Path:
    """This user's directory of agent status files on this node."""
    return Path(NODE_TMP) / f"elastic-agent-{os.geteuid()}"


@dataclass(frozen=True)
class TempDirEntry:
    """One candidate for the sweep: a Ray temp dir or a session's folder of them."""
    path: str
    mtime: float
    owner: int
    is_session: bool  # a session's folder (removed when empty) rather than one node's temp dir


def stale_temp_dirs(entries: Iterable[TempDirEntry], in_use: Iterable[str], now: float, uid: int,
                    min_age: float = SWEEP_MIN_AGE) -> list[str]:
    """Pure: the temp dirs to remove.

    A node's temp dir goes when it is ours, older than ``min_age`` and named
    by no live process's command line (Ray's processes carry their temp dir
    in theirs for as long as they run). A session's folder goes when it is
    ours, older than ``min_age`` and every entry in it goes too (it is then
    empty). Substring matching errs on the side of keeping: a dir whose name
    is a prefix of a live one's stays until the next sweep.
    """
    texts = list(in_use)
    entries = list(entries)
    doomed: list[str] = []
    for entry in entries:
        if entry.is_session or entry.owner != uid or now - entry.mtime < min_age:
            continue
        if not any(entry.path in text for text in texts):
            doomed.append(entry.path)
    gone = set(doomed)
    for entry in entries:
        if not entry.is_session or entry.owner != uid or now - entry.mtime < min_age:
            continue
        inside = [e for e in entries if not e.is_session and os.path.dirname(e.path) == entry.path]
        if all(e.path in gone for e in inside):
            doomed.append(entry.path)
    return doomed


def scan_temp_root(root: str | os.PathLike[str]) -> list[TempDirEntry]:
    """Everything under ``root/<session>/<node dir>`` (lstat: a symlink is an
    entry like any other and is removed, never followed)."""
    entries: list[TempDirEntry] = []
    try:
        sessions = list(os.scandir(root))
    except OSError:
        return entries
    for session in sessions:
        try:
            info = session.stat(follow_symlinks=False)
        except OSError:
            continue
        entries.append(TempDirEntry(session.path, info.st_mtime, info.st_uid, is_session=True))
        if not stat.S_ISDIR(info.st_mode):
            continue
        try:
            children = list(os.scandir(session.path))
        except OSError:
            continue
        for child in children:
            try:
                cinfo = child.stat(follow_symlinks=False)
            except OSError:
                continue
            entries.append(TempDirEntry(child.path, cinfo.st_mtime, cinfo.st_uid, is_session=False))
    return entries


def live_command_lines() -> list[str]:
    texts = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            texts.append(" ".join(proc.info["cmdline"] or ()))
        except (psutil.Error, TypeError):
            continue
    return texts


def remove_path(path: str) -> None:
    """Remove a file, symlink or directory tree without following links."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
            try:
                os.rmdir(path)
            except OSError:
                pass
        else:
            os.unlink(path)
    except OSError:
        pass


def sweep_temp_roots(roots: Iterable[str | os.PathLike[str]], now: float | None = None,
                     min_age: float = SWEEP_MIN_AGE) -> list[str]:
    """Remove this user's stale Ray temp dirs under each of ``roots``; returns what went."""
    now = time.time() if now is None else now
    entries = [e for root in roots for e in scan_temp_root(root)]
    if not entries:
        return []
    doomed = stale_temp_dirs(entries, live_command_lines(), now, os.geteuid(), min_age)
    for path in doomed:
        remove_path(path)
    return doomed
