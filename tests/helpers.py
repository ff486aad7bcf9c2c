"""Small helpers shared by tests (unit, component and integration).

``wait_until`` replaces fixed sleeps: a test that waits for a state polls for
it with a deadline, so it is as fast as the system allows and, when it fails,
says what it waited for and what it saw last. ``stays`` is its mirror for
"nothing happens" checks: it watches a condition for a whole period and fails
the moment it stops holding, instead of sleeping and looking once at the end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from elastic_ray.polling import WaitTimeout, wait_for
from elastic_ray.protocol.disk.records import AgentState, NodeState

T = TypeVar("T")


class _Raised:
    """A look whose predicate raised: not done, and reported as what was seen."""

    def __init__(self, exc: Exception) -> None:
        self.text = f"raised {type(exc).__name__}: {exc}"

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return repr(self.text)


def wait_until(predicate: Callable[[], T], timeout: float, interval: float = 0.2,
               message: str = "condition", *, clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> T:
    """Call ``predicate`` until it returns something truthy; return that value.

    Raises ``AssertionError`` naming ``message`` and the last value returned
    (or the last exception raised) once ``timeout`` seconds have passed. The
    predicate is always tried at least once, and once more at the deadline.
    A caller that wants to know how long it took measures that itself.
    """
    def look() -> T | _Raised:
        try:
            return predicate()
        except Exception as exc:  # noqa: BLE001 - reported if the deadline passes
            return _Raised(exc)

    try:
        return wait_for(look, timeout=timeout, interval=interval, what=message,  # type: ignore[return-value]
                        clock=clock, sleep=sleep)
    except WaitTimeout as exc:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {message}; "
                             f"last value: {exc.last!r}") from None


def stays(predicate: Callable[[], object], seconds: float, interval: float = 0.1,
          message: str = "condition", *, show: Callable[[], object] | None = None,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
    """Check that ``predicate`` keeps holding for ``seconds``, looking every ``interval``.

    The first look is at once and the last one at the end of the period. The
    moment a look returns something falsy (or raises), fail with an
    ``AssertionError`` naming ``message``, when it happened and what was seen
    (``show()`` if given, to name what changed, else the returned value or
    the exception).
    """
    start = clock()
    end = start + seconds
    while True:
        try:
            value = predicate()
        except Exception as exc:  # noqa: BLE001 - an assert inside the predicate counts as a change
            value, seen = False, f"raised {type(exc).__name__}: {exc}"
        else:
            seen = f"returned {value!r}"
        now = clock()
        if not value:
            if show is not None:
                seen = f"now {show()!r}"
            raise AssertionError(f"{message} stopped holding after {now - start:.1f} of {seconds:g} s: {seen}")
        if now >= end:
            return
        sleep(min(interval, end - now))


# A node command for scheduler tests, run by both backends (on Slurm inside the
# lab's nodes, so it uses nothing but the standard library). It appends one line
# per event ("<event> <SLURM_NODEID> <SLURMD_NODENAME> <hostname> <time>") to the
# marker file named by its first argument: "ready" once its handlers are set,
# "usr1" per SIGUSR1, "term" on SIGTERM (then it exits 0, or with
# --ignore-term it keeps running until SIGKILL). With --exit-when PATH it exits
# (with --exit-code, default 0) once PATH exists; with --daemon PIDFILE it first
# starts a `sleep` in a session of its own and writes that pid to PIDFILE.
MARKER_NODE_SCRIPT = r'''
import os, signal, socket, subprocess, sys, time

args = sys.argv[1:]
marker = args[0]

def option(name, default=None):
    return args[args.index(name) + 1] if name in args else default

def note(event):
    line = "%s %s %s %s %.3f\n" % (event, os.environ.get("SLURM_NODEID", "-"),
                                   os.environ.get("SLURMD_NODENAME", "-"), socket.gethostname(), time.time())
    fd = os.open(marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)

def on_term(signum, frame):
    note("term")
    if "--ignore-term" not in args:
        sys.exit(0)

signal.signal(signal.SIGUSR1, lambda signum, frame: note("usr1"))
signal.signal(signal.SIGTERM, on_term)
if "--daemon" in args:
    child = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with open(option("--daemon"), "w") as handle:
        handle.write(str(child.pid))
print("node %s on %s says hello" % (os.environ.get("SLURM_NODEID"), os.environ.get("SLURMD_NODENAME")),
      flush=True)
note("ready")
release = option("--exit-when")
while True:
    if release and os.path.exists(release):
        note("exit")
        sys.exit(int(option("--exit-code", "0")))
    time.sleep(0.05)
'''


def write_marker_script(directory: str | Path) -> Path:
    """Write :data:`MARKER_NODE_SCRIPT` into ``directory`` and return its path."""
    path = Path(directory) / "marker_node.py"
    path.write_text(MARKER_NODE_SCRIPT)
    return path


def marker_events(path: str | Path) -> list[tuple[str, str, str, str, float]]:
    """The marker file's lines as (event, node id, node name, hostname, time); [] if absent."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 5:
            events.append((parts[0], parts[1], parts[2], parts[3], float(parts[4])))
    return events


def committed_units(path: Path) -> list[int]:
    """Units a payload committed to ``path`` (one number per line), in order."""
    return [int(x) for x in path.read_text().split()] if path.exists() else []


def node_state(job_id: str = "5", node: str = "cpu-1", state: str = "JOINED", **overrides) -> NodeState:
    """A well-formed NodeState for tests; ``overrides`` set any other field."""
    fields = dict(session="/s", job_id=job_id, node=node, node_ip="10.0.0.1", role="worker",
                  state=AgentState(state), since=1_800_000_000.0, max_restarts=3, rejoin_timeout=600.0,
                  started_at=1_800_000_000.0, updated_at=1_800_000_000.0, pid=os.getpid(),
                  control="tcp://10.0.0.1:4000")
    fields.update(overrides)
    return NodeState(**fields)
