"""The public API as a type checker sees it, checked with mypy.

``elastic_ray`` loads ``Session`` and its handles on first use (the agent
imports the package and must not pay for the coordinator). A module-level
``__getattr__`` alone would make every such name ``Any`` to a type checker:
wrong calls would pass and misspelt names too. The package imports them under
``TYPE_CHECKING`` instead, and hides its ``__getattr__`` from the checker.

Two programs written as a user would write them are checked (``--strict``,
in a subprocess, with a cache of its own): one that imports every name of
``elastic_ray.__all__`` and makes a few typed calls must come out clean, and
one with deliberate mistakes must have each reported, so the test can fail.
``assert_type`` makes the clean one fail too if a lazy name became ``Any``.
The package's own modules are followed silently: their errors are not the
user's, and are not what this test is about.
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest

import elastic_ray

# Where the elastic_ray under test is imported from. An editable install is
# found through setuptools' import hook, which mypy does not run: MYPYPATH
# names the folder then. An installed package is found as any typed one.
PACKAGE_HOME = Path(elastic_ray.__file__).resolve().parents[1]

NAMES = sorted(n for n in elastic_ray.__all__ if n != "__version__")

CLEAN = f'''\
from __future__ import annotations

from typing_extensions import assert_type

import elastic_ray
from elastic_ray import {", ".join(NAMES)}
from elastic_ray.polling import WaitTimeout
from elastic_ray.protocol.wire.channel import ControlTimeout as ChannelTimeout
from elastic_ray.remote.ssh import SshTarget


def grow(session: Session, config: SlurmWorkerAllocationConfig) -> dict[str, str]:
    handle = session.add_worker_allocation(config, resubmit_on_failure=1)
    assert_type(handle, WorkerAllocation)
    return session.wait_for_worker_allocation(handle, timeout=600.0)


def failover(session: Session) -> Head | None:
    try:
        run = session.run(["python", "step.py"])
        assert_type(run.wait(timeout=60.0).returncode, int)
    except SlurmStepDrained as drained:
        assert_type(drained.job_id, str | None)
    except SlurmAllocationEnded as ended:
        assert_type(ended.allocation_state, str)
        return session.replace_head(timeout=1800.0)
    except PayloadFailed as failed:
        assert_type(failed.returncode, int)
    except ControlTimeout:
        return None
    return session.head


def open_run(path: str) -> Session:
    head = SlurmRunAllocationConfig(partition="cpu", time_limit="01:00:00")
    launcher = RayLauncher()
    try:
        return Session.create(path, head=head, launcher=launcher, ray_head_only=False)
    except ConfigError as refused:
        assert_type(refused.field, str)
        raise


def remote_failure(exc: ElasticRayError) -> str:
    if isinstance(exc, SshError):
        return exc.host
    if isinstance(exc, RemoteVersionMismatch):
        return exc.cluster_version
    if isinstance(exc, TeardownIncomplete):
        return ", ".join(exc.cancelled)
    return str(exc)


timeouts: tuple[type[TimeoutError], ...] = (WaitTimeout, ControlTimeout, ChannelTimeout)
values: tuple[type[ValueError], ...] = (ConfigError,)
bases: tuple[type[ElasticRayError], ...] = (
    AllocationFailed, ControlError, CorruptFileError, ProtocolError, RemoteError, RemoteSetupError,
    SchedulerError, SessionDirError, WaitTimeout)
error = SshError(SshTarget(host="login"), ["true"], 255, "denied")
version: str = elastic_ray.__version__
assert_type(elastic_ray.Session, type[Session])
'''

# Each mistake, and the error code mypy must give on its line.
MISTAKES = [
    ("from elastic_ray import Sesion", "attr-defined"),                      # misspelt lazy name
    ("elastic_ray.WorkerAlocation", "attr-defined"),                          # the same, as an attribute
    ("session.replace_head(timeout='soon')", "arg-type"),                     # a typed call, wrong argument
    ("session.add_worker_allocation(SlurmRunAllocationConfig())", "arg-type"),  # the head's config for a worker
    ("session.no_such_method()", "attr-defined"),
    ("elastic_ray.SlurmAllocationEnded('gone').allocation_state", "call-arg"),  # a keyword-only argument left out
    ("x: int = elastic_ray.WaitTimeout", "attr-defined"),                     # not exported at the top
]

WRONG = "\n".join([
    "from __future__ import annotations",
    "import elastic_ray",
    "from elastic_ray import Session, SlurmRunAllocationConfig",
    "def calls(session: Session) -> None:",
    *[f"    {line}" if not line.startswith("from ") else f"    {line}  # noqa" for line, _ in MISTAKES],
    "",
])
FIRST_MISTAKE_LINE = 5


def run_mypy(tmp_path: Path, *files: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    installed = {Path(p).resolve() for p in [*site.getsitepackages(), site.getusersitepackages()]}
    if PACKAGE_HOME not in installed:
        env["MYPYPATH"] = str(PACKAGE_HOME)
    env.pop("MYPY_CACHE_DIR", None)
    argv = [sys.executable, "-m", "mypy", "--config-file", "", "--strict", "--follow-imports=silent",
            "--cache-dir", str(tmp_path / "mypy-cache"), "--no-error-summary", "--show-error-codes",
            "--no-color-output", *files]
    return subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, list[str]]:
    """mypy's findings per program, from one run over both."""
    tmp = tmp_path_factory.mktemp("types")
    (tmp / "clean_user.py").write_text(CLEAN)
    (tmp / "wrong_user.py").write_text(WRONG)
    out = run_mypy(tmp, "clean_user.py", "wrong_user.py")
    assert out.returncode in (0, 1) and not out.stderr.strip(), f"mypy did not run:\n{out.stdout}\n{out.stderr}"
    found: dict[str, list[str]] = {"clean_user.py": [], "wrong_user.py": []}
    for line in out.stdout.splitlines():
        name = line.split(":", 1)[0]
        if ": error:" in line or ": note:" in line:
            assert name in found, line
            found[name].append(line)
    return found


def test_a_user_program_using_every_public_name_type_checks_clean(checked):
    assert checked["clean_user.py"] == []


@pytest.mark.parametrize("index, mistake", list(enumerate(MISTAKES)), ids=[code + ":" + line.split("(")[0][:30]
                                                                               for line, code in MISTAKES])
def test_each_deliberate_mistake_is_reported(checked, index, mistake):
    line, code = mistake
    number = FIRST_MISTAKE_LINE + index
    errors = [e for e in checked["wrong_user.py"] if re.match(rf"wrong_user\.py:{number}: error:", e)]
    assert any(e.endswith(f"[{code}]") for e in errors), (line, checked["wrong_user.py"])
