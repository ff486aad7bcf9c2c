"""What the lab tells its user while it works: one short prefixed line per event on stderr."""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    """One short prefixed line on stderr; stdout stays free for sinfo and the export line."""
    print(f"[lab {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _since(t0: float) -> str:
    return f"{time.monotonic() - t0:.1f}s"
