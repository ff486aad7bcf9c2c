"""Fenced blocks of the Markdown docs: the one reader the docs tests share
(tests/test_docs.py, tests/test_docs_python.py, integration/test_docs_lab.py).

A block is a fence of three or more backticks with its language, the body up
to the closing fence, and the marker: the nearest non-blank line before the
fence (an HTML comment such as ``<!-- docs-test: run -->`` says what a test
does with the block). A fence indented inside a list item keeps its body's
lines without that indentation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^(\s*)(`{3,})\s*([\w-]*)")


@dataclass(frozen=True)
class Block:
    lang: str
    marker: str                       # the nearest non-blank line before the fence, stripped
    lines: tuple[tuple[int, str], ...]  # (1-based line number, text without the fence's indentation)

    @property
    def first_line(self) -> int:
        """The line number of the body's first line (the fence's + 1)."""
        return self.lines[0][0] if self.lines else 0

    @property
    def source(self) -> str:
        return "\n".join(text for _, text in self.lines) + "\n"


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of one Markdown file, in order."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if not match:
            index += 1
            continue
        indent, fence, lang = match.groups()
        marker = next((lines[j].strip() for j in range(index - 1, -1, -1) if lines[j].strip()), "")
        body: list[tuple[int, str]] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence):
            text = lines[index]
            body.append((index + 1, text[len(indent):] if text.startswith(indent) else text))
            index += 1
        index += 1
        found.append(Block(lang, marker, tuple(body)))
    return found
