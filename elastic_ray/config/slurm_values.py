"""The one vocabulary of Slurm value forms: times, memory, signals, job ids,
job names and host lists.

Pure functions, no I/O. They exist so that a bad ``time_limit`` or ``mem`` is
refused when the config object is built, on the user's laptop, with a message
that names the field, instead of minutes later as an sbatch error on the
cluster (or, worse, silently reinterpreted by Slurm). The records, the
scheduler backends, the agent and the CLI check job ids, job names and
signals with these same functions, so a value one part writes is a value
every other part accepts.

Every pattern here is matched in full (``re.fullmatch``) and over ASCII only
(explicit ``[0-9]`` classes, ``re.ASCII`` where a flag could widen a class):
``re.match`` with ``$`` lets one trailing newline through, and ``\\d`` or
``str.isdigit`` accept digits of other scripts ('١٢٣'), which ``int()`` then
quietly converts.
"""

from __future__ import annotations

import itertools
import re
import signal as _signal
from dataclasses import dataclass

from ..errors import ConfigError

_TIME_PATTERNS = (
    # (regex, names of the groups in order days, hours, minutes, seconds)
    (re.compile(r"([0-9]+)"), ("minutes",)),
    (re.compile(r"([0-9]+):([0-9]+)"), ("minutes", "seconds")),
    (re.compile(r"([0-9]+):([0-9]+):([0-9]+)"), ("hours", "minutes", "seconds")),
    (re.compile(r"([0-9]+)-([0-9]+)"), ("days", "hours")),
    (re.compile(r"([0-9]+)-([0-9]+):([0-9]+)"), ("days", "hours", "minutes")),
    (re.compile(r"([0-9]+)-([0-9]+):([0-9]+):([0-9]+)"), ("days", "hours", "minutes", "seconds")),
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
    # isascii first: 'ınfınıte'.upper() (dotless i) is 'INFINITE'.
    if value.isascii() and value.upper() in _UNLIMITED:
        return None
    for pattern, names in _TIME_PATTERNS:
        match = pattern.fullmatch(value)
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


# re.ASCII also keeps IGNORECASE from folding the Kelvin sign (U+212A) into K.
_MEMORY = re.compile(r"([0-9]+)([KMGT]?)", re.IGNORECASE | re.ASCII)
_MEMORY_FACTOR_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def parse_memory_mb(text: str) -> float:
    """Megabytes in a Slurm memory value (``16G``, ``200000M``, ``512``).

    A bare number means megabytes, as in sbatch. ``0`` is allowed: Slurm
    reads it as "all memory of the node".
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string such as '16G', got {type(text).__name__}")
    match = _MEMORY.fullmatch(text.strip())
    if not match:
        raise ValueError("not a Slurm memory size (a whole number with an optional K, M, G or T suffix)")
    return int(match.group(1)) * _MEMORY_FACTOR_MB[match.group(2).upper()]


# --------------------------------------------------------------------------
# Signals.

# Signals that cannot be caught: asking Slurm to send them "before the
# timeout" would kill the agent instead of starting a drain.
UNTRAPPABLE_SIGNALS = frozenset({"KILL", "STOP"})
# Slurm stores the warning time of --signal in 16 bits.
MAX_SIGNAL_SECONDS = 0xFFFF


def parse_signal_name(value: object) -> _signal.Signals:
    """``"USR1"``, ``"SIGUSR1"``, ``"usr1"``, ``"10"`` or ``10`` -> ``Signals.SIGUSR1``.

    The one reading of a signal for every part: the config's
    ``signal_before_timeout``, ``scancel --signal`` and the local scheduler.
    Blanks around the text are ignored; anything that is not ASCII is refused
    before upper-casing (``"sıgterm".upper()`` is ``"SIGTERM"``). Aliases
    resolve to the canonical signal (``IOT`` -> ``SIGABRT``), so every part
    names a signal the same way. Raises ``ValueError`` whose text says
    "signal".
    """
    if isinstance(value, int) and not isinstance(value, bool):
        number: int = value
    elif isinstance(value, str):
        if not value.isascii():
            raise ValueError(f"unknown signal {value!r} (signal names and numbers are ASCII)")
        text = value.strip().upper()
        if text.isdigit():
            # No signal number has more than a few digits; a longer string is
            # refused before int() could object to it in its own words.
            if len(text.lstrip("0")) > 4:
                raise ValueError(f"unknown signal number {text[:24]}")
            number = int(text)
        else:
            member = _signal.Signals.__members__.get(text if text.startswith("SIG") else "SIG" + text)
            if member is None:
                raise ValueError(f"unknown signal {value!r}")
            return member
    else:
        raise ValueError(f"a signal must be a name such as 'TERM' or a number, got {type(value).__name__}")
    try:
        return _signal.Signals(number)
    except ValueError:
        raise ValueError(f"unknown signal number {number}") from None


def signal_name(value: object) -> str:
    """The name without ``SIG`` (``"TERM"``), as sbatch and scancel take it."""
    return parse_signal_name(value).name[3:]


@dataclass(frozen=True)
class SignalSpec:
    """A parsed ``signal_before_timeout`` (``TERM@600``)."""

    name: str  # without the SIG prefix, upper case: "TERM", "USR1"
    seconds: int

    def sbatch_value(self) -> str:
        return f"{self.name}@{self.seconds}"


_SIGNAL_SPEC = re.compile(r"([A-Za-z0-9+]+)@([0-9]+)")


def parse_signal(text: str) -> SignalSpec:
    """Parse ``SIG@SECONDS``: a catchable signal and a positive lead time.

    Slurm's ``B:`` and ``R:`` prefixes are refused on purpose: the agent runs as
    a job step, and ``B:`` would signal only the batch shell, so the drain
    would never start.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected a string such as 'TERM@600', got {type(text).__name__}")
    value = text.strip()
    if ":" in value:
        raise ValueError("prefixes such as B: or R: are not supported; the agent, a job step, must get the signal")
    match = _SIGNAL_SPEC.fullmatch(value)
    if not match:
        raise ValueError("expected SIGNAL@SECONDS, for example TERM@600")
    name = signal_name(match.group(1))
    if name in UNTRAPPABLE_SIGNALS:
        raise ValueError(f"SIG{name} cannot be caught, so it cannot start a drain; use TERM or USR1")
    # Compare the digits before int(): a string of thousands of digits is
    # out of range, not a reason for int() to refuse it with its own words.
    digits = match.group(2).lstrip("0")
    if not digits or len(digits) > len(str(MAX_SIGNAL_SECONDS)) or int(digits) > MAX_SIGNAL_SECONDS:
        raise ValueError(f"seconds must be between 1 and {MAX_SIGNAL_SECONDS}")
    return SignalSpec(name, int(digits))


# --------------------------------------------------------------------------
# Job ids.

# What sbatch --parsable and squeue's %A print: a plain number. Slurm's ids
# are 32-bit; 20 digits leaves room for any backend without letting an
# unbounded string through. Refusing everything else also keeps a value that
# starts with '-' from ever reaching a Slurm command as an option, and makes
# the id safe as a file name in the session directory. Leading zeros are
# accepted as before (Slurm never prints them).
JOB_ID_MAX_DIGITS = 20
_JOB_ID = re.compile(r"[0-9]{1,%d}" % JOB_ID_MAX_DIGITS)


def is_job_id(value: object) -> bool:
    """True for a string of 1 to 20 ASCII digits."""
    return isinstance(value, str) and _JOB_ID.fullmatch(value) is not None


def check_job_id(value: object, field: str = "job_id") -> str:
    """``value`` if it is a job id (:func:`is_job_id`); else ConfigError naming ``field``."""
    if not is_job_id(value):
        raise ConfigError(field, value, f"is not a job id (a Slurm job id: 1 to {JOB_ID_MAX_DIGITS} digits 0-9)")
    return value  # type: ignore[return-value]


# --------------------------------------------------------------------------
# Job names.

# A session's job name ends up in `#SBATCH --job-name=`, in `squeue --name=`
# and `scancel --name=`, in session.json and in the names of the kept batch
# scripts. squeue reads --name as a comma-separated list, so a comma would
# make a session see another session's jobs; blanks, quotes, '#', '$' and
# backslashes would be mangled by sbatch's #SBATCH tokenizer or a shell; '/'
# would leave the directory. Letters, digits, '_', '.' and '-' are safe in
# all of these places.
JOB_NAME_MAX = 128
_JOB_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,%d}" % JOB_NAME_MAX)


