"""The session directory: layout, permissions, locking, and damaged files.

Real files and real processes: the invariants here (no lost update, no
crash on a damaged file, no blind overwrite) are about effects, so they are
tested against the filesystem, not a fake.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import time
from dataclasses import replace

import filelock
import pytest

from elastic_ray.errors import CorruptFileError, SessionDirError, UnsafePathError
from elastic_ray.protocol.disk import generations
from elastic_ray.protocol.disk import session_dir as session_dir_module
from elastic_ray.atomic import atomic_write_json, read_json
from elastic_ray.protocol.disk.records import (
    AllocationRecord,
    ElectionClaim,
    HeadEndpoint,
    SessionInfo,
    WorkerRecord,
)
from elastic_ray.protocol.disk.session_dir import SessionDir
from tests.helpers import node_state


def make_info(**overrides) -> SessionInfo:
    base = dict(session_id="s-1", job_name="er-test", created_at=1.0, scheduler={"kind": "local"},
                head={"partition": "cpu", "time_limit": "60"})
    base.update(overrides)
    return SessionInfo(**base)


@pytest.fixture
def session(tmp_path):
    return SessionDir.create(tmp_path / "sess", make_info())


def test_layout_and_permissions(session):
    assert stat.S_IMODE(os.stat(session.path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(session.secret_file).st_mode) == 0o600
    assert len(session.secret()) == 32
    assert session.log_dir.is_dir() and (session.path / "jobs").is_dir()
    assert session.read_allocation() == AllocationRecord()
    assert SessionDir.open(session.path).info() == make_info()


def test_create_refuses_an_existing_session(session):
    with pytest.raises(SessionDirError, match="already holds a session"):
        SessionDir.create(session.path, make_info(session_id="other"))
    assert session.info().session_id == "s-1"


def test_create_refuses_a_directory_that_holds_anything(tmp_path):
    target = tmp_path / "sess"
    target.mkdir()
    (target / "leftover.txt").write_text("from an earlier run")
    with pytest.raises(SessionDirError, match=rf"{target} is not empty \(leftover.txt\)"):
        SessionDir.create(target, make_info())
    assert not (target / "secret").exists() and not (target / "session.json").exists()


def test_create_takes_an_existing_empty_directory_of_ours_and_closes_it(tmp_path):
    target = tmp_path / "sess"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    SessionDir.create(target, make_info())
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_create_refuses_an_empty_directory_of_another_user(tmp_path):
    target = tmp_path / "sess"
    target.mkdir()
    os.chown(target, 54321, 54321)
    with pytest.raises(UnsafePathError, match="owned by uid 54321"):
        SessionDir.create(target, make_info())


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660])
def test_a_secret_others_can_read_is_refused_with_the_fix(session, mode):
    os.chmod(session.secret_file, mode)
    with pytest.raises(UnsafePathError) as info:
        session.secret()
    assert f"mode {mode:04o}" in str(info.value)
    assert f"chmod 600 {session.secret_file}" in str(info.value)
    os.chmod(session.secret_file, 0o600)
    assert len(session.secret()) == 32


def test_a_secret_that_is_a_symlink_or_fifo_is_refused(session, tmp_path):
    elsewhere = tmp_path / "other-key"
    elsewhere.write_bytes(b"k" * 32)
    os.chmod(elsewhere, 0o600)
    session.secret_file.unlink()
    session.secret_file.symlink_to(elsewhere)
    with pytest.raises(CorruptFileError, match="symbolic link"):
        session.secret()
    session.secret_file.unlink()
    os.mkfifo(session.secret_file, 0o600)
    with pytest.raises(CorruptFileError, match="not a regular file"):
        session.secret()          # returns at once: a FIFO is never waited on


def test_open_refuses_a_plain_directory(tmp_path):
    with pytest.raises(SessionDirError, match="not a session directory"):
        SessionDir.open(tmp_path)


def test_open_reports_a_damaged_session_file(session):
    session.session_file.write_text('{"protocol_version": 1, "session_id": ')
    with pytest.raises(CorruptFileError) as info:
        SessionDir.open(session.path)
    assert "session.json" in str(info.value)


def test_open_refuses_another_protocol_version(session):
    data = read_json(session.session_file)
    data["protocol_version"] = 99
    atomic_write_json(session.session_file, data)
    with pytest.raises(CorruptFileError, match="protocol_version 99") as info:
        session.info()
    assert "session.json" in str(info.value)
    assert "written by a newer elastic-ray (protocol 99); this one speaks protocol 1; upgrade" in str(info.value)


@pytest.mark.parametrize("version", [0, -1, "1", 1.0, True, None])
def test_a_protocol_version_that_is_no_version_is_refused(session, version):
    data = read_json(session.session_file)
    data["protocol_version"] = version
    atomic_write_json(session.session_file, data)
    with pytest.raises(CorruptFileError, match="protocol_version"):
        session.info()


def test_a_newer_allocation_record_is_refused_not_overwritten(session):
    data = read_json(session.allocation_file)
    data["protocol_version"] = 2
    atomic_write_json(session.allocation_file, data)
    with pytest.raises(CorruptFileError, match=r"newer elastic-ray \(protocol 2\).*upgrade"):
        session.update_allocation(add_worker("7"))
    assert read_json(session.allocation_file)["protocol_version"] == 2


def add_worker(job_id: str):
    def change(record: AllocationRecord) -> AllocationRecord:
        return record.with_worker(WorkerRecord(job_id=job_id, config={"partition": "cpu"}, submitted_at=1.0))
    return change


def test_update_round_trip_and_generation(session):
    rec = session.update_allocation(add_worker("101"))
    assert rec.generation == 1 and set(rec.workers) == {"101"}
    rec = session.update_allocation(lambda r: replace(r, head_job="100", successor="101",
                                                      election=ElectionClaim("me", 1.0, 121.0)))
    assert session.read_allocation() == rec
    assert rec.generation == 2
    # Returning the record unchanged writes nothing.
    assert session.update_allocation(lambda r: r).generation == 2


def test_an_invalid_update_is_refused_and_changes_nothing(session):
    session.update_allocation(add_worker("101"))
    before = session.allocation_file.read_bytes()
    with pytest.raises(ValueError):
        session.update_allocation(lambda r: replace(r, head_job="not-a-job"))
    assert session.allocation_file.read_bytes() == before


@pytest.mark.parametrize("damage", [
    b"",                                   # truncated to nothing
    b'{"protocol_version": 1, "gener',     # truncated mid-write by an outside tool
    b"\x00\xff garbage",                   # not text
    b"[1, 2, 3]",                          # JSON of the wrong shape
    b'{"protocol_version": 1, "generation": -1, "head_job": null, "workers": {}, '
    b'"predecessors": [], "election": null, "successor": null}',
    b'{"protocol_version": 1, "generation": 1, "head_job": "12; rm -rf /", "workers": {}, '
    b'"predecessors": [], "election": null, "successor": null}',
])
def test_a_damaged_record_is_restored_from_its_backup_and_kept_aside(session, damage, caplog):
    session.update_allocation(add_worker("101"))
    session.allocation_file.write_bytes(damage)   # in place: generation file 1 is the same inode
    with caplog.at_level("WARNING"):
        restored = session.read_allocation()
    assert set(restored.workers) == {"101"} and restored.generation == 2
    events = [r.getMessage() for r in caplog.records if "event=allocation_recovered" in r.getMessage()]
    assert len(events) == 1 and "allocation.json.bak" in events[0] and "newest_known=1" in events[0]
    # The damaged bytes are kept for a person, never deleted or overwritten.
    (aside,) = session.path.glob("allocation.json.corrupt-*")
    assert aside.read_bytes() == damage
    assert session.update_allocation(add_worker("102")).generation == 3
    assert set(session.read_allocation().workers) == {"101", "102"}


def test_an_oversized_file_is_refused(session):
    session.allocation_file.write_bytes(b" " * (5 * 1024 * 1024))
    with pytest.raises(CorruptFileError, match="larger than"):
        session.read_allocation()


def test_lock_timeout_names_the_lock(session):
    holder = filelock.FileLock(str(session.lock_file))
    with holder:
        # filelock is re-entrant within a thread, so hold it from another process.
        proc = multiprocessing.get_context("spawn").Process(target=_try_update, args=(str(session.path),))
        proc.start()
        proc.join(20)
    assert proc.exitcode == 0


def _try_update(path: str) -> None:
    try:
        SessionDir(path).update_allocation(add_worker("7"), timeout=0.5)
    except SessionDirError as exc:
        assert ".allocation.lock" in str(exc)
        raise SystemExit(0)
    raise SystemExit(1)


def _hammer(path: str, start: int, count: int) -> None:
    session = SessionDir(path)
    for i in range(count):
        session.update_allocation(add_worker(str(start + i)))


def test_concurrent_updates_from_many_processes_lose_nothing(session):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(session.path), 1000 * (k + 1), 25)) for k in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    rec = session.read_allocation()
    assert len(rec.workers) == 200
    assert rec.generation == 200


class _NoLock:
    """A lock that does not lock: flock on Lustre ``localflock`` or BeeGFS
    without global locks, seen from two nodes."""

    def __init__(self, *_args, **_kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False


def _hammer_without_flock(path: str, start: int, count: int) -> None:
    session_dir_module._flock = _NoLock
    _hammer(path, start, count)


def test_without_a_working_flock_the_generation_swap_loses_nothing(session):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer_without_flock, args=(str(session.path), 1000 * (k + 1), 25))
             for k in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert all(p.exitcode == 0 for p in procs)
    rec = session.read_allocation()
    assert len(rec.workers) == 200
    assert rec.generation == 200
    # Clutter stays bounded: only the last generations are kept.
    assert len(list(session.generation_dir.glob("*.json"))) <= generations.KEEP_GENERATIONS


def test_a_writer_that_loses_the_race_computes_its_change_again(session, monkeypatch):
    """Two writers read generation 0; the other commits first. Without the
    compare-and-swap, ours would overwrite worker 900 with a record that
    never saw it."""
    monkeypatch.setattr(session_dir_module, "_flock", _NoLock)
    other = SessionDir(session.path)
    seen = []

    def change(record: AllocationRecord) -> AllocationRecord:
        seen.append(record.generation)
        if len(seen) == 1:
            other.update_allocation(add_worker("900"))   # commits generation 1 meanwhile
        return add_worker("101")(record)

    rec = session.update_allocation(change)
    assert seen == [0, 1]
    assert set(rec.workers) == {"900", "101"} and rec.generation == 2
    assert session.read_allocation() == rec


def test_a_reader_moves_past_a_copy_its_writer_never_replaced(session, monkeypatch):
    """A writer that died between commit (the link) and the rename of
    allocation.json: the committed generation counts, for readers and writers."""
    session.update_allocation(add_worker("101"))
    real_replace = os.replace

    def die_before_copy(src, dst):
        if str(dst) == str(session.allocation_file):
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", die_before_copy)
    with pytest.raises(KeyboardInterrupt):
        session.update_allocation(add_worker("102"))
    monkeypatch.undo()
    assert read_json(session.allocation_file)["generation"] == 1        # the copy lags
    assert set(session.read_allocation().workers) == {"101", "102"}      # the commit counts
    rec = session.update_allocation(add_worker("103"))
    assert rec.generation == 3 and set(rec.workers) == {"101", "102", "103"}
    assert read_json(session.allocation_file)["generation"] == 3


def test_a_generation_file_that_does_not_hold_its_generation_is_corrupt(session):
    session.update_allocation(add_worker("101"))
    data = read_json(session.generation_file(1))
    atomic_write_json(session.generation_file(2), dict(data, generation=7))
    with pytest.raises(CorruptFileError, match=r"2.json: holds generation 7, not 2"):
        session.read_allocation()


def test_restore_continues_past_every_committed_generation(session):
    for job in ("101", "102"):
        session.update_allocation(add_worker(job))
    session.generation_file(2).write_bytes(b"{damaged")     # also allocation.json: one inode
    restored = session.read_allocation()
    # The newest good record (the backup mirrors generation 2) under a fresh generation.
    assert set(restored.workers) == {"101", "102"} and restored.generation == 3
    assert session.update_allocation(add_worker("103")).generation == 4


def test_a_writer_killed_mid_write_leaves_the_old_content(session, monkeypatch):
    session.update_allocation(add_worker("101"))
    before = session.allocation_file.read_bytes()

    def boom(*_args, **_kwargs):
        raise KeyboardInterrupt  # stands for a crash between write and rename

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(KeyboardInterrupt):
        session.update_allocation(add_worker("102"))
    monkeypatch.undo()
    assert session.allocation_file.read_bytes() == before
    assert not [p for p in session.path.iterdir() if p.name.endswith(".tmp")]


# ----------------------------------------------------------------- ray_head pointer

def test_ray_head_pointer(session):
    assert session.read_ray_head() is None
    session.write_ray_head("12345")
    assert session.ray_head_file.read_text() == "12345\n"
    assert session.read_ray_head() == "12345"


@pytest.mark.parametrize("content", [b"", b"abc", b"12 34", b"-1", b"1" * 200, b"\xff\xfe"])
def test_a_damaged_ray_head_reads_as_unknown(session, content):
    session.ray_head_file.write_bytes(content)
    assert session.read_ray_head() is None


def test_write_ray_head_refuses_a_non_job_id(session):
    with pytest.raises(ValueError):
        session.write_ray_head("../../etc")
    assert session.read_ray_head() is None


# ----------------------------------------------------------------- per-job files

def test_head_endpoint_round_trip_and_damage(session):
    endpoint = HeadEndpoint(job_id="5", host="cpu-1", address="10.78.0.11:6380", ray_version="2.60.0",
                            started_at=time.time(), ports={"gcs": 6380})
    assert session.read_head_endpoint("5") is None
    session.write_head_endpoint(endpoint)
    assert session.read_head_endpoint("5") == endpoint
    (session.job_dir("5") / "head.json").write_text('{"job_id": "5", "address": "nohost"')
    assert session.read_head_endpoint("5") is None
    with pytest.raises(ValueError):
        session.write_head_endpoint(replace(endpoint, address="10.0.0.1:99999"))


def test_node_states_round_trip_and_skip_damaged_files(session):
    joined, starting = node_state("5", "cpu-1", "JOINED"), node_state("5", "cpu-2", "STARTING")
    session.write_node_state(joined)
    session.write_node_state(starting)
    nodes = session.job_dir("5") / "nodes"
    (nodes / "cpu-3.json").write_text("{broken")
    atomic_write_json(nodes / "cpu-4.json", {**joined.to_dict(), "node": "cpu-4", "state": "SLEEPING"})
    atomic_write_json(nodes / "cpu-5.json", {**joined.to_dict(), "node": "cpu-5", "protocol_version": 2})
    assert session.read_node_states("5") == {"cpu-1": joined, "cpu-2": starting}
    with pytest.raises(ValueError, match="node"):
        session.write_node_state(replace(joined, node="../x"))
    with pytest.raises(ValueError, match="restarts"):
        session.write_node_state(replace(joined, restarts=-1))  # never written if it could not be read back


def test_a_node_file_that_names_another_job_or_node_is_unknown(session):
    session.write_node_state(node_state("5", "cpu-1"))
    nodes = session.job_dir("5") / "nodes"
    atomic_write_json(nodes / "cpu-2.json", node_state("5", "cpu-1").to_dict())   # copied by hand
    atomic_write_json(nodes / "cpu-3.json", node_state("6", "cpu-3").to_dict())
    assert list(session.read_node_states("5")) == ["cpu-1"]


def test_a_node_file_written_before_the_protocol_version_is_read(session):
    state = node_state("5", "cpu-1")
    old = state.to_dict()
    del old["protocol_version"]
    session.job_dir("5").joinpath("nodes").mkdir(parents=True)
    atomic_write_json(session.job_dir("5") / "nodes" / "cpu-1.json", old)
    assert session.read_node_states("5") == {"cpu-1": state}


def test_job_dir_refuses_path_tricks(session):
    with pytest.raises(ValueError):
        session.job_dir("../../etc")


def test_record_json_is_readable_by_people(session):
    session.update_allocation(add_worker("101"))
    data = json.loads(session.allocation_file.read_text())
    assert data["workers"]["101"]["state"] == "submitted"


def test_a_worker_record_knows_whether_it_hosts_the_runs_head():
    """``hosts_run_head`` was added compatibly: records written before it read as False."""
    from elastic_ray.protocol.disk.records import WorkerRecord

    added = WorkerRecord(job_id="7", config={"partition": "cpu"}, submitted_at=1.0)
    first = WorkerRecord(job_id="8", config={}, submitted_at=1.0, hosts_run_head=True)
    assert WorkerRecord.from_dict(first.to_dict()) == first
    assert WorkerRecord.from_dict(added.to_dict()).hosts_run_head is False
    old = {k: v for k, v in first.to_dict().items() if k != "hosts_run_head"}
    assert WorkerRecord.from_dict(old).hosts_run_head is False
    with pytest.raises(ValueError, match="hosts_run_head"):
        WorkerRecord.from_dict({**first.to_dict(), "hosts_run_head": "yes"})


def test_a_link_that_reports_exists_for_our_own_commit_counts_once(session, monkeypatch):
    """NFS: a LINK retransmitted after a lost reply answers EEXIST although the
    first one made our link. Taken for a lost race, the change would be
    applied twice (head_failures counted twice, say)."""
    real_link = os.link

    def link_then_exists(src, dst):
        real_link(src, dst)
        raise FileExistsError(17, "File exists", str(dst))

    monkeypatch.setattr(os, "link", link_then_exists)
    calls = []

    def change(record: AllocationRecord) -> AllocationRecord:
        calls.append(record.generation)
        return add_worker("101")(record)

    rec = session.update_allocation(change)
    assert calls == [0] and rec.generation == 1
    assert session.read_allocation() == rec


def test_create_refuses_a_filesystem_without_hard_links(tmp_path, monkeypatch):
    def no_links(*_args, **_kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(SessionDirError, match="refused a hard link.*POSIX filesystem with hard links"):
        SessionDir.create(tmp_path / "sess", make_info())
