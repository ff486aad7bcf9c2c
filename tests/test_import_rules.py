"""The import rule between the rooms of elastic_ray, and the core without Dagster.

agent never imports coordinator or dagster; protocol imports none of agent,
coordinator, scheduler or dagster; scheduler imports neither agent nor
coordinator; only elastic_ray/dagster imports the ``dagster`` packages.
Checked on the source (every import statement, also inside functions).
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "elastic_ray"
FORBIDDEN = {
    "agent": {"coordinator", "dagster"},
    "protocol": {"agent", "coordinator", "scheduler", "dagster"},
    "scheduler": {"agent", "coordinator"},
}


def imports_of(path: Path) -> list[str]:
    """Absolute module names imported by ``path`` (relative imports resolved)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.append(module)
            out += [f"{module}.{alias.name}" for alias in node.names]
    return out


def room_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "elastic_ray" else None


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_import_rule(path):
    room = path.relative_to(PACKAGE).parts[0] if len(path.relative_to(PACKAGE).parts) > 1 else None
    for module in imports_of(path):
        target = room_of(module)
        assert target not in FORBIDDEN.get(room or "", set()), f"{path}: {room} must not import {module}"
        top = module.split(".")[0]
        if top in ("dagster", "dagster_pipes", "dagster_shared"):
            assert room in ("dagster", "demo"), f"{path}: only elastic_ray/dagster imports {top}"
            if room == "demo":  # a payload speaks Pipes in the driver only
                assert top == "dagster_pipes", f"{path}: a demo payload may use dagster_pipes only"


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
import elastic_ray.config.queue, elastic_ray.ray
assert not [m for m in sys.modules if m.split(".")[0] == "dagster"]
print("core ok")
'''


def test_core_imports_without_dagster():
    out = subprocess.run([sys.executable, "-c", BLOCK_DAGSTER], capture_output=True, text=True)
    assert out.returncode == 0 and "core ok" in out.stdout, out.stderr[-2000:]
