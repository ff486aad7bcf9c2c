"""A damaged allocation.json: restored on its own when nothing newer is lost,
refused with the reasons and the one command otherwise (protocol.disk.recovery
decides, protocol.disk.allocation_repair acts, SessionDir calls them)."""

from __future__ import annotations

import json
import multiprocessing
from dataclasses import replace

import pytest

from elastic_ray.atomic import atomic_write_json
from elastic_ray.errors import CorruptFileError
from elastic_ray.protocol.disk.records import AllocationRecord, SessionInfo, WorkerRecord
from elastic_ray.protocol.disk.recovery import (
    Candidate,
    DamagedFile,
    Evidence,
    describe,
    legible_numbers,
    plan_recovery,
)
from elastic_ray.protocol.disk.session_dir import SessionDir


def make_info() -> SessionInfo:
    return SessionInfo(session_id="s-1", job_name="er-rec", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu"}, worker_allocation=None, launcher={})


@pytest.fixture
def session(tmp_path):
    return SessionDir.create(tmp_path / "sess", make_info())


def add_worker(job_id: str):
    def change(record: AllocationRecord) -> AllocationRecord:
        return record.with_worker(WorkerRecord(job_id=job_id, config={"partition": "cpu"}, submitted_at=1.0))
    return change


def rec(generation: int, head: str | None = "100", workers: tuple[str, ...] = ()) -> AllocationRecord:
    out = AllocationRecord(generation=generation, head_job=head)
    for job in workers:
        out = add_worker(job)(out)
    return out


# ------------------------------------------------------------------ the pure rule

def evidence(*, damaged_gen=None, proto=None, committed=(), candidates=(), pointer=None, heads=()) -> Evidence:
    return Evidence(DamagedFile("/s/allocation.json", "not valid JSON", damaged_gen, proto), tuple(committed),
                    tuple(candidates), pointer, frozenset(heads))


BAK5 = Candidate("/s/allocation.json.bak", rec(5, workers=("101",)))
GEN4 = Candidate("/s/allocation.gen/4.json", rec(4))


@pytest.mark.parametrize("case, automatic, why", [
    (evidence(committed=(4, 5), candidates=(GEN4, BAK5)), True, ""),
    (evidence(damaged_gen=5, candidates=(BAK5,)), True, ""),
    (evidence(candidates=(BAK5,), pointer="100", heads=("100",)), True, ""),      # no gen files: the live state agrees
    (evidence(committed=(4, 5, 6), candidates=(GEN4, BAK5)), False, "generation 6 was committed"),
    (evidence(damaged_gen=7, candidates=(BAK5,)), False, "generation 7 was committed"),
    (evidence(candidates=(BAK5,), pointer="102"), False, "ray_head names job 102"),
    (evidence(candidates=(BAK5,), heads=("100", "103")), False, "jobs 103 published a head endpoint"),
    (evidence(committed=(5,)), False, "no readable generation file"),
    (evidence(proto=2, candidates=(BAK5,)), False, "newer elastic-ray"),
])
def test_what_may_be_restored_on_its_own(case, automatic, why):
    plan = plan_recovery(case)
    assert plan.automatic is automatic
    assert why in "; ".join(plan.refusals)
    assert (plan.source is BAK5) == bool(case.candidates)


def test_the_generation_file_wins_a_tie_with_the_backup():
    gen5 = Candidate("/s/allocation.gen/5.json", rec(5))
    assert plan_recovery(evidence(committed=(5,), candidates=(gen5, BAK5))).source is gen5


@pytest.mark.parametrize("data, numbers", [
    (b'{\n  "election": null,\n  "generation": 12,\n  "head_job": "1', (12, None)),
    (b'{"protocol_version": 1, "gener', (None, 1)),
    (json.dumps({"protocol_version": 2, "generation": 3}).encode(), (3, 2)),
    (b'{"generation": -4, "protocol_version": true}', (None, None)),
    (b"\x00\xff", (None, None)),
])
def test_what_a_damaged_file_still_shows(data, numbers):
    assert legible_numbers(data) == numbers


def test_the_description_names_what_would_come_back():
    text = describe(plan_recovery(evidence(committed=(6,), candidates=(BAK5,))))
    assert "allocation.json.bak (generation 5; newest known 6)" in text and "worker allocations 101" in text
    assert "not automatic:" in text


# ------------------------------------------------------------------ on a real directory

def test_a_lagging_backup_is_refused_with_the_command_and_the_file_left_alone(session):
    for job in ("101", "102"):
        session.update_allocation(add_worker(job))
    atomic_write_json(session.backup_file, session.generations.read(1).to_dict())   # the backup lags (a full disk)
    session.allocation_file.write_bytes(b"\x00garbage")                               # and gen 2 with it: one inode
    with pytest.raises(CorruptFileError, match=r"generation 2 was committed.*elastic-ray session repair") as info:
        session.read_allocation()
    assert str(session.allocation_file) in str(info.value)
    with pytest.raises(CorruptFileError, match="elastic-ray session repair"):
        session.update_allocation(add_worker("103"))
    assert session.allocation_file.read_bytes() == b"\x00garbage"
    assert not list(session.path.glob("allocation.json.corrupt-*"))
    plan = session.repair_plan()
    assert plan is not None and not plan.automatic and plan.source.generation == 1
    # The documented command does what the plan showed.
    restored = session.restore_allocation_backup()
    assert set(restored.workers) == {"101"} and restored.generation == 3
    assert session.repair_plan() is None


def test_a_backup_that_does_not_know_the_live_head_is_refused(session):
    session.update_allocation(lambda r: replace(r, head_job="100"))
    session.write_ray_head("100")
    bak = session.read_allocation()
    session.update_allocation(lambda r: replace(r, head_job="200", predecessors=("100",)))
    session.write_ray_head("200")
    atomic_write_json(session.backup_file, bak.to_dict())
    for path in session.generation_dir.glob("*.json"):        # no generation files to tell
        path.unlink()
    session.allocation_file.write_bytes(b"")
    with pytest.raises(CorruptFileError, match="ray_head names job 200"):
        session.read_allocation()


def test_a_damaged_generation_file_behind_a_lagging_copy_is_restored(session):
    session.update_allocation(add_worker("101"))
    session.update_allocation(add_worker("102"))
    # As if the writer of generation 2 died before replacing the copy.
    atomic_write_json(session.allocation_file, session.generations.read(1).to_dict())   # the copy lags
    session.generation_file(2).write_bytes(b"{")                                         # and gen 2 is damaged
    restored = session.read_allocation()   # the backup holds generation 2
    assert set(restored.workers) == {"101", "102"} and restored.generation == 3
    assert list(session.path.glob("allocation.gen.2.corrupt-*"))


def test_both_copies_damaged_is_refused(session):
    session.update_allocation(add_worker("101"))
    session.allocation_file.write_bytes(b"{")
    session.backup_file.write_bytes(b"}")
    with pytest.raises(CorruptFileError, match="no readable generation file and no readable"):
        session.read_allocation()


def _read_workers(path: str, queue) -> None:
    queue.put(sorted(SessionDir(path).read_allocation().workers))


def test_many_processes_meeting_one_damage_restore_it_once(session):
    for job in ("101", "102"):
        session.update_allocation(add_worker(job))
    session.allocation_file.write_bytes(b"")
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_read_workers, args=(str(session.path), queue)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [queue.get(timeout=5) for _ in procs] == [["101", "102"]] * 4
    assert len(list(session.path.glob("allocation.json.corrupt-*"))) == 1
    assert session.read_allocation().generation == 3


def test_the_repair_command_shows_then_restores_with_yes(session):
    from click.testing import CliRunner

    from elastic_ray.cli.main import main

    runner = CliRunner()
    result = runner.invoke(main, ["session", "repair", str(session.path)])
    assert result.exit_code == 0 and "nothing to repair" in result.output
    for job in ("101", "102"):
        session.update_allocation(add_worker(job))
    atomic_write_json(session.backup_file, session.generations.read(1).to_dict())
    session.allocation_file.write_bytes(b"")
    result = runner.invoke(main, ["session", "repair", str(session.path)])
    assert result.exit_code == 0, result.output
    assert "would restore" in result.output and "generation 2 was committed" in result.output
    assert "--yes" in result.output and session.allocation_file.read_bytes() == b""
    result = runner.invoke(main, ["session", "repair", str(session.path), "--yes"])
    assert result.exit_code == 0, result.output
    assert "restored" in result.output and set(session.read_allocation().workers) == {"101"}
    session.backup_file.write_bytes(b"{")
    session.allocation_file.write_bytes(b"{")
    for path in session.generation_dir.glob("*.json"):
        path.unlink()
    result = runner.invoke(main, ["session", "repair", str(session.path), "--yes"])
    assert result.exit_code == 1 and "nothing to restore from" in result.output
