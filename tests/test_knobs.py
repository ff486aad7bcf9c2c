"""The environment registry (elastic_ray.knobs) and the default times (elastic_ray.defaults).

Three promises are held from the source: no module under ``elastic_ray/``
spells an ``ELASTIC_*`` name outside the registry (so a new variable cannot
be read without a record), every record is listed in docs/settings.md with
its default, and every default time is listed there with its value. The
checker is a pure function over ``{relative path: source}`` so its own tests
show what it catches.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import click
import pytest

from elastic_ray import defaults, knobs
from elastic_ray.agent.cli import run as agent_run
from elastic_ray.agent.options import AgentOptions
from elastic_ray.errors import ConfigError

PACKAGE = Path(__file__).resolve().parent.parent / "elastic_ray"
SETTINGS_PAGE = PACKAGE.parent / "docs" / "settings.md"
REGISTRY_FILE = "knobs.py"
_NAME = re.compile(r"ELASTIC_[A-Z0-9_]*")


# ---------------------------------------------------------------- no ELASTIC_* name outside the registry

def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelled_names(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) for every string in ``source`` that names an ELASTIC_* variable
    as code would use it: a whole string constant (``os.environ.get("ELASTIC_X")``,
    ``envvar="ELASTIC_X"``, ``X_ENV = "ELASTIC_X"``, a prefix ``"ELASTIC_AGENT_"``),
    or the start of an f-string or a concatenation (``f"ELASTIC_{x}"``).
    Prose that mentions a name (docstrings, messages) is not code and passes."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if _NAME.fullmatch(node.value):
                yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and isinstance(head.value, str) and head.value.startswith("ELASTIC_"):
                yield node.lineno, head.value
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            left = node.left
            if isinstance(left, ast.Constant) and isinstance(left.value, str) and left.value.startswith("ELASTIC_"):
                yield node.lineno, left.value


def unregistered_reads(sources: Mapping[str, str]) -> list[str]:
    return [f"{relative}:{line}: {text!r} (use the record in elastic_ray/knobs.py)"
            for relative, source in sorted(sources.items()) if relative != REGISTRY_FILE
            for line, text in spelled_names(source)]


def package_sources() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")}


def test_no_module_spells_an_elastic_variable_outside_the_registry():
    found = unregistered_reads(package_sources())
    assert not found, "ELASTIC_* names outside the registry:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    'import os\nx = os.environ.get("ELASTIC_RAY_NEW")\n',
    'import os\nx = os.getenv("ELASTIC_AGENT_NEW", "1")\n',
    'import os\nx = os.environ["ELASTIC_RAY_NEW"]\n',
    'def f(environ):\n    return environ.get("ELASTIC_RAY_NEW", "").strip()\n',
    'import click\nopt = click.option("--x", envvar="ELASTIC_AGENT_X")\n',
    'NEW_ENV = "ELASTIC_RAY_NEW"\n',
    'import os\nmine = [k for k in os.environ if k.startswith("ELASTIC_AGENT_")]\n',
    'import os\ndef f(x):\n    return os.environ.get(f"ELASTIC_RAY_{x}")\n',
    'import os\ndef f(x):\n    return os.environ.get("ELASTIC_RAY_" + x)\n',
    'env = {"ELASTIC_RAY_SESSION": "/x"}\n',
])
def test_the_check_catches_each_way_of_spelling_a_name(source):
    assert unregistered_reads({"coordinator/new.py": source})


@pytest.mark.parametrize("source", [
    '"""Set ELASTIC_RAY_SCHEDULER=slurm to choose."""\n',
    'def f():\n    """Reads ``ELASTIC_AGENT_X``."""\n',
    'MSG = "set ELASTIC_RAY_SESSION or pass DIR"\n',
    'from .. import knobs\nx = knobs.SESSION.read()\n',
])
def test_the_check_lets_prose_and_the_registry_pass(source):
    assert unregistered_reads({"coordinator/new.py": source}) == []
    assert unregistered_reads({REGISTRY_FILE: 'X = "ELASTIC_RAY_X"\n'}) == []


# ---------------------------------------------------------------- the records

def _records() -> dict[str, knobs.Knob]:
    """Python name -> record, for every record of the module."""
    return {attr: value for attr, value in vars(knobs).items() if isinstance(value, knobs.Knob)}


def test_every_record_is_registered_once_with_what_it_does():
    records = _records()
    assert sorted(k.name for k in records.values()) == sorted(knobs.REGISTRY)
    for knob in records.values():
        assert knob.name.startswith(("ELASTIC_RAY_", "ELASTIC_AGENT_")), knob.name
        assert knob.type and knob.does, knob.name
        assert knob.read_by or knob.set_by, f"{knob.name}: who reads or sets it?"


def test_the_modules_a_record_names_use_it():
    for attr, knob in _records().items():
        for relative in knob.read_by + knob.set_by:
            path = PACKAGE / relative
            assert path.is_file(), f"{knob.name}: {relative} does not exist"
            assert re.search(rf"\bknobs\.{attr}\b", path.read_text()), f"{knob.name}: {relative} does not use knobs.{attr}"


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        knobs._knob(knobs.SCHEDULER.name, "x", None, "x", ("x.py",), str)


def test_unset_and_blank_mean_the_default():
    for knob in knobs.REGISTRY.values():
        assert knob.read({}) == knob.default
        assert knob.read({knob.name: "  "}) == knob.default
        assert not knob.is_set({knob.name: ""}) and knob.is_set({knob.name: "x"})


def test_value_is_read_for_a_knob_with_a_default():
    assert knobs.DETACHED_IDLE_INTERVAL.value({}) == defaults.DETACHED_IDLE_INTERVAL
    assert knobs.DETACHED_IDLE_INTERVAL.value({knobs.DETACHED_IDLE_INTERVAL.name: "0"}) == 0.0   # not the default
    with pytest.raises(TypeError, match=knobs.SESSION.name):
        knobs.SESSION.value({})


@pytest.mark.parametrize("knob, text, value", [
    (knobs.SCHEDULER, " slurm ", "slurm"),
    (knobs.SESSION, "/runs/a b", "/runs/a b"),
    (knobs.SESSION_ROOT, " /scratch/s ", "/scratch/s"),
    (knobs.SHARED_ANSWERS, "0", False),
    (knobs.SHARED_ANSWERS, "OFF", False),
    (knobs.SHARED_ANSWERS, "1", True),
    (knobs.SHARED_ANSWERS, "anything", True),
    (knobs.DETACHED_IDLE_INTERVAL, "1", 1.0),
    (knobs.REMOTE_LOG, "DEBUG", "DEBUG"),
    (knobs.GCS_PROBE, "python3 '/a b/probe.py'", ["python3", "/a b/probe.py"]),
    (knobs.PAYLOAD_UNIT_SECONDS, "0", 0.0),
    (knobs.POLL_INTERVAL, "0.5", 0.5),
    (knobs.REJOIN_ORDER, "all", "all"),
    (knobs.SLURMD_CHECK, "0", 0.0),
    (knobs.SLURMD_CHECK, "15", 15.0),
    (knobs.SLURMD_PORT, "7002", 7002),
    (knobs.HEALTH_CHECK_FAILURE_THRESHOLD, "6", 6),
])
def test_a_good_value_is_read(knob, text, value):
    assert knob.read({knob.name: text}) == value


@pytest.mark.parametrize("knob, text", [
    (knobs.SCHEDULER, "pbs"),
    (knobs.DETACHED_IDLE_INTERVAL, "soon"),
    (knobs.DETACHED_IDLE_INTERVAL, "-1"),
    (knobs.REMOTE_LOG, "LOUD"),
    (knobs.GCS_PROBE, "python 'unclosed"),
    (knobs.PAYLOAD_UNIT_SECONDS, "-0.1"),
    (knobs.POLL_INTERVAL, "0.01"),
    (knobs.REJOIN_ORDER, "random"),
    (knobs.SLURMD_CHECK, "0.5"),
    (knobs.SLURMD_PORT, "70000"),
    (knobs.HEALTH_CHECK_PERIOD_MS, "1.5"),
    (knobs.HEALTH_CHECK_TIMEOUT_MS, "10"),
])
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(knob, text):
    with pytest.raises(knobs.KnobError) as caught:
        knob.read({knob.name: text})
    assert isinstance(caught.value, ConfigError) and isinstance(caught.value, ValueError)
    assert caught.value.field == knob.name and caught.value.value == text.strip()
    assert str(caught.value).startswith(f"{knob.name}={text.strip()!r}: ")


def test_the_agent_knobs_are_forwarded_as_set_and_nothing_else():
    environ = {"ELASTIC_AGENT_POLL_INTERVAL": "0.5", "ELASTIC_AGENT_SOMETHING_NEW": "x",
               "ELASTIC_RAY_SCHEDULER": "local", "PATH": "/bin"}
    assert knobs.forwarded_agent_env(environ) == {"ELASTIC_AGENT_POLL_INTERVAL": "0.5",
                                                  "ELASTIC_AGENT_SOMETHING_NEW": "x"}


def test_the_agent_command_line_takes_its_knobs_and_defaults_from_the_registry():
    """`elastic-agent run` and AgentOptions had the agent's defaults each; now both import them."""
    options = {p.name: p for p in agent_run.params}
    for param, knob in [("poll_interval", knobs.POLL_INTERVAL), ("head_lost_after", knobs.HEAD_LOST_AFTER),
                        ("backoff_base", knobs.BACKOFF_BASE), ("start_timeout", knobs.START_TIMEOUT),
                        ("head_drain_lead", knobs.HEAD_DRAIN_LEAD), ("rejoin_order", knobs.REJOIN_ORDER)]:
        option = options[param]
        assert option.envvar == knob.name and option.default == knob.default
        assert AgentOptions.__dataclass_fields__[param].default == knob.default
        if isinstance(option.type, click.FloatRange):
            assert option.type.min == knob.minimum
        else:
            assert tuple(option.type.choices) == knob.choices


