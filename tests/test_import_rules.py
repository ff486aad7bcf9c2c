"""The import rule between the package's rooms, checked from the source.

Rooms are the first-level packages of ``elastic_ray``. Why the rule exists:
the agent runs on every node of every job and must stay small and
independent of the coordinator; ``protocol`` is the contract both sides
share, so it may depend on neither; the scheduler backends are used by the
coordinator and the CLI and must not call back into them; only
``elastic_ray.dagster`` may import Dagster, so the core installs and runs
without it; and the agent never imports Ray (75 MB of memory per node),
except in the short-lived GCS probe process.

Every import counts: module-level ones, the lazy ones inside functions,
``TYPE_CHECKING`` blocks, and ``importlib.import_module("...")`` /
``__import__("...")`` with a literal name. The checker is a pure function
over ``{relative path: source}`` so that its own tests can show it catches
each kind of violation.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "elastic_ray"

# room -> rooms (or third-party top-level packages) it must never import.
NEVER: Mapping[str, frozenset[str]] = {
    "agent": frozenset({"coordinator", "dagster", "cli", "demo", "ray"}),
    "protocol": frozenset({"agent", "coordinator", "scheduler", "dagster", "cli", "demo", "ray", "history"}),
    "scheduler": frozenset({"agent", "coordinator", "dagster", "cli", "demo", "ray"}),
    "config": frozenset({"agent", "coordinator", "scheduler", "protocol", "dagster", "cli", "demo", "ray",
                         "history"}),
    "coordinator": frozenset({"dagster", "cli", "demo", "remote"}),
    "remote": frozenset({"agent", "dagster", "cli", "demo", "ray"}),
    "cli": frozenset({"dagster"}),
    "demo": frozenset({"dagster"}),
    # The run's history read back from its event log: a reader of protocol's
    # records, used by the CLI and Dagster, acting on nothing of the run.
    "history": frozenset({"agent", "coordinator", "scheduler", "dagster", "cli", "demo", "ray", "remote"}),
    # The autoscaler's decisions (pure) and, later, the demand it reads: the
    # coordinator runs them; they act on nothing themselves.
    "autoscale": frozenset({"agent", "coordinator", "scheduler", "dagster", "cli", "demo", "remote", "history"}),
}
# Every room. The modules outside them (errors, atomic, polling, defaults,
# knobs, ray_auth: "room-free") are what every room may import, so they
# import no room themselves; the package's __init__ is the exception (it
# re-exports the configs).
ROOMS = frozenset(NEVER) | {"dagster", "ray"}
# Third-party packages that only some rooms may import. A demo payload
# speaks Dagster Pipes from inside the driver process (dagster_pipes is a
# small, dependency-free package); nothing else outside ``dagster`` may.
OWNED_THIRD_PARTY: Mapping[str, frozenset[str]] = {
    "dagster": frozenset({"dagster"}),
    "dagster_shared": frozenset({"dagster"}),
    "dagster_pipes": frozenset({"dagster", "demo"}),
    # An optional extra (elastic-ray[timeline]) that only the timeline draws with.
    "matplotlib": frozenset({"history"}),
}
# Files that run as their own process (never imported by their room's code),
# with the third-party packages they may import for that reason.
SEPARATE_PROCESSES: Mapping[str, frozenset[str]] = {
    "agent/node/gcs_probe.py": frozenset({"ray"}),
}


def imported_names(source: str, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """Yield (line, absolute module name) for every import in ``source``.

    ``module`` is the dotted name of the file (``elastic_ray.agent.runner``)
    so relative imports can be resolved.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            yield node.lineno, target
            # ``from elastic_ray import coordinator`` imports a room too.
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield node.lineno, arg.value


def room_of(relative: str) -> str | None:
    parts = Path(relative).parts
    return parts[0] if len(parts) > 1 else None


def violations(sources: Mapping[str, str]) -> list[str]:
    """Every broken rule in a tree given as ``{path relative to elastic_ray/: source}``."""
    found = []
    for relative, source in sorted(sources.items()):
        path = Path(relative)
        is_package = path.name == "__init__.py"
        dotted = ["elastic_ray", *path.parent.parts] + ([] if is_package else [path.stem])
        room = room_of(relative)
        allowed_extra = SEPARATE_PROCESSES.get(relative, frozenset())
        for line, name in imported_names(source, ".".join(dotted), is_package):
            parts = name.split(".")
            if parts[0] == "elastic_ray" and len(parts) > 1:
                target_room = parts[1]
                if room and target_room in NEVER.get(room, ()) and target_room != room:
                    found.append(f"{relative}:{line}: {room} imports {name}")
                elif room is None and relative != "__init__.py" and target_room in ROOMS:
                    found.append(f"{relative}:{line}: a room-free module imports {name}")
            elif parts[0] in OWNED_THIRD_PARTY and room not in OWNED_THIRD_PARTY[parts[0]]:
                owners = " and ".join(sorted(OWNED_THIRD_PARTY[parts[0]]))
                found.append(f"{relative}:{line}: only {owners} may import {parts[0]}")
            elif room and parts[0] in NEVER.get(room, ()) and parts[0] not in allowed_extra:
                found.append(f"{relative}:{line}: {room} imports {name}")
    return found


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}


