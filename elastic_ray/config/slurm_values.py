"""Parsers for the value forms Slurm accepts in sbatch options.

Pure functions, no I/O. They exist so that a bad ``time_limit`` or ``mem`` is
refused when the config object is built, on the user's laptop, with a message
that names the field, instead of minutes later as an sbatch error on the
cluster (or, worse, silently reinterpreted by Slurm).
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

# Signals that cannot be caught: asking Slurm to send them "before the
# timeout" would kill the agent instead of starting a drain.
UNTRAPPABLE_SIGNALS = frozenset({"KILL", "STOP"})

_TIME_PATTERNS = (
    # (regex, names of the groups in order days, hours, minutes, seconds)
    (re.compile(r"^(\d+)$"), ("minutes",)),
    (re.compile(r"^(\d+):(\d+)$"), ("minutes", "seconds")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("hours", "minutes", "seconds")),
    (re.compile(r"^(\d+)-(\d+)$"), ("days", "hours")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("days", "hours", "minutes")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("days", "hours", "minutes", "seconds")),
)
_UNLIMITED = frozenset({"UNLIMITED", "INFINITE"})


def parse_slurm_time(text: str) -> int | None:
    """Return the number of seconds in a Slurm time string, None for UNLIMITED.

    Accepted forms are sbatch's: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM``, ``D-HH:MM:SS`` and ``UNLIMITED``/``INFINITE``. A component that
    follows a larger one must be in range (``1:75`` is refused), because
    Slurm's own normalisation of such values surprises people; the leading
    component may be as large as it likes (``90`` minutes is fine).
    Raises ``ValueError`` with a reason.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string, got {type(text).__name__}")
    value = text.strip()
    if value.upper() in _UNLIMITED:
        return None
    for pattern, names in _TIME_PATTERNS:
        match = pattern.match(value)
        if not match:
            continue
        parts = dict(zip(names, (int(g) for g in match.groups())))
        leading = names[0]
        limits = {"hours": 24, "minutes": 60, "seconds": 60}
        for name, number in parts.items():
            if name != leading and name in limits and number >= limits[name]:
                raise ValueError(f"{name} must be below {limits[name]} in {text!r}")
        seconds = (parts.get("days", 0) * 86400 + parts.get("hours", 0) * 3600
                   + parts.get("minutes", 0) * 60 + parts.get("seconds", 0))
        if seconds <= 0:
            raise ValueError("must be longer than zero")
        return seconds
    raise ValueError("not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED)")


def format_slurm_time(seconds: int | None) -> str:
    """Inverse of :func:`parse_slurm_time` in the ``D-HH:MM:SS`` form."""
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"


_MEMORY = re.compile(r"^(\d+)([KMGT]?)$", re.IGNORECASE)
_MEMORY_FACTOR_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_memory_mb(text: str) -> float:
    """Megabytes in a Slurm memory value (``16G``, ``200000M``, ``512``).

    A bare number means megabytes, as in sbatch. ``0`` is allowed: Slurm
    reads it as "all memory of the node".
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string such as '16G', got {type(text).__name__}")
    match = _MEMORY.match(text.strip())
    if not match:
        raise ValueError("not a Slurm memory size (a whole number with an optional K, M, G or T suffix)")
    return int(match.group(1)) * _MEMORY_FACTOR_MB[match.group(2).upper()]


@dataclass(frozen=True)
class SignalSpec:
    """A parsed ``signal_before_timeout`` (``TERM@600``)."""

    name: str  # without the SIG prefix, upper case: "TERM", "USR1"
    seconds: int

    def sbatch_value(self) -> str:
        return f"{self.name}@{self.seconds}"


_SIGNAL = re.compile(r"^(?:SIG)?([A-Z0-9+]+)@(\d+)$")
# Slurm stores the warning time in 16 bits.
MAX_SIGNAL_SECONDS = 0xFFFF


def parse_signal(text: str) -> SignalSpec:
    """Parse ``SIG@SECONDS``: a catchable signal and a positive lead time.

    Slurm's ``B:`` and ``R:`` prefixes are refused on purpose: the agent runs as
    a job step, and ``B:`` would signal only the batch shell, so the drain
    would never start.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string such as 'TERM@600', got {type(text).__name__}")
    value = text.strip().upper()
    if ":" in value:
        raise ValueError("prefixes such as B: or R: are not supported; the agent, a job step, must get the signal")
    match = _SIGNAL.match(value)
    if not match:
        raise ValueError("expected SIGNAL@SECONDS, for example TERM@600")
    name, seconds = match.group(1), int(match.group(2))
    if name.isdigit():
        try:
            name = _signal.Signals(int(name)).name[3:]
        except ValueError:
            raise ValueError(f"unknown signal number {name}") from None
    elif not hasattr(_signal.Signals, "SIG" + name):
        raise ValueError(f"unknown signal {name}")
    if name in UNTRAPPABLE_SIGNALS:
        raise ValueError(f"SIG{name} cannot be caught, so it cannot start a drain; use TERM or USR1")
    if not 0 < seconds <= MAX_SIGNAL_SECONDS:
        raise ValueError(f"seconds must be between 1 and {MAX_SIGNAL_SECONDS}")
    return SignalSpec(name, seconds)
