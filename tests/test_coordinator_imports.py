"""No import cycle inside the coordinator.

``session`` drives ``supervise`` and ``drivers``; those two see a session only
through the protocols in ``ports``. Every import statement counts here, also
one inside a function or under ``if TYPE_CHECKING:``, because a lazy import
back into ``session`` is the same cycle, merely postponed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from elastic_ray import coordinator

PACKAGE = "elastic_ray.coordinator"
ROOT = Path(coordinator.__file__).parent


def _dotted(path: Path) -> str:
    """The module name of a file under the coordinator, relative to it (``head.supervise``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(path: Path) -> list[str]:
    """The absolute package a file's relative imports start from."""
    parts = PACKAGE.split(".") + list(path.relative_to(ROOT).parent.parts)
    return parts


MODULES = {_dotted(p) for p in ROOT.rglob("*.py") if p.name != "__init__.py"}


def _imports(path: Path, package: list[str] | None = None) -> set[str]:
    """Every coordinator module that ``path`` imports, anywhere in the file."""
    package = package if package is not None else _package_of(path)
    out: set[str] = set()
    own = _dotted(path) if path.is_relative_to(ROOT) else path.stem
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # "from . import election" names a module too
            names = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name.startswith(PACKAGE + "."):
                short = name[len(PACKAGE) + 1:]
                if short in MODULES and short != own:
                    out.add(short)
    return out


def _graph() -> dict[str, set[str]]:
    return {_dotted(path): _imports(path) for path in sorted(ROOT.rglob("*.py")) if path.name != "__init__.py"}


def test_the_walker_sees_imports_inside_functions_and_type_checking(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .session import Session\n"
                     "def f():\n    from .head import election\n    import elastic_ray.coordinator.drivers\n")
    assert _imports(probe, PACKAGE.split(".")) == {"session", "head.election", "drivers"}


def test_supervisor_and_drivers_do_not_import_the_session():
    graph = _graph()
    assert "session" not in graph["head.supervise"], graph["head.supervise"]
    assert "session" not in graph["drivers"], graph["drivers"]


def test_no_import_cycle_among_coordinator_modules():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)


def test_a_session_provides_what_the_ports_ask_for(tmp_path):
    """The protocols are structural: nothing checks them at run time, so this does."""
    import inspect

    from elastic_ray.coordinator.ports import DriverSession, ElectingSession, SupervisedSession
    from elastic_ray.coordinator.session import Session
    from elastic_ray.protocol.disk.records import SessionInfo
    from elastic_ray.protocol.disk.session_dir import SessionDir

    info = SessionInfo(session_id="s-1", job_name="er-test", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu", "time_limit": "60"})
    session = Session(SessionDir.create(tmp_path / "sess", info), scheduler=object())  # type: ignore[arg-type]
    for port in (SupervisedSession, DriverSession, ElectingSession):
        members = [name for name in vars(port) if not name.startswith("_")]
        for base in port.__mro__[1:]:
            members += [name for name in vars(base) if not name.startswith("_") and base.__name__ != "Protocol"
                        and base is not object and base.__module__ == port.__module__]
        assert members, port
        for name in members:
            assert hasattr(session, name), f"Session lacks {port.__name__}.{name}"
            wanted = getattr(port, name)
            if inspect.isfunction(wanted):
                got = inspect.signature(getattr(Session, name))
                assert list(got.parameters) == list(inspect.signature(wanted).parameters), name