# The pure modules: decisions only (machines, elections, wakeups, rules,
# plans, parsers, renderings), tested by table. Their effects live in the
# shells that call them, so none of them may touch a socket, a thread, a
# process or the system: they import none of these.
PURE_MODULES: tuple[str, ...] = (
    "agent/machine.py", "agent/wakeups.py", "agent/requests.py",
    "agent/head/hosted.py", "agent/head/head_watch.py",
    "agent/slurm/slurmd_rules.py", "agent/slurm/walltime.py",
    "agent/node/health_check.py", "agent/node/ray_args.py", "agent/node/port_window.py",
    "coordinator/head/election.py", "coordinator/head/standby_retry.py", "coordinator/allocations/ownership.py",
    "protocol/disk/recovery.py", "protocol/disk/paths.py", "protocol/disk/events.py", "protocol/wire/head_status.py",
    "config/allocation.py", "config/queue.py", "config/slurm_values.py",
    "scheduler/states.py", "scheduler/slurm_parse.py",
    "cli/options.py", "cli/render_plan.py", "cli/status_model.py", "cli/status_view.py",
    "dagster/orphans.py", "remote/wire.py", "history/runs.py", "history/usage.py", "history/page.py",
    "config/autoscale.py", "autoscale/shapes.py", "autoscale/records.py", "autoscale/decide.py",
    "autoscale/demand.py", "coordinator/scaling/lease.py", "coordinator/scaling/view.py",
)
EFFECTS = frozenset({"zmq", "psutil", "subprocess", "threading", "socket", "multiprocessing", "asyncio"})


def pure_violations(sources: Mapping[str, str], pure: tuple[str, ...] = PURE_MODULES) -> list[str]:
    """Every import of an effect library by a pure module (direct imports; lazy ones count)."""
    found = []
    for relative in pure:
        if relative not in sources:
            found.append(f"{relative}: listed as pure but not found")
            continue
        path = Path(relative)
        dotted = ".".join(["elastic_ray", *path.parent.parts, path.stem])
        for line, name in imported_names(sources[relative], dotted, False):
            if name.split(".")[0] in EFFECTS:
                found.append(f"{relative}:{line}: a pure module imports {name}")
    return found


def test_the_pure_modules_import_no_effects():
    broken = pure_violations(package_sources())
    assert not broken, "pure modules with effects:\n" + "\n".join(broken)


@pytest.mark.parametrize("source", ["import zmq\n", "def f():\n    import subprocess\n", "from threading import Lock\n",
                                    "import psutil\n", "from socket import socket\n"])
def test_the_pure_check_catches_an_effect_import(source):
    assert pure_violations({"agent/machine.py": source}, ("agent/machine.py",))


def test_the_package_keeps_the_import_rule():
    broken = violations(package_sources())
    assert not broken, "import rule broken:\n" + "\n".join(broken)


