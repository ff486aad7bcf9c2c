"""What a user gets from ``pip install``: one version, the licence, the type
marker, the batch templates and dependency ranges that match what we test.

The wheel is built from a copy of the sources so the check sees what setuptools
really ships (package data is easy to lose when the package list changes) and
leaves no build/ or egg-info behind in the checkout.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import elastic_ray

try:  # Python 3.11+
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _literal_version() -> str:
    """``__version__`` as written in the source: a plain string literal, so
    setuptools reads it without importing the package."""
    tree = ast.parse((ROOT / "elastic_ray" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str), \
                "__version__ must be a string literal"
            return node.value.value
    raise AssertionError("elastic_ray/__init__.py assigns no __version__")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("elastic_ray", "sbatch_templates"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
                           "-q", "-w", str(out), str(src)], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    (path,) = out.glob("elastic_ray-*.whl")
    return zipfile.ZipFile(path)


def _metadata(wheel: zipfile.ZipFile):
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return Parser().parsestr(wheel.read(name).decode())


def test_the_version_has_one_source():
    assert "version" not in PYPROJECT["project"], "pyproject.toml states a version of its own"
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "elastic_ray.__version__"}
    assert _literal_version() == elastic_ray.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?", elastic_ray.__version__)


def test_the_wheel_has_the_package_version(wheel):
    meta = _metadata(wheel)
    assert meta["Name"] == "elastic-ray"
    assert meta["Version"] == elastic_ray.__version__
    assert meta["License-Expression"] == "Apache-2.0"


def test_the_wheel_ships_py_typed_the_license_and_the_templates(wheel):
    names = set(wheel.namelist())
    assert "elastic_ray/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    templates = {Path(n).name for n in names if n.startswith("elastic_ray/sbatch_templates/")}
    assert templates >= {p.name for p in (ROOT / "sbatch_templates").glob("*.sbatch")} and templates
    assert not [n for n in names if n.startswith(("tests/", "integration/", "bench/"))]


def test_the_wheel_ships_every_module_of_the_source_tree(wheel):
    """The package list in pyproject.toml is kept by hand: a new room must not be left out."""
    names = set(wheel.namelist())
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "elastic_ray").rglob("*.py")
              if "__pycache__" not in p.parts}
    assert source and not sorted(source - names), f"missing from the wheel: {sorted(source - names)}"


def test_the_wheel_bounds_ray_from_above(wheel):
    """Private Ray APIs are used: an untested newer Ray must not be picked up."""
    ray = [r for r in _metadata(wheel).get_all("Requires-Dist") if re.match(r"ray\b", r)]
    assert len(ray) == 1 and "<" in ray[0] and ">=" in ray[0], ray


def _lower_bounds() -> dict[str, str]:
    """``name -> lowest version`` of every declared dependency, the extras a
    user installs included (``docs`` is the site's build tooling, pinned in
    scripts/constraints.txt, not something the package runs with)."""
    reqs = list(PYPROJECT["project"]["dependencies"])
    for name, extra in PYPROJECT["project"]["optional-dependencies"].items():
        if name != "docs":
            reqs += extra
    bounds = {}
    for req in reqs:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)", req)
        assert match, req
        name, spec = match.group(1).lower(), match.group(2)
        low = re.search(r">=\s*([0-9][0-9.]*)", spec)
        assert low, f"{req!r} has no lower bound"
        bounds[name] = low.group(1)
    return bounds


def test_the_lowest_constraints_pin_every_declared_lower_bound():
    """scripts/constraints-lowest.txt is what ``scripts/matrix --lowest`` installs;
    it must test exactly the floors pyproject.toml claims."""
    pins = {}
    for line in (ROOT / "scripts" / "constraints-lowest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = version.strip()

    def same(a: str, b: str) -> bool:
        pad = lambda v: [int(x) for x in v.split(".")] + [0] * (4 - len(v.split(".")))  # noqa: E731
        return pad(a) == pad(b)

    bounds = _lower_bounds()
    assert set(bounds) <= set(pins), f"not pinned in constraints-lowest.txt: {sorted(set(bounds) - set(pins))}"
    wrong = {n: (pins[n], low) for n, low in bounds.items() if not same(pins[n], low)}
    assert not wrong, f"constraints-lowest.txt pin != pyproject lower bound: {wrong}"
