"""Crash-safe file writes and validated reads.

A file in the session directory is always either its old content or its new
content, never half of each: we write a temporary file next to it, fsync it,
rename it over the target (the one operation NFS and local filesystems both
make atomic) and fsync the directory so the rename itself survives a crash.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from .errors import CorruptFileError

# A session file is small; anything bigger is garbage or an attack, and
# reading it whole would let one bad file exhaust a reader's memory.
MAX_FILE_BYTES = 4 * 1024 * 1024


def fsync_dir(directory: Path) -> None:
    """Make a rename or link in ``directory`` durable; a filesystem that refuses it is let be."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; the rename is still atomic
    finally:
        os.close(fd)


def naming_error(exc: OSError, target: Path) -> OSError:
    """The same error (same errno, so the same OSError subclass) with the
    target in it: ``[Errno 28] No space left on device`` alone does not say
    which file of which session could not be written."""
    if exc.errno is None:
        return exc
    return OSError(exc.errno, f"{exc.strerror or exc}; {target} keeps its previous content", str(target))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o600, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` atomically, with permissions ``mode``.

    ``durable=False`` skips the two fsyncs: still all-or-nothing against a
    crash of the writer, but not against a power loss. Only for node-local
    files that describe a live process (an agent's status file).

    On any failure (a full filesystem included) the temporary file is
    removed and ``path`` keeps its previous content; the OSError raised
    names ``path``.
    """
    target = Path(path)
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise naming_error(exc, target) from exc
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        if durable:
            os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp_name, target)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):
            raise naming_error(exc, target) from exc
        raise
    if durable:
        fsync_dir(target.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o600, *, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode, durable=durable)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, mode: int = 0o600, *, durable: bool = True) -> None:
    """Write ``obj`` as pretty JSON (people read these files when debugging)."""
    text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_text(path, text, mode, durable=durable)


def _refuse_special(path: str | os.PathLike[str], reason: str) -> CorruptFileError:
    return CorruptFileError(str(path), f"{reason}; only a regular file is read here (remove it)")


def read_bytes_bounded(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> bytes:
    """Read a whole regular file, refusing one larger than ``limit``.

    The file is opened without following a symlink and without blocking, and
    anything but a regular file is refused: a FIFO planted under a known name
    would otherwise hang the reader forever, and a symlink would redirect it
    to a file the writer never meant (another user's, or /dev/zero).

    Raises FileNotFoundError when absent and CorruptFileError when too big or
    not a regular file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):   # Linux says ELOOP, FreeBSD EMLINK
            raise _refuse_special(path, "is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _refuse_special(path, f"is not a regular file (mode {stat.filemode(info.st_mode)})")
        # Plain reads, no file object: agents read small files (ray_head)
        # every second, and a buffered reader costs more than the read.
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, max(info.st_size + 1, 4096)))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise CorruptFileError(str(path), f"larger than {limit} bytes")
    return data


# Limits of what a session file may hold. A record nests four levels at most
# and carries small numbers; these leave room for user configs while keeping
# a hostile file from costing a reader more than it costs to parse it.
MAX_DEPTH = 64
MAX_INT_DIGITS = 19                 # |n| < 10**19 covers every int64


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]!r} is out of range")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _check_tree(value: Any) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings that are not Unicode
    text (lone surrogates, which ``json`` decodes but nothing can write back).
    Iterative, so it cannot itself run out of stack."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                raise ValueError("a string holds a lone surrogate (not text)") from None
        elif isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
            children = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in children:
                if isinstance(key, str):
                    stack.append((key, depth))
                stack.append((child, depth + 1))


def parse_json_bytes(data: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity, bounded integers and nesting.

    Raises ValueError for anything else (RecursionError and OverflowError
    included, which ``json`` lets escape for deep nesting and huge numbers).
    """
    try:
        value = json.loads(data.decode("utf-8"), parse_int=_parse_int, parse_float=_parse_float,
                           parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except OverflowError as exc:
        raise ValueError(str(exc)) from None
    _check_tree(value)
    return value


def read_json(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> Any:
    """Parse a JSON file; a truncated, garbage or hostile file raises CorruptFileError.

    FileNotFoundError passes through: "absent" and "broken" mean different
    things to callers (absent is often normal, broken needs a report).
    """
    data = read_bytes_bounded(path, limit)
    try:
        return parse_json_bytes(data)
    except ValueError as exc:
        raise CorruptFileError(str(path), f"not valid JSON ({exc})") from None


# What a record's ``from_dict`` may raise for content it refuses. ValueError
# is its contract; the others stand for a validator that missed a case, which
# must still read as "damaged file", not crash the reader.
RECORD_ERRORS = (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError)

T = TypeVar("T")


def read_record(path: str | os.PathLike[str], parse: Callable[[Any], T], limit: int = MAX_FILE_BYTES) -> T:
    """Read a JSON file and validate it with ``parse`` (a record's ``from_dict``).

    Every malformed content raises CorruptFileError naming ``path``;
    FileNotFoundError passes through, other OSErrors too.
    """
    data = read_json(path, limit)
    try:
        return parse(data)
    except RECORD_ERRORS as exc:
        raise CorruptFileError(str(path), str(exc) or type(exc).__name__) from None