@pytest.mark.parametrize("relative, source, expected", [
    ("agent/runner.py", "from ..coordinator import session\n", "agent imports elastic_ray.coordinator"),
    ("agent/runner.py", "def f():\n    from elastic_ray.coordinator.session import Session\n",
     "agent imports elastic_ray.coordinator.session"),
    ("agent/runner.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..coordinator import x\n",
     "agent imports elastic_ray.coordinator"),
    ("agent/runner.py", "import importlib\nm = importlib.import_module('elastic_ray.coordinator.session')\n",
     "agent imports elastic_ray.coordinator.session"),
    ("agent/runner.py", "from elastic_ray import coordinator\n", "agent imports elastic_ray.coordinator"),
    ("agent/runner.py", "def f():\n    import ray\n", "agent imports ray"),
    ("protocol/disk/records.py", "from ...scheduler.base import JobState\n", "protocol imports elastic_ray.scheduler"),
    ("protocol/disk/records.py", "from ...agent import machine\n", "protocol imports elastic_ray.agent"),
    ("scheduler/slurm.py", "from ..coordinator import election\n", "scheduler imports elastic_ray.coordinator"),
    ("scheduler/local/job.py", "from ...agent import runner\n", "scheduler imports elastic_ray.agent"),
    ("coordinator/session.py", "import dagster\n", "only dagster may import dagster"),
    ("coordinator/session.py", "from ..dagster import x\n", "coordinator imports elastic_ray.dagster"),
    ("errors.py", "import dagster_pipes\n", "only dagster and demo may import dagster_pipes"),
    ("demo/payload.py", "import dagster\n", "only dagster may import dagster"),
    ("config/allocation.py", "from ..protocol.records import is_job_id\n", "config imports elastic_ray.protocol"),
    ("knobs.py", "from .agent.node import simulation\n", "a room-free module imports elastic_ray.agent.node"),
    ("defaults.py", "def f():\n    from elastic_ray.config import allocation\n", "a room-free module imports elastic_ray.config"),
    ("history/runs.py", "from ..coordinator.session import Session\n", "history imports elastic_ray.coordinator"),
    ("history/timeline.py", "from ..scheduler.base import JobState\n", "history imports elastic_ray.scheduler"),
    ("protocol/disk/event_log.py", "from ...history import runs\n", "protocol imports elastic_ray.history"),
    ("cli/history.py", "import matplotlib\n", "only history may import matplotlib"),
])
def test_the_checker_catches_each_kind_of_violation(relative, source, expected):
    found = violations({relative: source})
    assert any(expected in v for v in found), found


@pytest.mark.parametrize("relative, source", [
    ("coordinator/session.py", "from ..agent import ray_args\nfrom ..scheduler.base import JobState\n"),
    ("agent/runner.py", "from ..protocol.records import HeadEndpoint\nfrom ..config import RayLauncher\n"),
    ("agent/node/gcs_probe.py", "def f():\n    import ray\n"),
    ("dagster/compute.py", "import dagster\nfrom ..coordinator.session import Session\n"),
    ("agent/machine.py", "from .ray_args import build_ray_start\n"),
    ("demo/pipes_payload.py", "from dagster_pipes import open_dagster_pipes\n"),
    ("knobs.py", "from . import defaults\nfrom .errors import ConfigError\n"),
    ("agent/slurm/slurmd_watch.py", "from ... import knobs\n"),
    ("__init__.py", "from .config import SlurmRunAllocationConfig\n"),
    ("history/runs.py", "from ..protocol.disk.events import Event\nfrom ..config import RayLauncher\n"),
    ("history/timeline.py", "def f():\n    import matplotlib\n"),
    ("cli/history.py", "from ..history.runs import build\n"),
    ("dagster/compute.py", "from ..history.usage import usage\n"),
])
def test_the_checker_accepts_what_the_rule_allows(relative, source):
    assert violations({relative: source}) == []


# A module's underscore names are its own: another module that needs one
# asks for it to be made public (as ``atomic.fsync_dir`` was). Otherwise a
# private helper grows callers its owner does not know of, and the module's
# invariants (``SessionDir``'s generation files were the case) leak out.
# Counted: ``from X import _y`` where X is another module of the package (or
# ``from pkg import _module``), and ``m._y`` where ``m`` names a module of the
# package imported in the file, and ``p._y`` where ``p`` is a parameter
# annotated with a class imported from another module of the package
# (``allocation_repair`` once drove ``sd: "SessionDir"``'s ``sd._commit``).
# Other attributes of objects (``self._x``, another instance of one's own
# class) are the class's business, not checked here.

def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_names(sources: Mapping[str, str]) -> set[str]:
    names = set()
    for relative in sources:
        path = Path(relative)
        parts = ["elastic_ray", *path.parent.parts] + ([] if path.name == "__init__.py" else [path.stem])
        names.add(".".join(parts))
    return names


