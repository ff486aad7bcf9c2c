"""A real headless browser for tests of what a user looks at: Debian's chromium (installed by scripts/bootstrap).

Under CI=true a missing chromium fails instead of skipping, as a missing lab
or mkdocs does. Chromium runs in a process group of its own, which is ended
whatever happens (it leaves helpers, a crash handler and zygotes, that may
outlive the browser): only what the test started is ended.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")


def need_chromium() -> str:
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed (scripts/bootstrap installs Debian's chromium)", pytrace=False)
        pytest.skip("chromium is not installed (apt-get install chromium; scripts/bootstrap does it)")
    return CHROMIUM


def run_chromium(profile: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """Run headless chromium with ``args`` and a private profile; its whole process group is ended after."""
    command = [need_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--no-default-browser-check", "--disable-extensions", f"--user-data-dir={profile}", *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"chromium did not finish in {timeout:.0f}s: {' '.join(command)}\n{err.decode()[-2000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.poll() is None:
            proc.wait(10)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def png_colours(png: bytes) -> set[tuple[int, int, int]]:
    """The distinct RGB colours of a PNG (matplotlib's reader: the timeline extra)."""
    from matplotlib import image as mpimg

    pixels = mpimg.imread(io.BytesIO(png), format="png")
    rgb = (pixels[..., :3] * 255).round().astype("uint8").reshape(-1, 3)
    return {tuple(int(c) for c in p) for p in set(map(tuple, rgb.tolist()))}


def near(colours: set[tuple[int, int, int]], want: tuple[int, int, int], slack: int = 6) -> bool:
    return any(all(abs(a - b) <= slack for a, b in zip(c, want)) for c in colours)
