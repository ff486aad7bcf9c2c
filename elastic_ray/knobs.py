"""Every environment variable of elastic-ray: one record each, read through one function.

The names were read in a dozen modules, each parsing in its own way, and
several were documented nowhere. Here each variable has a :class:`Knob`:
its name, what its value is, its default, what it does and which modules
read it. ``knob.read()`` validates the value and raises :class:`KnobError`
(a ConfigError, so a ValueError) naming the variable and the bad value;
an unset or blank variable means the default. docs/settings.md lists them
all; tests/test_knobs.py holds that it does, and that no module under
``elastic_ray/`` spells one of these names anywhere but here (a new
variable gets a record, or the test fails).

``ELASTIC_AGENT_*`` variables tune the agents. The process that creates a
session records its own (:func:`forwarded_agent_env`) in ``session.json``,
and every batch script of the session exports those on every node (and
blanks the submitter's others), so a job submitted later, from any process,
configures its nodes alike (see ``coordinator.allocations.submit.agent_env``).

It belongs to no room (the agent, protocol, scheduler, config and front
ends all read it) and imports only ``errors`` and ``defaults``: the agent's
start path loads it.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from . import defaults
from .errors import ConfigError

T = TypeVar("T")

#: The prefix of the agent's knobs, which a session forwards to its nodes.
AGENT_PREFIX = "ELASTIC_AGENT_"


class KnobError(ConfigError):
    """An environment variable holds a value its knob refuses; ``field`` is the variable's name."""