def private_imports(sources: Mapping[str, str]) -> list[str]:
    """Every use of another module's private name in a tree given as ``{path relative to elastic_ray/: source}``."""
    modules = _module_names(sources)
    found = []
    for relative, source in sorted(sources.items()):
        path = Path(relative)
        is_package = path.name == "__init__.py"
        dotted = ["elastic_ray", *path.parent.parts] + ([] if is_package else [path.stem])
        own = ".".join(dotted)
        package = dotted if is_package else dotted[:-1]
        tree = ast.parse(source)
        bound: dict[str, str] = {}     # a name in this file -> the package module it stands for
        classes: dict[str, str] = {}   # a name imported from another package module -> that module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{target}.{alias.name}"
                    elif target in modules and target != own:
                        classes[alias.asname or alias.name] = target
                    if _is_private(alias.name) and target.split(".")[0] == "elastic_ray" and target != own:
                        found.append(f"{relative}:{node.lineno}: imports {alias.name} from {target}")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and _is_private(node.attr) and isinstance(node.value, ast.Name)
                    and node.value.id in bound and bound[node.value.id] != own):
                found.append(f"{relative}:{node.lineno}: uses {node.attr} of {bound[node.value.id]}")
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                typed = {a.arg: _annotation_name(a.annotation)
                         for a in [*args.posonlyargs, *args.args, *args.kwonlyargs] if a.annotation is not None}
                foreign = {name: classes[kind] for name, kind in typed.items() if kind in classes}
                for inner in ast.walk(node):
                    if (isinstance(inner, ast.Attribute) and _is_private(inner.attr)
                            and isinstance(inner.value, ast.Name) and inner.value.id in foreign):
                        found.append(f"{relative}:{inner.lineno}: uses {inner.attr} of a "
                                     f"{typed[inner.value.id]} ({foreign[inner.value.id]})")
    return found


def _annotation_name(annotation: ast.expr) -> str | None:
    """``SessionDir`` for ``SessionDir``, ``"SessionDir"`` and ``SessionDir | None``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    if isinstance(annotation, ast.BinOp):
        return _annotation_name(annotation.left) or _annotation_name(annotation.right)
    return annotation.id if isinstance(annotation, ast.Name) else None


def test_no_module_uses_another_module_s_private_names():
    broken = private_imports(package_sources())
    assert not broken, "private names used across modules:\n" + "\n".join(broken)


@pytest.mark.parametrize("relative, source, expected", [
    ("protocol/disk/session_dir.py", "from ...atomic import _fsync_dir\n",
     "imports _fsync_dir from elastic_ray.atomic"),
    ("protocol/disk/session_dir.py", "def f():\n    from elastic_ray.atomic import _naming\n",
     "imports _naming from elastic_ray.atomic"),
    ("agent/node/node_address.py", "from .ray_args import check_ip, _check_ip as ok\n",
     "imports _check_ip from elastic_ray.agent.node.ray_args"),
    ("protocol/disk/allocation_repair.py", "from . import session_dir\nsession_dir._flock\n",
     "uses _flock of elastic_ray.protocol.disk.session_dir"),
    ("cli/create.py", "from elastic_ray.cli import output as out\nout._err()\n", "uses _err of elastic_ray.cli.output"),
    ("cli/create.py", "import elastic_ray.cli.output as out\nout._err()\n", "uses _err of elastic_ray.cli.output"),
    ("cli/create.py", "from . import _helpers\n", "imports _helpers from elastic_ray.cli"),
    ("protocol/disk/allocation_repair.py",
     "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .session_dir import SessionDir\n"
     "def gather(sd: \"SessionDir\") -> None:\n    sd._generations()\n",
     "uses _generations of a SessionDir (elastic_ray.protocol.disk.session_dir)"),
])
def test_the_private_check_catches_each_kind(relative, source, expected):
    sources = {relative: source, "atomic.py": "", "protocol/disk/session_dir.py": "", "cli/output.py": "",
               "agent/node/ray_args.py": "", "cli/__init__.py": ""}
    sources[relative] = source
    found = private_imports(sources)
    assert any(expected in v for v in found), found


@pytest.mark.parametrize("source", [
    "from __future__ import annotations\n",
    "from . import __version__\n",
    "from .output import err_console\n",
    "class A:\n    def f(self, other):\n        return self._x, other._x\n",
    "import os\nos._exit(0)\n",
    "from . import output\noutput.__name__\n",
])
def test_the_private_check_accepts_what_the_rule_allows(source):
    assert private_imports({"cli/create.py": source, "cli/output.py": "", "cli/__init__.py": ""}) == []


# The core must import (and so install and run) without Dagster: the agent,
# the coordinator, the CLI and the payload helpers, with every Dagster
# package blocked from importing.
BLOCK_DAGSTER = r'''
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("dagster", "dagster_pipes", "dagster_shared"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, Block())
try:
    import dagster
except ImportError:
    pass
else:
    raise SystemExit("the blocker did not block")
import elastic_ray, elastic_ray.coordinator.session, elastic_ray.agent.runner, elastic_ray.cli.main
import elastic_ray.config.queue, elastic_ray.ray, elastic_ray.demo.main_demo
assert not [m for m in sys.modules if m.split(".")[0] == "dagster"]
print("core ok")
'''


def test_the_core_imports_without_dagster():
    out = subprocess.run([sys.executable, "-c", BLOCK_DAGSTER], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "core ok" in out.stdout, out.stderr[-2000:]
