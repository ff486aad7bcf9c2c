"""Small modules with one job: a module over about 500 lines says why it is one unit.

The limit is a prompt to split, not a law: a state machine or a wire format
can be one unit on purpose. Such a module says so in its docstring, with a
sentence starting "Why one module", so the choice is deliberate and visible.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "elastic_ray"
LIMIT = 520  # "about 500"


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_long_module_says_why_it_is_one_unit(path):
    text = path.read_text()
    lines = text.count("\n")
    if lines <= LIMIT:
        return
    doc = ast.get_docstring(ast.parse(text)) or ""
    assert "Why one module" in doc, f"{path.relative_to(PACKAGE)} has {lines} lines and no 'Why one module' in its docstring"
