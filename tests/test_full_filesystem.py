"""A session directory whose filesystem fills up for a while: a write that
hits ENOSPC leaves the previous file intact and names it, and the next write
succeeds once there is room again. On a real (tiny) tmpfs when we may mount
one (root), else skipped; the backup write is also checked with a fake."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from elastic_ray.atomic import atomic_write_json, read_json
from elastic_ray.protocol.disk import generations as generations_module
from elastic_ray.protocol.disk.records import SessionInfo, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir
from tests.helpers import node_state


def make_info() -> SessionInfo:
    return SessionInfo(session_id="s-1", job_name="er-full", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu"}, worker_allocation=None, launcher={})


def add_worker(job_id: str):
    return lambda r: r.with_worker(WorkerRecord(job_id=job_id, config={"partition": "cpu"}, submitted_at=1.0))


@pytest.fixture
def small_fs():
    """A 1 MiB tmpfs, unmounted afterwards whatever happens."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = Path(tempfile.mkdtemp(prefix="er-small-fs-"))
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        with contextlib.suppress(OSError):
            mount_point.rmdir()


def fill(directory: Path) -> Path:
    """Take every free byte; returns the filler to remove."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def test_a_full_filesystem_fails_the_update_and_keeps_the_record(small_fs):
    session = SessionDir.create(small_fs / "sess", make_info())
    session.update_allocation(add_worker("101"))
    before = session.allocation_file.read_bytes()
    filler = fill(small_fs)
    with pytest.raises(OSError) as info:
        session.update_allocation(add_worker("102"))
    assert info.value.errno == errno.ENOSPC
    assert "allocation.json" in str(info.value)
    assert session.allocation_file.read_bytes() == before
    assert set(session.read_allocation().workers) == {"101"}
    # Other files too: the old content stays, the error names the file.
    with pytest.raises(OSError, match="cpu-1.json"):
        session.write_node_state(node_state("5", "cpu-1"))
    with pytest.raises(OSError, match="ray_head keeps its previous content"):
        session.write_ray_head("100")
    assert not list(session.path.rglob("*.tmp"))
    filler.unlink()
    assert set(session.update_allocation(add_worker("102")).workers) == {"101", "102"}
    session.write_node_state(node_state("5", "cpu-1"))
    assert "cpu-1" in session.read_node_states("5")


def test_a_backup_that_cannot_be_written_does_not_fail_a_committed_update(tmp_path, monkeypatch, caplog):
    session = SessionDir.create(tmp_path / "sess", make_info())
    real = generations_module.atomic_write_json

    def full(path, obj, mode=0o600):
        if Path(path) == session.backup_file:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, obj, mode)

    monkeypatch.setattr(generations_module, "atomic_write_json", full)   # the commit writes the backup
    with caplog.at_level("WARNING"):
        record = session.update_allocation(add_worker("101"))   # committed once, no error, no retry
    assert record.generation == 1 and session.read_allocation() == record
    assert any("event=allocation_backup_failed" in r.getMessage() for r in caplog.records)
    assert not session.backup_file.exists()     # it lags; the next update that can write it catches up


def test_atomic_write_names_the_file_and_keeps_it(tmp_path, monkeypatch):
    target = tmp_path / "f.json"
    atomic_write_json(target, {"a": 1})

    def no_space(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", no_space)
    with pytest.raises(OSError, match=r"f.json keeps its previous content") as info:
        atomic_write_json(target, {"a": 2})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    monkeypatch.undo()
    assert read_json(target) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["f.json"]
