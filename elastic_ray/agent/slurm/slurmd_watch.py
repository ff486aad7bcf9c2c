"""The effects around ``agent.slurm.slurmd_rules``: look at the local slurmd, ask
the scheduler about this agent's job while slurmd is gone, and leave when
Slurm no longer runs the job on this node.

How the agent looks at slurmd: it reads the kernel's TCP socket tables
(``/proc/net/tcp`` and ``tcp6``) of its own network namespace, which is the
node's, and looks for a socket listening on the slurmd port. No packet goes
to slurmd, no process is started, slurmctld is not involved. The two
obvious alternatives cost more: a TCP connect makes slurmd accept, read zero
bytes and log ``error: service_connection: slurm_receive_msg: Zero Bytes
were transmitted or received`` on every look (hundreds of error lines a day
per node); ``scontrol show slurmd`` forks a program (2.4 ms of CPU measured
on the 2-core VM, before munge), asks munged for a credential and makes
slurmd serve a request. One look here costs about 0.1 ms of CPU (listening
sockets come first in the table, so the scan stops early); every 20 s that
is well under 0.01 % of a core.

The check only counts once it has seen slurmd listen: a site whose slurmd
lives in another network namespace than its jobs (or another port than
slurm.conf says) turns it off after a few looks, with one log line, instead
of asking the scheduler forever.

Threads: the event loop owns every attribute; the lookup runs on a short
thread (``agent-slurmd-job``) whose answer comes back through ``post`` (the
loop's call queue), as ``signal_drain.WalltimeWatch`` does.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from ... import knobs
from ...scheduler.base import JobInfo
from ..machine import Event, ShutdownRequested
from .signal_drain import own_job_info
from .slurmd_rules import SlurmdConf, plan, read_slurmd_conf, verdict

CHECK_ENV = knobs.SLURMD_CHECK.name
PORT_ENV = knobs.SLURMD_PORT.name
DEFAULT_SLURM_CONF = "/etc/slurm/slurm.conf"
#: How long one lookup may take; nothing waits on it but the next lookup.
LOOKUP_TIMEOUT = 10.0
#: Looks that find no slurmd before the check is judged not to apply here.
UNSEEN_LIMIT = 3
#: Signals a returning slurmd (or a resumed job) sends that the agent does
#: not act on but logs. SIGTERM and the drain signals are the runner's.
NOTICE_SIGNALS = (signal.SIGCONT,)
_TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
_LISTEN, _SYN_RECV = b"0A", b"03"


def _scan(table: str, suffix: bytes) -> bool | None:
    """Does ``table`` list a listener whose local address ends in ``suffix``?
    None when it cannot be read.

    The kernel lists listening sockets before all others (older kernels put
    their half-open requests, state 03, among them), so the scan stops at
    the first other state.
    """
    try:
        with open(table, "rb") as handle:
            next(handle, None)  # the header
            for line in handle:
                fields = line.split(None, 4)
                if len(fields) < 4:
                    continue
                if fields[3] == _LISTEN:
                    if fields[1].endswith(suffix):
                        return True
                elif fields[3] != _SYN_RECV:
                    break
    except OSError:
        return None
    return False


class ListenerProbe:
    """Is a TCP socket listening on ``port`` in this process's network namespace?

    Calling it answers True or False, or None when no table can be read (not
    Linux: the check cannot work here). Once the listener was found in one
    table, only that table is read: reading ``/proc/net/tcp6`` on a host with
    no IPv6 sockets makes the kernel walk its whole established-connection
    hash (2-3 ms of CPU on the VM, against 0.1 ms for ``/proc/net/tcp``).
    """

    def __init__(self, port: int, tables: tuple[str, ...] = _TCP_TABLES):
        self.suffix = b":%04X" % port
        self.tables = tables

    def __call__(self) -> bool | None:
        readable = False
        for table in self.tables:
            found = _scan(table, self.suffix)
            if found:
                self.tables = (table,)
                return True
            readable = readable or found is not None
        return False if readable else None


def slurmd_listening(port: int, tables: tuple[str, ...] = _TCP_TABLES) -> bool | None:
    """One look for a listener on ``port`` (see :class:`ListenerProbe`)."""
    return ListenerProbe(port, tables)()


def check_interval(environ: Mapping[str, str]) -> float:
    """Seconds between looks at slurmd from ``ELASTIC_AGENT_SLURMD_CHECK`` (default
    ``slurmd_rules.DEFAULT_CHECK_INTERVAL``); 0 turns it off. ValueError naming the knob."""
    return knobs.SLURMD_CHECK.value(environ)


def load_slurmd_conf(environ: Mapping[str, str], node: str) -> SlurmdConf:
    """The node's slurmd port and SlurmdTimeout from ``$SLURM_CONF`` (slurmd
    puts it into every job's environment) or /etc/slurm/slurm.conf; Slurm's
    defaults when neither can be read. ``ELASTIC_AGENT_SLURMD_PORT`` wins."""
    try:
        text = Path(environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF).read_text(errors="replace")
    except OSError:
        text = ""
    conf = read_slurmd_conf(text, node)
    port = knobs.SLURMD_PORT.read(environ)
    if port is not None:
        conf = SlurmdConf(port=port, slurmd_timeout=conf.slurmd_timeout)
    return conf


class SlurmdWatch:
    """Leave when the job no longer runs here; see the module docstring.

    ``check(now)`` runs on every turn of the event loop and returns at once
    unless a look is due. ``feed`` is the loop's way to hand the machine an
    event: the departure is a ``ShutdownRequested`` whose reason says what
    Slurm said, so the node's final state (LEFT) carries it.
    """

    def __init__(self, *, job_id: str, node: str, interval: float, conf: SlurmdConf,
                 probe: Callable[[], bool | None], lookup: Callable[[], JobInfo | None],
                 log: Callable[..., None], post: Callable[[Callable[[], None]], None],
                 feed: Callable[[Event], None], off: str | None = None):
        self.job_id, self.node, self.interval, self.conf = job_id, node, interval, conf
        self.probe, self.lookup, self.log, self.post, self.feed = probe, lookup, log, post, feed
        self.off = off                       # why the check does not run; None while it does
        self._next_check = 0.0
        self._seen = False                   # slurmd was seen listening once: the check applies here
        self._unseen = 0
        self._down_since: float | None = None
        self._asked = 0                      # lookups in the current outage
        self._busy = False                   # a lookup is on its way
        self._leaving = False
        self._notices: list[int] = []        # signals to log (appended by the handler, on the loop's thread)

    @classmethod
    def for_agent(cls, info: Any, options: Any, log: Callable[..., None],
                  post: Callable[[Callable[[], None]], None], feed: Callable[[Event], None],
                  environ: Mapping[str, str] = os.environ) -> "SlurmdWatch":
        """The watch for one agent: on for the slurm scheduler, off for the
        local one (it has no slurmd) and when ``ELASTIC_AGENT_SLURMD_CHECK=0``.
        Raises ValueError naming a malformed knob."""
        interval = check_interval(environ)
        kind = info.scheduler.get("kind")
        off = (f"the {kind} scheduler has no slurmd" if kind != "slurm"
               else f"{CHECK_ENV}=0" if interval == 0 else None)
        conf = load_slurmd_conf(environ, options.node) if off is None else SlurmdConf()
        return cls(job_id=options.job_id, node=options.node, interval=interval, conf=conf,
                   probe=ListenerProbe(conf.port),
                   lookup=lambda: own_job_info(info.scheduler, info.job_name, options.job_id, LOOKUP_TIMEOUT),
                   log=log, post=post, feed=feed, off=off)

    def start(self) -> None:
        """Say how the check runs; log the notice signals from now on (main thread only)."""
        for sig in NOTICE_SIGNALS:
            signal.signal(sig, self._on_notice)
        if self.off is not None:
            self.log("slurmd_check_off", reason=self.off)
        else:
            self.log("slurmd_check", every=f"{self.interval:g}s", port=self.conf.port,
                     slurmd_timeout=f"{self.conf.slurmd_timeout:g}s")

    def _on_notice(self, signum: int, _frame: Any) -> None:
        self._notices.append(signum)

    # ------------------------------------------------------------ the loop's side
    def check(self, now: float) -> None:
        while self._notices:
            self.log("signal_received", signal=signal.Signals(self._notices.pop(0)).name)
        if self.off is not None or self._leaving or self._busy or now < self._next_check:
            return
        up = self.probe()
        if up is None:
            self._turn_off("the TCP socket tables cannot be read")
            return
        if not self._seen:
            self._seen, self._unseen = up, self._unseen + (not up)
            if self._unseen >= UNSEEN_LIMIT:
                self._turn_off(f"no slurmd listens on port {self.conf.port} in this node's network namespace")
            self._next_check = now + self.interval
            return
        if up and self._down_since is not None:
            self.log("slurmd_listening_again", gone_for=f"{now - self._down_since:.0f}s", lookups=self._asked)
            self._down_since, self._asked = None, 0
        elif not up and self._down_since is None:
            self._down_since = now
            self.log("slurmd_not_listening", port=self.conf.port)
        down_for = 0.0 if self._down_since is None else now - self._down_since
        step = plan(up, down_for, self._asked, self.interval, self.conf.slurmd_timeout)
        self._next_check = now + step.next_check_in
        if step.ask:
            self._asked += 1
            self._busy = True
            threading.Thread(target=self._lookup, name="agent-slurmd-job", daemon=True).start()

    def _turn_off(self, reason: str) -> None:
        self.off = reason
        self.log("slurmd_check_off", reason=reason)

    def _judge(self, info: JobInfo | None, error: str | None) -> None:
        self._busy = False
        if error is not None:
            self.log("job_lookup_failed", error=error)
        decision = verdict(self.job_id, self.node, info)
        state = info.state.value if info is not None else "-"
        if not decision.leave:
            self.log("job_checked", job_state=state, reason=decision.reason)
            return
        self._leaving = True
        self.log("job_gone", job_state=state, reason=decision.reason)
        self.feed(ShutdownRequested(time.time(), decision.reason))

    # ------------------------------------------------------------ the lookup thread
    def _lookup(self) -> None:
        try:
            info, error = self.lookup(), None
        except Exception as exc:  # the scheduler did not answer: stay, and say so
            info, error = None, str(exc)[:200]
        self.post(lambda: self._judge(info, error))


__all__ = ["ListenerProbe", "SlurmdWatch", "check_interval", "load_slurmd_conf", "slurmd_listening"]
