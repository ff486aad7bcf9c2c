"""Fuzz: every reader of a session file either returns a valid record or
raises CorruptFileError, whatever the file holds.

Many files per kind, from a fixed seed (a failure reproduces): random bytes,
byte-level mutations of a good file, and structured mutations that put a
hostile value (huge integer, deep nesting, NaN, lone surrogate, wrong type)
somewhere in a good record. A bare ValueError, RecursionError, OverflowError
or TypeError escaping a reader fails the test.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elastic_ray.agent import status as agent_status
from elastic_ray.atomic import read_record
from elastic_ray.errors import CorruptFileError
from elastic_ray.protocol.disk.records import (
    AllocationRecord,
    ElectionClaim,
    HeadEndpoint,
    HostedHead,
    HostedHeadState,
    NodeState,
    SessionInfo,
    WorkerRecord,
)
from elastic_ray.protocol.disk.session_dir import SessionDir
from tests.helpers import node_state

CASES_PER_KIND = 300

HOSTILE_TEXT = [
    "1" * 5000,                    # beyond Python's int parsing limit
    "-" + "9" * 40,                # an int no record field can hold
    "1e999", "-1e999",             # overflow to infinity
    "NaN", "Infinity", "-Infinity",
    "[" * 5000 + "]" * 5000,       # deep enough for RecursionError in json
    "[" * 70 + "]" * 70,           # parses, but deeper than any record
    '"\\ud800"',                   # a lone surrogate: decodes, cannot be written back
    '"\\u0000"', "null", "true", "false", "0", "-1", "1.5", '""', "[]", "{}",
    '"' + "x" * 10000 + '"',
    '{"a": ' * 40 + "1" + "}" * 40,
]


def _session_info() -> SessionInfo:
    return SessionInfo(session_id="s-1", job_name="er-fuzz", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu", "time_limit": "60", "nested": {"a": [1, 2.5, "x"]}},
                       worker_allocation={"partition": "gpu"}, launcher={"port_strategy": "random"})


def _allocation() -> AllocationRecord:
    rec = AllocationRecord(generation=0, head_job="5", predecessors=("3", "4"),
                           election=ElectionClaim("host:1", 10.0, 130.0), successor="6")
    rec = rec.with_worker(WorkerRecord(job_id="6", config={"partition": "gpu"}, submitted_at=2.0,
                                       state="draining", drain_requested_at=3.0, drain_deadline=4.0))
    return rec.with_worker(WorkerRecord(job_id="7", config={}, submitted_at=2.0, hosts_run_head=True))


def _head() -> HeadEndpoint:
    return HeadEndpoint(job_id="5", host="cpu-1", address="10.0.0.1:6379", ray_version="2.60.0",
                        started_at=5.0, ports={"gcs": 6379, "dashboard": 0})


def _node() -> NodeState:
    return node_state("5", "cpu-1", "JOINED", ports={"node_manager": 4100}, ray_pid=10, raylet_pid=11,
                      hosted_head=HostedHead(HostedHeadState.READY, 3.0, address="10.0.0.1:6380"),
                      history=("a", "b"), head_job="5", exit_code=None)


def _hostile_value(rng: random.Random) -> Any:
    text = rng.choice(HOSTILE_TEXT)
    # Parsed with Python's permissive json so the value can go into a tree;
    # the text ones that would not parse stay text and are spliced as text.
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _Raw(text)


class _Raw:
    """Text spliced into the JSON as it is (a value json.dumps cannot make)."""

    counter = 0

    def __init__(self, text: str):
        _Raw.counter += 1
        self.text = text
        self.marker = f"__RAW_{_Raw.counter}__"


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(tree, dict):
        for key, value in tree.items():
            out += _paths(value, prefix + (key,))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            out += _paths(value, prefix + (index,))
    return out


def _set(tree: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, head: _set(tree[head], rest, value)}
    copy = list(tree)
    copy[head] = _set(copy[head], rest, value)
    return copy


def _structured(good: dict, rng: random.Random) -> bytes:
    tree: Any = good
    raws = []
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(_paths(tree))
        roll = rng.random()
        if roll < 0.15 and path and isinstance(_parent(tree, path), dict):
            parent_path = path[:-1]
            parent = dict(_parent(tree, path))
            parent.pop(path[-1], None)
            tree = _set(tree, parent_path, parent)
            continue
        value = _hostile_value(rng)
        if isinstance(value, _Raw):
            raws.append(value)
            value = value.marker
        tree = _set(tree, path, value)
    text = json.dumps(tree, allow_nan=True)
    for raw in raws:
        text = text.replace(json.dumps(raw.marker), raw.text)
    return text.encode("utf-8", "surrogatepass")


def _parent(tree: Any, path: tuple) -> Any:
    for key in path[:-1]:
        tree = tree[key]
    return tree


def _bytewise(good: bytes, rng: random.Random) -> bytes:
    data = bytearray(good)
    for _ in range(rng.randint(1, 8)):
        roll = rng.random()
        pos = rng.randrange(len(data) + 1)
        if roll < 0.3 and data:
            data[min(pos, len(data) - 1)] = rng.randrange(256)
        elif roll < 0.5:
            del data[pos:pos + rng.randint(1, 20)]
        elif roll < 0.7:
            data[pos:pos] = rng.choice([b"\xff\xfe", b"\xc3", b"NaN", b"[[[[", b"9" * 30, b'"\\ud800"', b"}"])
        else:
            data = data[:pos]
    return bytes(data)


def _random(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
    return rng.choice(HOSTILE_TEXT).encode()


def _cases(good: dict, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    good_bytes = json.dumps(good, indent=2).encode()
    cases = []
    for i in range(CASES_PER_KIND):
        kind = i % 3
        cases.append(_structured(good, rng) if kind == 0 else _bytewise(good_bytes, rng) if kind == 1
                     else _random(rng))
    return cases


def _assert_valid(record: Any) -> None:
    """What a reader returns must be a record we can use and write back."""
    data = record.to_dict()
    json.dumps(data, allow_nan=False).encode("utf-8")
    assert type(record).from_dict(data) == record


def _check(read: Callable[[], Any]) -> str:
    try:
        record = read()
    except CorruptFileError:
        return "corrupt"
    if record is None:
        return "unknown"
    _assert_valid(record)
    return "valid"


@pytest.fixture
def session(tmp_path) -> SessionDir:
    return SessionDir.create(tmp_path / "sess", _session_info())


KINDS = ["session.json", "allocation.json", "allocation.gen", "allocation.json.bak", "head.json", "node.json",
         "status file"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_reader_reports_any_malformed_file_as_corrupt(session, tmp_path, kind):
    session.update_allocation(lambda r: _allocation())         # generation 1
    good = {
        "session.json": _session_info().to_dict(),
        "allocation.json": _allocation().to_dict(),
        "allocation.gen": {**_allocation().to_dict(), "generation": 2},
        "allocation.json.bak": _allocation().to_dict(),
        "head.json": _head().to_dict(),
        "node.json": _node().to_dict(),
        "status file": _node().to_dict(),
    }[kind]
    head_dir = session.job_dir("5")
    (head_dir / "nodes").mkdir(parents=True)
    status_dir = tmp_path / "status"
    status_dir.mkdir(mode=0o700)
    target, readers = {
        "session.json": (session.session_file, [session.info]),
        "allocation.json": (session.allocation_file, [session.read_allocation]),
        "allocation.gen": (session.generation_file(2), [session.read_allocation]),
        "allocation.json.bak": (session.backup_file,
                                [lambda: read_record(session.backup_file, AllocationRecord.from_dict)]),
        "head.json": (head_dir / "head.json", [lambda: read_record(head_dir / "head.json", HeadEndpoint.from_dict),
                                               lambda: session.read_head_endpoint("5")]),
        "node.json": (head_dir / "nodes" / "cpu-1.json",
                      [lambda: read_record(head_dir / "nodes" / "cpu-1.json", NodeState.from_dict),
                       lambda: session.read_node_states("5").get("cpu-1")]),
        "status file": (status_dir / "5.cpu-1.1.json",
                        [lambda: agent_status.read_status(status_dir / "5.cpu-1.1.json"),
                         lambda: agent_status.collect(status_dir, 10.0)[0].status]),
    }[kind]
    seen: dict[str, int] = {}
    for index, data in enumerate(_cases(good, seed=KINDS.index(kind))):
        if kind == "allocation.json":
            # A damaged copy must not hide behind newer generation files, nor
            # be restored from its backup (that path has its own fuzz below).
            for path in session.generation_dir.glob("*.json"):
                path.unlink()
            session.backup_file.unlink(missing_ok=True)
        target.write_bytes(data) if not target.exists() or target.stat().st_nlink == 1 else _replace(target, data)
        for read in readers:
            try:
                outcome = _check(read)
            except Exception as exc:  # noqa: BLE001 - the point of the test
                raise AssertionError(f"{kind} case {index}: {type(exc).__name__}: {exc!s:.200} "
                                     f"for content {data[:120]!r}") from None
            seen[outcome] = seen.get(outcome, 0) + 1
    # The fuzz reached both sides: mostly refusals, and some files still valid.
    assert seen.get("corrupt", 0) + seen.get("unknown", 0) > CASES_PER_KIND // 2, seen


def test_any_damage_to_allocation_json_is_restored_from_the_backup_or_refused(session):
    """With a good backup, whatever allocation.json holds, a reader gets the
    backup's record (or the file's own, if it still validates) or one
    CorruptFileError; the damaged bytes are always kept aside."""
    good = session.update_allocation(lambda r: _allocation())
    seen: dict[str, int] = {}
    for index, data in enumerate(_cases(good.to_dict(), seed=99)[:120]):
        _replace(session.allocation_file, data)
        before = set(session.path.glob("allocation.json.corrupt-*"))
        try:
            record = session.read_allocation()
        except CorruptFileError:
            seen["refused"] = seen.get("refused", 0) + 1
            assert session.allocation_file.read_bytes() == data, f"case {index}: a refused file was changed"
            continue
        except Exception as exc:  # noqa: BLE001 - the point of the test
            raise AssertionError(f"case {index}: {type(exc).__name__}: {exc!s:.200} for {data[:120]!r}") from None
        _assert_valid(record)
        kept = set(session.path.glob("allocation.json.corrupt-*")) - before
        if kept:
            seen["restored"] = seen.get("restored", 0) + 1
            assert (record.workers, record.head_job) == (good.workers, good.head_job), f"case {index}"
            assert [p.read_bytes() for p in kept] == [data], f"case {index}: damaged bytes not kept"
            for path in kept:
                path.unlink()
        else:
            seen["valid"] = seen.get("valid", 0) + 1
        # Start each case from the good record again.
        session.update_allocation(lambda r: _allocation())
    assert seen.get("restored", 0) > 60, seen


def _replace(target: Path, data: bytes) -> None:
    """Write without touching the inode a hard link shares (allocation.json
    and its generation file are one file after an update)."""
    tmp = target.with_name(target.name + ".fuzz")
    tmp.write_bytes(data)
    os.replace(tmp, target)


@pytest.mark.parametrize("text, reason", [
    ("1" * 30, "digits"),
    ("[" * 100000 + "]" * 100000, "nested too deeply"),
    ("[" * 65 + "]" * 65, "nested deeper than 64"),
    ("NaN", "NaN is not JSON"),
    ("-Infinity", "-Infinity is not JSON"),
    ("1e400", "out of range"),
    ('"\\udc00"', "lone surrogate"),
])
def test_hostile_json_is_named_in_the_refusal(session, text, reason):
    session.session_file.write_text(text)
    with pytest.raises(CorruptFileError, match=reason) as info:
        session.info()
    assert str(session.session_file) in str(info.value)


def test_invalid_utf8_is_corrupt(session):
    session.session_file.write_bytes(b'{"session_id": "\xff\xfe"}')
    with pytest.raises(CorruptFileError, match="not UTF-8"):
        session.info()