@dataclass(frozen=True)
class Knob(Generic[T]):
    """One environment variable: what it is, and how its value is read."""

    name: str
    type: str                         # what the value is, as docs/settings.md says it
    default: T | None                 # what an unset or blank variable means
    does: str                         # one line: what it changes
    read_by: tuple[str, ...]          # modules (under elastic_ray/) that read it
    parse: Callable[[str], T] = field(repr=False, compare=False)  # raw text -> value; ValueError(reason)
    minimum: float | None = None      # numbers: the smallest accepted (click options use it too)
    choices: tuple[str, ...] = ()     # the accepted words, when the value is one of a few
    set_by: tuple[str, ...] = ()      # modules that set it for a process they start

    def text(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The variable's raw value, or None when it is unset or blank."""
        raw = (os.environ if environ is None else environ).get(self.name)
        return raw if raw is not None and raw.strip() else None

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return self.text(environ) is not None

    def read(self, environ: Mapping[str, str] | None = None) -> T | None:
        """The value from ``environ`` (default: this process's environment), checked; the
        default when unset or blank. KnobError naming the variable when the value is refused."""
        raw = self.text(environ)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise KnobError(self.name, raw.strip(), str(exc)) from None

    def value(self, environ: Mapping[str, str] | None = None) -> T:
        """``read`` for a knob whose default is a value: never None."""
        value = self.read(environ)
        if value is None:
            raise TypeError(f"{self.name} has no default: use read()")
        return value


REGISTRY: dict[str, Knob] = {}


def _knob(name: str, type: str, default: T | None, does: str, read_by: tuple[str, ...],
          parse: Callable[[str], T], *, minimum: float | None = None, choices: tuple[str, ...] = (),
          set_by: tuple[str, ...] = ()) -> Knob[T]:
    if name in REGISTRY or not name.startswith("ELASTIC_"):
        raise ValueError(f"knob {name!r}: registered twice, or not an ELASTIC_ name")
    REGISTRY[name] = knob = Knob(name, type, default, does, read_by, parse, minimum, choices, set_by)
    return knob


# ---------------------------------------------------------------- parsers: raw text -> value, ValueError(reason)

def _as_is(raw: str) -> str:
    """Paths and addresses: the value exactly as set."""
    return raw


def _word(raw: str) -> str:
    return raw.strip()


def _number(minimum: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("must be a number of seconds") from None
        if not value >= minimum:
            raise ValueError(f"must be a number of seconds >= {minimum:g}")
        return value
    return parse


def _whole(floor: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("must be a whole number") from None
        if value < floor:
            raise ValueError(f"must be >= {floor}")
        return value
    return parse


def _one_of(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip()
        if value not in choices:
            raise ValueError("must be " + " or ".join(repr(c) for c in choices))
        return value
    return parse


_OFF_WORDS = ("0", "false", "no", "off")


def _switch(raw: str) -> bool:
    """On unless one of the off words: a switch never refuses a value."""
    return raw.strip().lower() not in _OFF_WORDS


def _slurmd_check(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value == 0 or 1.0 <= value <= 3600.0):
        raise ValueError("seconds between checks of the local slurmd, 0 (off) or 1 to 3600")
    return value


def _port(raw: str) -> int:
    text = raw.strip()
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError("the local slurmd's TCP port, 1 to 65535")
    return int(text)


def _command(raw: str) -> list[str]:
    """A command line, split as a shell would (no shell involved)."""
    return shlex.split(raw.strip())


def _log_level(raw: str) -> str:
    """A level name of Python's logging, exactly as ``logging.basicConfig`` takes it."""
    value = raw.strip()
    if not isinstance(logging.getLevelName(value), int):
        raise ValueError("must be a logging level: DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return value


# ---------------------------------------------------------------- the session's process (coordinator, front ends)

SCHEDULER = _knob(
    "ELASTIC_RAY_SCHEDULER", "'local' or 'slurm'", None,
    "the scheduler a new session submits to when the code names none (Session.create, Dagster's mode)",
    ("config/scheduler_choice.py", "dagster/resources.py"), _one_of("local", "slurm"), choices=("local", "slurm"))
SESSION = _knob(
    "ELASTIC_RAY_SESSION", "path", None,
    "the session directory of `elastic-ray session` commands given no DIR, and of session files without "
    "a path; set for every payload driver",
    ("cli/output.py", "config/session_file.py"), _as_is, set_by=("coordinator/drivers.py",))
HEAD_JOB = _knob(
    "ELASTIC_RAY_HEAD_JOB", "Slurm job id", None,
    "set for every payload driver: the job id of the head it runs against (for the payload to read)",
    (), _word, set_by=("coordinator/drivers.py",))
SESSION_ROOT = _knob(
    "ELASTIC_RAY_SESSION_ROOT", "path", None,
    "where the Dagster resources keep run sessions when session_root is not set "
    "(unset: ~/.elastic-ray/sessions)",
    ("dagster/run_session.py",), _word)
SHARED_ANSWERS = _knob(
    "ELASTIC_RAY_SHARED_ANSWERS", "switch", True,
    "0 (or false, no, off) makes every waiting process ask the scheduler itself, unpaced, "
    "instead of sharing one stored answer",
    ("coordinator/allocations/answers.py",), _switch)
AUTOSCALE_INTERVAL = _knob(
    "ELASTIC_RAY_AUTOSCALE_INTERVAL", "seconds", defaults.AUTOSCALE_INTERVAL,
    "how often the process holding a session's autoscaler lease reads Ray's demand and decides "
    "(one call to the head's GCS, through the probe process it keeps)",
    ("coordinator/scaling/runner.py",), _number(0.2), minimum=0.2)
AUTOSCALE_DEMAND_POLL = _knob(
    "ELASTIC_RAY_AUTOSCALE_DEMAND_POLL", "seconds", defaults.AUTOSCALE_DEMAND_POLL,
    "between two autoscaler turns, how often the lease holder looks at Ray's demand alone (one call "
    "through the same probe); demand not asked for before starts a turn at once (0: only the turns)",
    ("coordinator/scaling/runner.py",), _number(0.0), minimum=0.0)
DETACHED_IDLE_INTERVAL = _knob(
    "ELASTIC_RAY_DETACHED_IDLE_INTERVAL", "seconds", defaults.DETACHED_IDLE_INTERVAL,
    "SSH mode: how often the detached supervisor looks whether every job of its session ended",
    ("coordinator/detached_run.py",), _number(0.0), minimum=0.0)
REMOTE_LOG = _knob(
    "ELASTIC_RAY_REMOTE_LOG", "logging level", "WARNING",
    "SSH mode: the log level of the cluster side of each call (its stderr reaches the client's)",
    ("remote/server.py",), _log_level)
LOG_FORMAT = _knob(
    "ELASTIC_RAY_LOG_FORMAT", "'text' or 'json'", "text",
    "how `elastic-ray` writes its log lines to stderr: text, or one JSON object per line (--log-format)",
    ("cli/main.py",), _one_of("text", "json"), choices=("text", "json"))

# ---------------------------------------------------------------- simulations, tests and the demo payload

RAY_EXECUTABLE = _knob(
    "ELASTIC_RAY_RAY_EXECUTABLE", "program", None,
    "simulations and tests only: the program agents run as `<it> start ...` instead of Ray's `ray`",
    ("agent/node/simulation.py",), _word)
GCS_PROBE = _knob(
    "ELASTIC_RAY_GCS_PROBE", "command", None,
    "simulations and tests only: the command agents run instead of their GCS probe",
    ("agent/node/simulation.py",), _command)
PAYLOAD_TRACE = _knob(
    "ELASTIC_RAY_PAYLOAD_TRACE", "path", None,
    "a file the demo payload appends a line to per unit it starts (the fault matrix reads it)",
    ("demo/payload.py",), _as_is)
PAYLOAD_UNIT_SECONDS = _knob(
    "ELASTIC_RAY_PAYLOAD_UNIT_SECONDS", "seconds", 0.3,
    "how long each unit of the demo payload works",
    ("demo/payload.py",), _number(0.0), minimum=0.0)

# ---------------------------------------------------------------- a node (set by the local scheduler, or by hand)

NODE_IP = _knob(
    "ELASTIC_RAY_NODE_IP", "address", None,
    "this node's address when the launcher names neither network_interface nor node_ip_address_command "
    "(the local scheduler sets it for each emulated node)",
    ("agent/node/node_address.py",), _as_is, set_by=("scheduler/local/record.py",))

# ---------------------------------------------------------------- the agent (forwarded to every node)

POLL_INTERVAL = _knob(
    "ELASTIC_AGENT_POLL_INTERVAL", "seconds", defaults.POLL_INTERVAL,
    "how often an agent reads the ray_head pointer", ("agent/cli.py",), _number(0.05), minimum=0.05)
HEAD_LOST_AFTER = _knob(
    "ELASTIC_AGENT_HEAD_LOST_AFTER", "seconds", defaults.HEAD_LOST_AFTER,
    "heartbeat silence after which an agent takes its head for lost", ("agent/cli.py",), _number(0.2), minimum=0.2)
GPU_SAMPLE_INTERVAL = _knob(
    "ELASTIC_AGENT_GPU_SAMPLE_INTERVAL", "seconds", defaults.GPU_SAMPLE_INTERVAL,
    "how often an agent on a node with GPUs reads their load from Ray's metrics (GPU-hours idle)",
    ("agent/runner.py",), _number(1.0), minimum=1.0)
BACKOFF_BASE = _knob(
    "ELASTIC_AGENT_BACKOFF_BASE", "seconds", defaults.BACKOFF_BASE,
    "the first delay before a Ray node that ended is started again (it doubles each time, "
    f"up to {defaults.BACKOFF_MAX:g} s)", ("agent/cli.py",), _number(0.0), minimum=0.0)
START_TIMEOUT = _knob(
    "ELASTIC_AGENT_START_TIMEOUT", "seconds", defaults.START_TIMEOUT,
    "how long a `ray start` may take to join before the start counts as failed",
    ("agent/cli.py",), _number(1.0), minimum=1.0)
HEAD_DRAIN_LEAD = _knob(
    "ELASTIC_AGENT_HEAD_DRAIN_LEAD", "seconds", defaults.HEAD_DRAIN_LEAD,
    "how long before its walltime a head without a pre-walltime signal is drained",
    ("agent/cli.py",), _number(0.0), minimum=0.0)
REJOIN_ORDER = _knob(
    "ELASTIC_AGENT_REJOIN_ORDER", "'host-first' or 'all'", "host-first",
    "after the head moved, workers on the hosting node's machine wait for its worker (host-first) "
    "or all restart at once", ("agent/cli.py",), _one_of("host-first", "all"), choices=("host-first", "all"))
STANDBY_WORKER = _knob(
    "ELASTIC_AGENT_STANDBY_WORKER", "'on' or 'off'", "on",
    "a node keeping a standby head also keeps a worker joined to it, taken over when the standby becomes "
    "the run's head (off: a fresh ray start then)", ("agent/runner.py",), _one_of("on", "off"),
    choices=("on", "off"))
AGENT_LOG_FORMAT = _knob(
    "ELASTIC_AGENT_LOG_FORMAT", "'text' or 'json'", "text",
    "how an agent writes its log lines (its log file and stderr): text, or one JSON object per line "
    "(--log-format)", ("agent/cli.py",), _one_of("text", "json"), choices=("text", "json"))
SLURMD_CHECK = _knob(
    "ELASTIC_AGENT_SLURMD_CHECK", "seconds", defaults.SLURMD_CHECK_INTERVAL,
    "seconds between an agent's looks at its node's slurmd (0 turns the check off)",
    ("agent/slurm/slurmd_watch.py",), _slurmd_check)
SLURMD_PORT = _knob(
    "ELASTIC_AGENT_SLURMD_PORT", "TCP port", None,
    "the port of the node's slurmd (unset: slurm.conf's SlurmdPort, else 6818)",
    ("agent/slurm/slurmd_watch.py",), _port)
HEALTH_CHECK_PERIOD_MS = _knob(
    "ELASTIC_AGENT_HEALTH_CHECK_PERIOD_MS", "milliseconds", defaults.HEALTH_CHECK_PERIOD_MS,
    "the head GCS checks each Ray node this often", ("agent/node/health_check.py",), _whole(100), minimum=100)
HEALTH_CHECK_TIMEOUT_MS = _knob(
    "ELASTIC_AGENT_HEALTH_CHECK_TIMEOUT_MS", "milliseconds", defaults.HEALTH_CHECK_TIMEOUT_MS,
    "how long one health check may take", ("agent/node/health_check.py",), _whole(100), minimum=100)
HEALTH_CHECK_FAILURE_THRESHOLD = _knob(
    "ELASTIC_AGENT_HEALTH_CHECK_FAILURE_THRESHOLD", "count", defaults.HEALTH_CHECK_FAILURE_THRESHOLD,
    "failed health checks in a row after which the head GCS lists a node DEAD",
    ("agent/node/health_check.py",), _whole(1), minimum=1)
HEALTH_CHECK_INITIAL_DELAY_MS = _knob(
    "ELASTIC_AGENT_HEALTH_CHECK_INITIAL_DELAY_MS", "milliseconds", defaults.HEALTH_CHECK_INITIAL_DELAY_MS,
    "how long after a node registers the head GCS checks it first",
    ("agent/node/health_check.py",), _whole(100), minimum=100)
RUNTIME_DIR = _knob(
    "ELASTIC_AGENT_RUNTIME_DIR", "path", None,
    "the node-local directory of the agents' status files, which `elastic-agent status` reads "
    "(unset: a private per-user directory)",
    ("agent/status.py",), _as_is)


def forwarded_agent_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every ``ELASTIC_AGENT_*`` variable of ``environ`` (default: this process's), as set.

    Not checked here: each node's agent reads and checks them (a bad one
    stops the agent with the variable's name), as it always did."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(AGENT_PREFIX)}


__all__ = ["AGENT_PREFIX", "REGISTRY", "Knob", "KnobError", "forwarded_agent_env"]
