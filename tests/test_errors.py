"""Every public error lives in ``elastic_ray.errors`` and is an ``ElasticRayError``.

Tables: the classes of the module and the built-in bases some keep (so that
``except ValueError`` and ``except TimeoutError`` still catch them), the
modules that defined them before they were gathered (each still gives the
same object), their messages and attributes, the names the package exports
at its top, and that ``errors`` stays free of every room.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import elastic_ray
from elastic_ray import errors
from elastic_ray.remote.ssh import SshTarget

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def error_classes() -> dict[str, type[BaseException]]:
    """The exception classes defined in errors.py (not the ones it imports)."""
    return {name: obj for name, obj in vars(errors).items()
            if isinstance(obj, type) and issubclass(obj, BaseException) and obj.__module__ == errors.__name__}


def test_every_class_of_the_module_is_an_elastic_ray_error():
    found = error_classes()
    assert len(found) >= 25, sorted(found)
    assert [n for n, cls in found.items() if not issubclass(cls, errors.ElasticRayError)] == []
    # Nothing but exceptions is defined there, besides the private protocol SshError reads and
    # the enum of SlurmAllocationEnded.allocation_state.
    others = [name for name, obj in vars(errors).items() if isinstance(obj, type) and obj.__module__ == errors.__name__
              and name not in found]
    assert sorted(others) == ["AllocationState", "_SshLogin"]


@pytest.mark.parametrize("name, bases", [
    ("ConfigError", (ValueError,)),
    ("SessionFileError", (errors.ConfigError, ValueError)),
    ("NewerProtocolError", (ValueError,)),
    ("WaitTimeout", (TimeoutError, OSError)),
    ("ControlTimeout", (errors.ControlError, TimeoutError)),
    ("CorruptFileError", (errors.SessionDirError,)),
    ("SlurmStepDrained", (errors.SlurmAllocationEnded,)),
])
def test_the_extra_bases_are_kept(name, bases):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.ElasticRayError)
    for base in bases:
        assert issubclass(cls, base), f"{name} is no longer a {base.__name__}"


# Where each error was defined before it moved to errors.py; code and tests import it from there.
OLD_HOMES = [
    ("elastic_ray.coordinator.drivers", "PayloadFailed"),
    ("elastic_ray.config.session_file", "SessionFileError"),
    ("elastic_ray.protocol.disk.records", "NewerProtocolError"),
    ("elastic_ray.protocol.wire.channel", "ControlError"),
    ("elastic_ray.protocol.wire.channel", "ControlTimeout"),
    ("elastic_ray.protocol.wire.frames", "FrameRejected"),
    ("elastic_ray.protocol.wire.curve", "CurveUnavailable"),
    ("elastic_ray.agent.node.gcs", "ProbeError"),
    ("elastic_ray.agent.node.node_address", "NodeAddressError"),
    ("elastic_ray.remote.ssh", "SshError"),
    ("elastic_ray.remote.wire", "RemoteError"),
    ("elastic_ray.remote.wire", "RemoteVersionMismatch"),
    ("elastic_ray.remote.wire", "RemoteSetupError"),
    ("elastic_ray.remote.wire", "ProtocolError"),
    ("elastic_ray.polling", "WaitTimeout"),
]


@pytest.mark.parametrize("module, name", OLD_HOMES, ids=lambda v: v.rsplit(".", 1)[-1])
def test_the_old_import_location_gives_the_same_class(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_every_moved_class_is_in_the_old_homes_table():
    first = {"ElasticRayError", "ConfigError", "SchedulerError", "SessionDirError", "CorruptFileError",
             "TeardownIncomplete", "UnsafePathError", "AllocationFailed", "SlurmAllocationEnded", "SlurmStepDrained"}
    assert set(error_classes()) == first | {name for _, name in OLD_HOMES}


TARGET = SshTarget(host="login.example.org", user="alice", port=2222)

# (error, its message, its attributes): what each constructor made before the move.
MADE = [
    (errors.PayloadFailed(3, ["python", "x.py"]), "payload 'python x.py' exited with 3",
     {"returncode": 3, "step_state": None, "step": None}),
    (errors.SessionFileError("s.toml", "head.mem", "lots", "must be a memory size"),
     "s.toml: head.mem: must be a memory size",
     {"file": "s.toml", "field": "head.mem", "value": "lots", "reason": "must be a memory size"}),
    (errors.SessionFileError(Path("/s.toml"), "", None, "not TOML"), "/s.toml: not TOML", {"file": "/s.toml"}),
    (errors.NewerProtocolError("protocol_version 9"), "protocol_version 9", {}),
    (errors.WaitTimeout("head ready", 30.0, "PENDING"),
     "timed out after 30 s waiting for head ready; last seen: 'PENDING'",
     {"what": "head ready", "timeout": 30.0, "last": "PENDING"}),
    (errors.ControlError("drain to tcp://h:1: reply refused"), "drain to tcp://h:1: reply refused", {}),
    (errors.ControlTimeout("drain to tcp://h:1: no reply within 3 s"), "drain to tcp://h:1: no reply within 3 s", {}),
    (errors.FrameRejected("skew", "timestamp off by +41.3 s"), "skew: timestamp off by +41.3 s",
     {"reason": "skew", "detail": "timestamp off by +41.3 s"}),
    (errors.FrameRejected("bad_tag"), "bad_tag", {"reason": "bad_tag", "detail": ""}),
    (errors.CurveUnavailable("no CURVE"), "no CURVE", {}),
    (errors.ProbeError("drain", "timeout", "killed after 5 s", returncode=-9, stderr_tail="  boom\n"),
     "gcs probe drain: timeout: killed after 5 s; stderr: boom",
     {"op": "drain", "kind": "timeout", "returncode": -9, "stderr_tail": "  boom\n"}),
    (errors.NodeAddressError("node n1: no address"), "node n1: no address", {}),
    (errors.SshError(TARGET, ["python", "-m", "x"], 255, "hello\nPermission denied (publickey).\n"),
     "ssh to alice@login.example.org port 2222 failed (exit 255) running 'python -m x': "
     "Permission denied (publickey).",
     {"host": "login.example.org", "user": "alice", "command": ("python", "-m", "x"), "returncode": 255,
      "stderr": "hello\nPermission denied (publickey)."}),
    (errors.SshError(SshTarget(host="h"), ["true"], None, ""), "ssh to h failed (exit None) running 'true': no message",
     {"host": "h", "user": None}),
    (errors.RemoteError("KeyError", "'x'", "Traceback ..."), "KeyError on the cluster side: 'x'",
     {"type_name": "KeyError", "traceback": "Traceback ..."}),
    (errors.RemoteVersionMismatch("0.1.0", "0.2.0", "/opt/py"),
     "elastic-ray 0.1.0 here but 0.2.0 on the cluster side (/opt/py); install the same version in both places",
     {"client_version": "0.1.0", "cluster_version": "0.2.0", "remote_python": "/opt/py"}),
    (errors.RemoteSetupError("no python"), "no python", {}),
    (errors.ProtocolError("not an event"), "not an event", {}),
]


@pytest.mark.parametrize("exc, message, attrs", MADE, ids=lambda v: type(v).__name__ if isinstance(v, Exception) else None)
def test_the_moved_constructors_make_what_they_made(exc, message, attrs):
    assert str(exc) == message
    assert {k: getattr(exc, k) for k in attrs} == attrs


# The constructors' parameters, as they were where each class was first defined.
SIGNATURES = {
    # Keyword-only additions since (issue 25: how the driver's step ended) leave every old call valid.
    "PayloadFailed": "(returncode, argv, *, step_state=None, step=None)",
    "SessionFileError": "(file, field, value, reason)",
    "WaitTimeout": "(what, timeout, last)",
    "FrameRejected": "(reason, detail='')",
    "ProbeError": "(op, kind, message, *, returncode=None, stderr_tail='')",
    "SshError": "(target, command, returncode, stderr)",
    "RemoteError": "(type_name, message, traceback='')",
    "RemoteVersionMismatch": "(client_version, cluster_version, remote_python='')",
}


@pytest.mark.parametrize("name, expected", sorted(SIGNATURES.items()))
def test_the_moved_constructors_take_the_same_parameters(name, expected):
    params = inspect.signature(getattr(errors, name)).parameters.values()
    shown = str(inspect.Signature([p.replace(annotation=inspect.Parameter.empty) for p in params]))
    assert shown == expected


# What ``from elastic_ray import ...`` gives: the errors a program catches,
# each named in the user docs; the rest stay in elastic_ray.errors.
EXPORTED_ERRORS = {
    "ElasticRayError", "ConfigError", "SchedulerError", "SessionDirError", "CorruptFileError",
    "TeardownIncomplete", "AllocationFailed", "SlurmAllocationEnded", "SlurmStepDrained", "PayloadFailed",
    "ControlError", "ControlTimeout",
    "SshError", "RemoteError", "RemoteVersionMismatch", "RemoteSetupError", "ProtocolError",
}


def _docs_text(skip: tuple[str, ...] = ()) -> str:
    return "\n".join(p.read_text() for p in sorted(DOCS.rglob("*.md")) if p.relative_to(DOCS).as_posix() not in skip)


def test_the_package_exports_the_documented_errors():
    exported = {n for n in elastic_ray.__all__ if n in error_classes()}
    assert exported == EXPORTED_ERRORS
    assert all(getattr(elastic_ray, n) is getattr(errors, n) for n in exported)
    # Each exported error is named in the docs ...
    everything = _docs_text()
    assert [n for n in sorted(exported) if f"`{n}`" not in everything] == []
    # ... and an error the guides name (outside the API page that lists them all) is exported.
    guides = _docs_text(skip=("api/errors.md",))
    named = {n for n in error_classes() if f"`{n}`" in guides or f"\n{n}: " in guides}
    assert sorted(named - exported) == []


def test_dir_lists_the_lazy_names_and_every_name_of_all_resolves():
    assert set(elastic_ray.__all__) <= set(dir(elastic_ray))
    assert {"Session", "Head", "WorkerAllocation", "RayLauncher", "__version__"} <= set(dir(elastic_ray))
    assert [n for n in elastic_ray.__all__ if getattr(elastic_ray, n, None) is None] == []


def test_importing_the_package_and_listing_it_loads_no_coordinator():
    code = ("import sys, elastic_ray; names = dir(elastic_ray); "
            "assert 'Session' in names; "
            "print([m for m in sys.modules if m.startswith('elastic_ray.coordinator')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_errors_imports_only_the_standard_library():
    """errors.py belongs to no room: every room, the agent first, imports it at no cost."""
    tree = ast.parse((ROOT / "elastic_ray" / "errors.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"errors.py imports from the package (line {node.lineno})"
            imported.add(node.module or "")
    assert imported and [m for m in sorted(imported) if m.split(".")[0] not in sys.stdlib_module_names] == []


def test_allocation_state_names_every_slurm_state_and_every_head_condition():
    from elastic_ray.coordinator.head.election import HeadCondition
    from elastic_ray.errors import AllocationState
    from elastic_ray.scheduler.base import JobState

    wanted = {s.value for s in JobState} | {c.value.upper() for c in HeadCondition} | {"REPLACED", "DRAINING"}
    assert {s.value for s in AllocationState} == wanted


@pytest.mark.parametrize("given, is_enum", [("TIMEOUT", True), ("REPLACED", True), ("DRAINING", True),
                                            ("RESIZING", False)])
def test_allocation_state_is_the_enum_and_still_compares_as_the_string(given, is_enum):
    from elastic_ray.errors import AllocationState, SlurmAllocationEnded

    exc = SlurmAllocationEnded("gone", allocation_state=given, job_id="7")
    assert exc.allocation_state == given and f"{exc.allocation_state}" == given
    assert isinstance(exc.allocation_state, AllocationState) is is_enum
