"""Process identity and signalling for the local scheduler (thin, effectful).

Every process the local scheduler may signal later is remembered as a
:class:`ProcRef` (pid + start time), and every signal goes through
:func:`is_alive`, so a pid that was reused after a crash is never hit. Never
by name: another user's (or another test's) processes look the same.
"""

from __future__ import annotations

import ctypes
import os
import signal as _signal
from collections.abc import Callable

import psutil

from .record import ProcRef

# psutil derives the start time from boot time + clock ticks: the same
# process always gives the same value; another process with a recycled pid
# started later by far more than this.
_CREATE_TIME_TOLERANCE = 0.05
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def ref_of(pid: int, node: str = "") -> ProcRef:
    """Remember a running process (raises psutil.NoSuchProcess if it is gone)."""
    return ProcRef(pid, psutil.Process(pid).create_time(), node)


def is_alive(ref: ProcRef | None) -> bool:
    """True if the very process ``ref`` names still runs (zombies are dead)."""
    if ref is None:
        return False
    try:
        proc = psutil.Process(ref.pid)
        if abs(proc.create_time() - ref.create_time) > _CREATE_TIME_TOLERANCE:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def send(ref: ProcRef, sig: int) -> bool:
    """Signal one verified process; False if it is gone."""
    if not is_alive(ref):
        return False
    try:
        os.kill(ref.pid, sig)
        return True
    except ProcessLookupError:
        return False


def send_group(ref: ProcRef, sig: int) -> bool:
    """Signal the process group led by a verified process; False if the leader is gone.

    Node processes are started as group (and session) leaders, so their
    group is the node's "step": the command and the children it did not move
    into a session of their own, which is what a Slurm step signal reaches.
    """
    if not is_alive(ref):
        return False
    try:
        os.killpg(ref.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process instead of init.

    A job supervisor does this so that daemons its node processes start
    (``ray start`` without ``--block``, ``setsid`` helpers) stay findable
    and die with the job, like proctrack/cgroup does on Slurm. Linux only;
    False elsewhere (then such daemons can outlive the job).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when ``parent_pid`` dies.

    Linux's PR_SET_PDEATHSIG survives exec. Only for a single-threaded parent
    (the job supervisor is one): the signal fires when the creating thread
    exits. None where prctl is unavailable.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(_signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def descendants() -> list[psutil.Process]:
    """Every live process below this one (with the subreaper, the job's whole tree)."""
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    """Signal each process, ignoring the ones that already left."""
    for proc in procs:
        try:
            proc.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            pass


def signal_name(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return str(sig)
