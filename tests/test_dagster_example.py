"""examples/dagster_project: its definitions load, and the README's command materializes it."""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dagster_helpers import all_jobs_final, session_root_fixture  # noqa: F401 - fixture "session_root"
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "dagster_project"
DAGSTER = str(Path(sys.executable).with_name("dagster"))


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), out.get("PYTHONPATH", "")])
    out.pop("DAGSTER_HOME", None)
    return out


def readme_command() -> list[str]:
    """The one command in the README's code block."""
    text = (EXAMPLE / "README.md").read_text()
    blocks = re.findall(r"```\n(.*?)```", text, re.DOTALL)
    commands = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert len(commands) == 1, commands
    argv = shlex.split(commands[0])
    assert argv[0] == "dagster"
    return [DAGSTER, *argv[1:]]


def test_example_definitions_validate():
    out = subprocess.run([DAGSTER, "definitions", "validate", "-f", str(EXAMPLE / "definitions.py")],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "passed validation" in out.stdout + out.stderr


@pytest.mark.ray
@pytest.mark.timeout(300)
@pytest.mark.dagster
@pytest.mark.slow
def test_readme_command_materializes_the_example(session_root):
    """Full tier only (it checks the README's command, an install, rather than a behaviour). On
    every change test_example_definitions_validate loads the same definitions, and
    tests/test_dagster_assets.py materializes assets with the same resources on real Ray."""
    out = subprocess.run(readme_command(), cwd=ROOT, env=env(), capture_output=True, text=True, timeout=280)
    logs = out.stdout + out.stderr
    assert out.returncode == 0, logs[-4000:]
    assert "RUN_SUCCESS" in logs and logs.count("ASSET_MATERIALIZATION") >= 2, logs[-4000:]
    wait_until(lambda: all_jobs_final(session_root), timeout=60, message="the run's session was torn down")
