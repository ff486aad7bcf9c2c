"""Fixtures for tests/.

``slurm_lab`` (the real multi-node Slurm lab, session-scoped) is defined in
``integration/conftest.py``; tests here that run against both scheduler
backends (``test_scheduler_contract.py``) request it for their ``slurm``
case, so it is re-exported here. pytest only shares fixtures down the
directory tree, hence the import: the repository root goes on ``sys.path``
so that ``integration`` (a package: ``integration/__init__.py``) is importable.

``sshd`` (a real OpenSSH server on 127.0.0.1 for the SSH mode's tests, see
``tests/sshd_server.py``) is defined next to it and re-exported the same way.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if (ROOT / "integration" / "conftest.py").exists():
    from integration.conftest import slurm_lab, sshd  # noqa: E402,F401 - re-exported fixtures

from tests.signal_guard import _signals_left_as_found  # noqa: E402,F401 - an autouse fixture
from tests.postmortem import pytest_runtest_makereport  # noqa: E402,F401 - logs of a failed test's sessions
