"""The per-change tier keeps every real part in every layer (issue 20).

``scripts/test`` runs ``-m "not slow"`` on every change and everything with
``--full`` (docs/conventions.md, "Test tiers"). Moving tests to the full tier
must never leave a layer without a per-change test against the real thing:
this collects the per-change tier as ``scripts/test`` selects it and checks,
layer by layer, that at least one of its tests uses each real part that
layer talks to. Which layer a test belongs to is read from its module's name
(:func:`layer_of`); the real parts from its markers (``slurm``: the lab,
``ray``: real Ray processes, ``dagster``: real Dagster runs) and fixtures
(``sshd``/``lab_sshd``: a real OpenSSH server).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: layer -> the real parts its per-change tests must use (each at least once).
REQUIRED = {
    "scheduler": {"slurm"},
    "agent": {"slurm", "ray"},
    "coordinator": {"slurm", "ray"},
    "dagster": {"slurm", "ray", "dagster"},
    "remote": {"slurm", "ray", "sshd"},
}

#: module name prefixes (after ``test_``) -> layer; the first match wins.
PREFIXES = (
    ("dagster_ssh", "remote"), ("remote", "remote"), ("dagster", "dagster"),
    ("agent", "agent"), ("slurmd_gone", "agent"), ("node_gone", "agent"),
    ("coordinator", "coordinator"), ("handover", "coordinator"), ("standby", "coordinator"),
    ("faults", "coordinator"), ("sessions_isolation", "coordinator"),
    ("slurm_scheduler", "scheduler"), ("lab", "scheduler"),
)


def layer_of(nodeid: str) -> str | None:
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py").removeprefix("test_")
    return next((layer for prefix, layer in PREFIXES if module.startswith(prefix)), None)


def parts_of(row: dict) -> set[str]:
    parts = {m for m in row["markers"] if m in ("slurm", "ray", "dagster")}
    if {"sshd", "lab_sshd"} & set(row["fixtures"]):
        parts.add("sshd")
    return parts


def coverage(rows: list[dict]) -> dict[str, set[str]]:
    """layer -> the real parts some test of that layer uses."""
    seen: dict[str, set[str]] = {layer: set() for layer in REQUIRED}
    for row in rows:
        layer = layer_of(row["nodeid"])
        if layer in seen:
            seen[layer] |= parts_of(row)
    return seen


def missing(rows: list[dict]) -> dict[str, set[str]]:
    seen = coverage(rows)
    return {layer: need - seen[layer] for layer, need in REQUIRED.items() if need - seen[layer]}


def test_layers_are_read_from_module_names():
    assert layer_of("integration/test_dagster_slurm.py::test_x") == "dagster"
    assert layer_of("tests/test_dagster_ssh_local.py::test_x") == "remote"
    assert layer_of("tests/test_agent_local.py::test_x[a]") == "agent"
    assert layer_of("integration/test_faults_slurm.py::test_x") == "coordinator"
    assert layer_of("tests/test_config.py::test_x") is None


def test_the_check_names_what_a_layer_lost():
    rows = [{"nodeid": "integration/test_agent_slurm.py::t", "markers": ["slurm", "ray"], "fixtures": []},
            {"nodeid": "tests/test_remote_local.py::t", "markers": ["ray"], "fixtures": ["sshd"]}]
    gaps = missing(rows)
    assert "agent" not in gaps
    assert gaps["remote"] == {"slurm"} and gaps["dagster"] == {"slurm", "ray", "dagster"}


def _collect(tmp_path: Path, marker_expr: str) -> list[dict]:
    dump = tmp_path / "items.json"
    env = {**os.environ, "ELASTIC_RAY_TIER_DUMP": str(dump)}
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tests.tier_plugin",
                          "-m", marker_expr, "tests", "integration"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(dump.read_text())


@pytest.mark.timeout(300)
def test_the_per_change_tier_uses_every_real_part_in_every_layer(tmp_path):
    rows = _collect(tmp_path, "not slow")
    assert len(rows) > 1000, "the per-change tier collected too little"
    gaps = missing(rows)
    assert not gaps, f"per-change tier: these layers have no test of these real parts: {gaps}"
    # Every slow test is left out, and the full tier holds more.
    assert not [r for r in rows if "slow" in r["markers"]]