def is_job_name(value: object) -> bool:
    """True for 1 to 128 ASCII letters, digits, '_', '.' or '-'."""
    return isinstance(value, str) and _JOB_NAME.fullmatch(value) is not None


def check_job_name(value: object, field: str = "job_name") -> str:
    """``value`` if it is a job name (:func:`is_job_name`); else ConfigError naming ``field``."""
    if not is_job_name(value):
        raise ConfigError(field, value, f"is not a valid job name (1 to {JOB_NAME_MAX} ASCII letters, digits, "
                                        "'_', '.' or '-'; no blanks, commas, quotes, '#' or '$')")
    return value  # type: ignore[return-value]


# --------------------------------------------------------------------------
# Host lists.

# A host list cannot reasonably name more hosts than this; a range such as
# node[1-999999999] is refused instead of eating the coordinator's memory.
MAX_HOSTS = 100_000
_NO_NODES = frozenset({"", "(NULL)", "NONE ASSIGNED", "NONE"})
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
# The characters a user's nodelist/exclude may use: host names, brackets,
# ranges and commas. No blanks, no '/' (sbatch would read a file), nothing a
# shell or sbatch's #SBATCH tokenizer treats specially.
_HOSTLIST_CHARS = re.compile(r"[A-Za-z0-9_.\-\[\],]+")


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets; refuse unbalanced brackets."""
    items, depth, current = [], 0, []
    for char in text:
        if char == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested '[' in host list {text!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in host list {text!r}")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth:
        raise ValueError(f"unbalanced '[' in host list {text!r}")
    items.append("".join(current))
    return items


def _expand_range_set(body: str, whole: str) -> list[str]:
    """``1-3,07`` -> ['1', '2', '3', '07']; zero padding follows the low bound."""
    numbers: list[str] = []
    for part in body.split(","):
        match = _RANGE.fullmatch(part)
        if not match:
            raise ValueError(f"bad range {part!r} in host list {whole!r}")
        low, high = match.group(1), match.group(2)
        if high is None:
            numbers.append(low)
            continue
        if int(high) < int(low):
            raise ValueError(f"range {part!r} runs backwards in host list {whole!r}")
        if int(high) - int(low) + 1 > MAX_HOSTS:
            raise ValueError(f"range {part!r} in host list {whole!r} names more than {MAX_HOSTS} hosts")
        width = len(low)
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    return numbers


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Every host name in a Slurm host list, in order.

    ``cpu-[1-2],gpua-1`` -> ``('cpu-1', 'cpu-2', 'gpua-1')``. Several bracket
    groups in one name expand to their product (``r[1-2]n[1-2]``). An empty
    list (a pending job) and Slurm's ``(null)`` / ``None assigned`` give ().
    Pure, so the coordinator never needs ``scontrol show hostnames``.
    Raises ``ValueError`` whose text says "host list".
    """
    value = text.strip()
    if value.upper() in _NO_NODES:
        return ()
    if re.search(r"\s", value):
        raise ValueError(f"blank inside host list {text!r}")
    hosts: list[str] = []
    for item in _split_top_level(value):
        if not item:
            raise ValueError(f"empty host name in host list {text!r}")
        pieces = re.split(r"(\[[^\[\]]*\])", item)
        choices: list[list[str]] = []
        for piece in pieces:
            if piece.startswith("["):
                choices.append(_expand_range_set(piece[1:-1], text))
            elif piece:
                choices.append([piece])
        count = 1
        for options in choices:
            count *= len(options)
        if len(hosts) + count > MAX_HOSTS:
            raise ValueError(f"host list {text[:80]!r} names more than {MAX_HOSTS} hosts")
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    return tuple(hosts)


def check_hostlist(value: object, field: str) -> str:
    """A user's host list (``nodelist``, ``exclude``): safe characters and a
    well-formed list (balanced brackets, ascending ranges), so a typo is
    refused here, naming the field, not by sbatch on the cluster."""
    if not isinstance(value, str) or not _HOSTLIST_CHARS.fullmatch(value):
        raise ConfigError(field, value, "must be a Slurm host list (host names, [ranges] and commas)")
    try:
        expand_hostlist(value)
    except ValueError as exc:
        raise ConfigError(field, value, f"must be a Slurm host list: {exc}") from None
    return value