# ---------------------------------------------------------------- docs/settings.md

def _table_rows(prefix: str) -> dict[str, list[str]]:
    """The settings page's table rows whose first cell starts with `prefix`: name -> cells."""
    rows = {}
    for line in SETTINGS_PAGE.read_text().splitlines():
        if line.startswith(f"| `{prefix}"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells
    return rows


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (int, float)):
        return f"{value:g}"
    return str(value)


def test_the_settings_page_lists_every_variable_with_its_default():
    rows = _table_rows("ELASTIC_")
    assert sorted(rows) == sorted(knobs.REGISTRY), "docs/settings.md and elastic_ray/knobs.py list different variables"
    for name, knob in knobs.REGISTRY.items():
        default = rows[name][2]
        if knob.default is None:
            assert default.startswith("unset"), f"{name}: the page shows a default of {default!r}, the registry none"
        else:
            assert default.split()[0] == _shown(knob.default), f"{name}: the page shows {default!r}"


def test_every_variable_appears_in_the_docs():
    text = "\n".join(p.read_text() for p in (PACKAGE.parent / "docs").rglob("*.md"))
    missing = [name for name in knobs.REGISTRY if name not in text]
    assert not missing, f"documented nowhere in docs/: {missing}"


def _default_times() -> dict[str, float]:
    return {name: value for name, value in vars(defaults).items()
            if name.isupper() and isinstance(value, (int, float))}


def test_the_settings_page_lists_every_default_time_with_its_value():
    rows = {name: cells for name, cells in _table_rows("").items() if not name.startswith("ELASTIC_")}
    times = _default_times()
    assert sorted(rows) == sorted(times), "docs/settings.md and elastic_ray/defaults.py list different defaults"
    for name, value in times.items():
        assert rows[name][1].split()[0] == _shown(value), f"{name}: the page shows {rows[name][1]!r}, the code {value}"


def test_the_defaults_module_imports_nothing():
    tree = ast.parse((PACKAGE / "defaults.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(n) for n in imports] == ["from __future__ import annotations"]


def test_the_knob_defaults_are_the_named_defaults():
    assert knobs.POLL_INTERVAL.default == defaults.POLL_INTERVAL
    assert knobs.SLURMD_CHECK.default == defaults.SLURMD_CHECK_INTERVAL
    assert knobs.DETACHED_IDLE_INTERVAL.default == defaults.DETACHED_IDLE_INTERVAL
    assert knobs.HEALTH_CHECK_INITIAL_DELAY_MS.default == defaults.HEALTH_CHECK_INITIAL_DELAY_MS
