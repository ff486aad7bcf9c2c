"""The docs' end-to-end shell session runs, as written, on the Slurm lab.

Blocks preceded by ``<!-- docs-test: lab -->`` in docs/*.md are this test's
input (the fast docs test, tests/test_docs.py, only resolves and parses
them):

* a ```toml block whose first line is ``# NAME`` is written to NAME;
* a ```console block's ``$`` lines are run in that order, in one bash
  (``set -e``, so an ``export`` carries to the next line), in a fresh
  directory on the lab's shared filesystem, with this interpreter's
  virtualenv first on PATH: every line must succeed.

Whatever the commands leave (a session that did not reach its
``teardown``) is torn down afterwards by the session's own teardown, and
no job of it may stay active.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# The docs tests' one Markdown reader lives with them (tests/doc_blocks.py).
sys.path.insert(0, str(REPO / "tests"))
from doc_blocks import fenced_blocks  # noqa: E402
MARK = "<!-- docs-test: lab -->"


def lab_blocks() -> list[tuple[Path, int, str, list[str]]]:
    """(file, line, language, lines) of every marked block, in document order."""
    return [(path, block.first_line, block.lang, [text for _, text in block.lines])
            for path in sorted((REPO / "docs").rglob("*.md")) for block in fenced_blocks(path)
            if block.marker == MARK]


def test_the_docs_have_a_lab_session_to_run():
    langs = [lang for _, _, lang, _ in lab_blocks()]
    assert "toml" in langs and "console" in langs, langs


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_docs_shell_session_runs_on_the_lab(slurm_lab):
    """Full tier only: it checks the docs' install-and-run story, not a
    behaviour. On every change tests/test_docs.py resolves every command of
    these blocks against the real CLI, and the lab tests run what they do."""
    work = slurm_lab.shared_dir(f"docs-lab-{os.getpid()}")
    commands: list[str] = []
    for path, line, lang, body in lab_blocks():
        if lang == "toml":
            name = body[0].lstrip("#").strip()
            assert name and "/" not in name, f"{path.name}:{line}: the first line names the file (# NAME)"
            (work / name).write_text("\n".join(body[1:]) + "\n")
        elif lang == "console":
            commands += [text.strip()[2:] for text in body if text.strip().startswith("$ ")]
    assert commands
    script = "set -euo pipefail\n" + "".join(f"echo '+ {c}' >&2\n{c}\n" for c in commands)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("ELASTIC_RAY_SESSION", None)
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True,
                              timeout=800)
        assert proc.returncode == 0, f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-3000:]}"
        assert (work / "scripts.txt").read_text().count("#SBATCH --partition=") == 2
        assert "elastic-ray/1" in proc.stdout, "add-worker --json printed no versioned JSON"
    finally:
        from elastic_ray.coordinator.session import Session

        for found in work.glob("runs/*/session.json"):
            with Session.open(found.parent, supervise=False) as session:
                session.teardown()
                active = [job for job, info in session.query().items() if info.state.is_active]
                assert not active, f"jobs of the docs' session still active after teardown: {active}"
