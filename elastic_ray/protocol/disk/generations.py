"""The generation files of allocation.json: how an update commits, and how a reader finds the newest.

Why not a lock alone: flock is node-local on some cluster filesystems
(Lustre mounted with localflock, BeeGFS without global locks, NFS without a
lock manager), so two nodes can both "hold" it and the later rename
silently drops the earlier update. Correctness rests instead on one
operation every POSIX filesystem makes atomic, also across nodes: creating
a name that must not exist yet. Each update is committed by hard-linking
its fully written record to ``allocation.gen/<n>.json``, where n is the
generation it was computed from plus one; of two writers that read the same
generation exactly one link succeeds, the other re-reads and computes its
change again. allocation.json is then replaced by the same record, a copy
for people and older readers that may lag behind the newest generation file
for a moment (or for good, if the writer died in between); readers
therefore move forward to the newest generation file. The flock stays as a
fast path (``SessionDir.update_allocation`` holds it): where it works,
writers never collide and never retry.

Used by ``SessionDir`` (its reads and its compare-and-swap) and by
:mod:`.allocation_repair` (a restore commits its record again, numbered past
every generation ever committed); the names come from :mod:`.paths`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

from ...atomic import atomic_write_json, fsync_dir, naming_error, read_record
from ...errors import CorruptFileError, SessionDirError
from . import paths
from .records import AllocationRecord

# The events of the commit are the session directory's (one logger for the record's story).
log = logging.getLogger("elastic_ray.protocol.disk.session_dir")

# Generation files kept in allocation.gen/. A reader whose copy of
# allocation.json lags by more than this many updates still finds the newest
# by listing the directory; the number only bounds clutter.
KEEP_GENERATIONS = 32


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def no_hard_links(directory: Path, exc: OSError) -> SessionDirError:
    return SessionDirError(
        f"{directory}: the filesystem refused a hard link ({exc.strerror or exc}); a session directory needs "
        "a POSIX filesystem with hard links and atomic rename (local, NFS, Lustre, GPFS, BeeGFS, CephFS), "
        "not an object-store or SMB mount")


def check_filesystem(directory: Path) -> None:
    """Refuse a filesystem the session cannot commit on: one without hard
    links (allocation.json's compare-and-swap creates its generation files by
    link). Whether flock is cluster-wide cannot be told from one node, and
    need not be: the compare-and-swap does not depend on it."""
    fd, probe = tempfile.mkstemp(prefix=paths.FS_CHECK_PREFIX, dir=directory)
    os.close(fd)
    linked = probe + paths.FS_CHECK_LINK_SUFFIX
    try:
        os.link(probe, linked)
        if not same_file(probe, linked):
            raise SessionDirError(f"{directory}: a hard link did not name the same file; unsupported filesystem")
    except OSError as exc:
        raise no_hard_links(directory, exc) from None
    finally:
        for name in (linked, probe):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)


class GenerationFiles:
    """The committed generations of one session directory's record, its
    copy (allocation.json) and its backup. Holds no open files."""

    def __init__(self, session: Path):
        self.session = session
        self.directory = paths.generation_dir(session)
        self.mirror = paths.allocation_file(session)
        self.backup = paths.backup_file(session)

    def path(self, generation: int) -> Path:
        return paths.generation_file(self.session, generation)

    def listed(self) -> list[int]:
        """The generations named in allocation.gen/, oldest first (their names say
        they were committed, whatever their content)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(g for name in names if (g := paths.generation_of(name)) is not None)

    def read(self, generation: int) -> AllocationRecord:
        """The record of one generation file; CorruptFileError when it holds another generation."""
        path = self.path(generation)
        record = read_record(path, AllocationRecord.from_dict)
        if record.generation != generation:
            raise CorruptFileError(str(path), f"holds generation {record.generation}, not {generation}")
        return record

    def read_mirror(self) -> AllocationRecord:
        try:
            return read_record(self.mirror, AllocationRecord.from_dict)
        except FileNotFoundError:
            raise CorruptFileError(str(self.mirror), "missing") from None

    def read_newest(self) -> AllocationRecord:
        """Starts from allocation.json and moves forward to the newest committed
        generation (listing allocation.gen/, then probing past the listing,
        which a client cache may show stale). CorruptFileError for a damaged file."""
        for _ in range(10):
            record = self.read_mirror()
            newest = max([record.generation, *self.listed()])
            while self.path(newest + 1).exists():
                newest += 1
            if newest == record.generation:
                return record
            try:
                return self.read(newest)
            except FileNotFoundError:
                continue   # pruned by a writer meanwhile: look again
        raise SessionDirError(f"{self.mirror}: the record kept changing while read; try again")

    def commit(self, record: AllocationRecord) -> bool:
        """Commit ``record`` as its generation; False if another writer did first."""
        text = json.dumps(record.to_dict(), indent=2, sort_keys=True, allow_nan=False) + "\n"
        # A write that fails (a full filesystem) commits nothing; the error
        # names the record, whose current content stays as it was.
        try:
            self.directory.mkdir(mode=0o700, exist_ok=True)
            # The temporary file lives next to its link: some filesystems (older
            # BeeGFS) make hard links only within one directory.
            fd, tmp_name = tempfile.mkstemp(prefix=paths.GENERATION_TMP_PREFIX, suffix=paths.TMP_SUFFIX,
                                            dir=self.directory)
        except OSError as exc:
            raise naming_error(exc, self.mirror) from exc
        try:
            try:
                os.fchmod(fd, 0o600)
                view = memoryview(text.encode("utf-8"))
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            except OSError as exc:
                raise naming_error(exc, self.mirror) from exc
            finally:
                os.close(fd)
            target = self.path(record.generation)
            try:
                os.link(tmp_name, target)
            except FileExistsError:
                # Over NFS a LINK retransmitted after a lost reply answers
                # "exists" for our own link: the inode tells.
                if not same_file(tmp_name, target):
                    return False
            except OSError as exc:
                raise no_hard_links(self.directory, exc) from None
            fsync_dir(self.directory)
            # Committed. The copy may only lag, never go back: skip it when a
            # newer generation is already there (its writer puts its own).
            if not self.path(record.generation + 1).exists():
                os.replace(tmp_name, self.mirror)
                fsync_dir(self.session)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
        # The backup mirrors the last good record; if we die between the
        # writes it lags, which repair can live with.
        # A failed backup write (a full filesystem) must not fail the update:
        # it is committed, and a caller that saw an error would apply it twice.
        try:
            atomic_write_json(self.backup, record.to_dict())
        except OSError as exc:
            log.warning("event=allocation_backup_failed path=%s generation=%s error=%s", self.backup,
                        record.generation, exc)
        self.prune(record.generation)
        return True

    def prune(self, newest: int) -> None:
        """Remove the generation files older than the last KEEP_GENERATIONS."""
        for generation in self.listed():
            if generation <= newest - KEEP_GENERATIONS:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path(generation))


__all__ = ["KEEP_GENERATIONS", "GenerationFiles", "check_filesystem", "no_hard_links", "same_file"]
