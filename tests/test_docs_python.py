"""The Python examples of the docs: every block compiles, and the ones a
new user would paste first are run for real.

* Every fenced ```python block in docs/ and README.md must compile, so a
  renamed keyword or a stray character shows up here, not in a user's shell.
* A block preceded by ``<!-- docs-test: run -->`` is run as a program with
  this interpreter, on the local scheduler (real agents, real ``ray
  start``), and must exit 0 within its timeout. These are marked ``ray``:
  they start Ray, so they run with the heavy tests.

Why not run every block: most are fragments (a resource inside a Dagster
definitions file, a config that needs a Slurm partition); compiling them
still catches the way examples rot.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from doc_blocks import fenced_blocks

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
RUN_MARK = "<!-- docs-test: run -->"
RUN_TIMEOUT = 420


def python_blocks(path: Path) -> list[tuple[int, str, bool]]:
    """(first line, source, marked to run) of each ```python block."""
    return [(block.first_line, block.source, block.marker == RUN_MARK)
            for block in fenced_blocks(path) if block.lang == "python"]


BLOCKS = [(path, line, source, run) for path in DOC_FILES for line, source, run in python_blocks(path)]
RUNNABLE = [block for block in BLOCKS if block[3]]


def _id(block) -> str:
    return f"{block[0].relative_to(REPO)}:{block[1]}"


def test_the_docs_have_python_examples_and_at_least_one_is_run():
    assert len(BLOCKS) >= 10
    assert RUNNABLE, f"no block is marked {RUN_MARK}"


def _name(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def _compile_block(block) -> None:
    path, line, source, _ = block
    try:
        compile(source, f"{_name(path)}:{line}", "exec")
    except SyntaxError as exc:
        # A fragment from inside a function (an asset's body with ``return``)
        # compiles as that body; anything else is a real error.
        body = "def _fragment():\n" + "".join(f"    {text}\n" for text in source.splitlines())
        try:
            compile(body, "fragment", "exec")
        except SyntaxError:
            pytest.fail(f"{_name(path)}:{line + (exc.lineno or 1) - 1}: {exc.msg}")


@pytest.mark.parametrize("block", BLOCKS, ids=_id)
def test_every_python_block_compiles(block):
    _compile_block(block)


def test_a_fragment_compiles_as_a_function_body_but_broken_code_does_not(tmp_path):
    good = tmp_path / "good.md"
    good.write_text("```python\nwhile True:\n    return 1\n```\n")
    bad = tmp_path / "bad.md"
    bad.write_text("```python\nsession.create(path,, scheduler='slurm')\n```\n")
    [(line, source, _)] = python_blocks(good)
    _compile_block((good, line, source, False))
    [(line, source, _)] = python_blocks(bad)
    with pytest.raises(pytest.fail.Exception, match="bad.md:2"):
        _compile_block((bad, line, source, False))


def test_the_block_reader_keeps_indentation_inside_lists(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("1. step\n\n    <!-- docs-test: run -->\n    ```python\n    if True:\n        x = 1\n    ```\n")
    [(line, source, run)] = python_blocks(doc)
    assert run and line == 5
    compile(source, "x", "exec")


@pytest.mark.ray
@pytest.mark.timeout(RUN_TIMEOUT + 60)
@pytest.mark.parametrize("block", RUNNABLE, ids=_id)
def test_marked_python_blocks_run(block, tmp_path):
    path, line, source, _ = block
    script = tmp_path / "example.py"
    script.write_text(source)
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    # New session: whatever the example starts and leaves behind is in its
    # own process group, which this test ends by PID if the example hangs.
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"{path.relative_to(REPO)}:{line} did not finish in {RUN_TIMEOUT}s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"{path.relative_to(REPO)}:{line} exited {proc.returncode}:\n{out[-4000:]}"
