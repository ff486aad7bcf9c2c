"""Crash-safe file writes and validated reads.

A file in the session directory is always either its old content or its new
content, never half of each: we write a temporary file next to it, fsync it,
rename it over the target (the one operation NFS and local filesystems both
make atomic) and fsync the directory so the rename itself survives a crash.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import CorruptFileError

# A session file is small; anything bigger is garbage or an attack, and
# reading it whole would let one bad file exhaust a reader's memory.
MAX_FILE_BYTES = 4 * 1024 * 1024


def _fsync_dir(directory: Path) -> None:
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


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data`` atomically, with permissions ``mode``."""
    target = Path(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
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
        raise
    _fsync_dir(target.parent)


def atomic_write_text(path: str | os.PathLike[str], text: str, mode: int = 0o600) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, mode: int = 0o600) -> None:
    """Write ``obj`` as pretty JSON (people read these files when debugging)."""
    text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_text(path, text, mode)


def read_bytes_bounded(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> bytes:
    """Read a whole file, refusing one larger than ``limit``.

    Raises FileNotFoundError when absent and CorruptFileError when too big.
    """
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise CorruptFileError(str(path), f"larger than {limit} bytes")
    return data


def read_json(path: str | os.PathLike[str], limit: int = MAX_FILE_BYTES) -> Any:
    """Parse a JSON file; a truncated or garbage file raises CorruptFileError.

    FileNotFoundError passes through: "absent" and "broken" mean different
    things to callers (absent is often normal, broken needs a report).
    """
    data = read_bytes_bounded(path, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptFileError(str(path), f"not valid JSON ({exc})") from None
