"""Slurm's output in, typed values out: the pure half of the Slurm backend.

The parsers accept exactly the forms Slurm prints and raise ``ValueError``
with the offending text on anything else, so a format change shows up as a
clear error instead of a job silently reported in the wrong state. They are
tested exhaustively in ``tests/test_slurm_parsing.py``. The pure rules for
the commands' environment and the kept script's name live here too; the
shell that runs the commands is ``scheduler/slurm.py``.
"""

from __future__ import annotations

import calendar
import logging
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace

from ..config.slurm_values import expand_hostlist, is_job_id, signal_name
from .base import JobInfo, JobState
from .states import is_known_state, translate_state

log = logging.getLogger("elastic_ray.scheduler.slurm")

# --------------------------------------------------------------------------
# squeue's output format.
#
# One line per job, fields separated by the ASCII unit separator, a control
# character that no job id, state, partition, host list or timestamp can
# contain. The reason comes last and the line is split at most
# len(fields) - 1 times, so even a free-text reason cannot shift the fields.
# The comment (free text too, but ours: the submission marker) comes just
# before it, so a separator inside a comment could only move text between
# comment and reason, never into the fields the coordinator decides on.

FIELD_SEP = "\x1f"
SQUEUE_FIELDS = (
    ("job_id", "%A"),      # numeric id (unique per array element, unlike %i)
    ("name", "%j"),
    ("state", "%T"),       # long state name
    ("partition", "%P"),
    ("nodes", "%N"),       # compressed host list; empty while pending
    ("submit_time", "%V"),
    ("start_time", "%S"),  # a prediction while pending
    ("end_time", "%e"),    # the expected end while running
    ("time_left", "%L"),
    ("user", "%u"),        # the owner's user name
    ("comment", "%k"),     # the submission marker (sbatch --comment)
    ("reason", "%r"),      # last: see above
)
SQUEUE_FORMAT = FIELD_SEP.join(code for _, code in SQUEUE_FIELDS)

# Job ids, job names, signals and host lists follow the one vocabulary in
# config/slurm_values.py (check_job_id, check_job_name, signal_name,
# expand_hostlist); the patterns below are output forms only Slurm prints.
# All are matched in full and over ASCII digits: '\d' would take '١٢٣'.
_NO_TIME = frozenset({"", "N/A", "NONE", "UNKNOWN", "(NULL)"})
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}")
_NO_TIME_LEFT = frozenset({"UNLIMITED", "INFINITE", "NOT_SET", "INVALID", "N/A", "NONE"})
_TIME_LEFT = (
    re.compile(r"(?P<d>[0-9]+)-(?P<h>[0-9]{1,2}):(?P<m>[0-9]{2}):(?P<s>[0-9]{2})"),
    re.compile(r"(?P<h>[0-9]+):(?P<m>[0-9]{2}):(?P<s>[0-9]{2})"),
    re.compile(r"(?P<m>[0-9]+):(?P<s>[0-9]{2})"),
)
_SBATCH_PARSABLE = re.compile(r"([0-9]+)(?:;[A-Za-z0-9_.\-]+)?")


def parse_sbatch_parsable(stdout: str) -> str:
    """The job id from ``sbatch --parsable``: ``12345`` or ``12345;cluster``."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if len(lines) != 1:
        raise ValueError(f"expected one line 'JOBID[;CLUSTER]' from sbatch --parsable, got {stdout!r}")
    match = _SBATCH_PARSABLE.fullmatch(lines[0])
    if not match or not is_job_id(match.group(1)):
        raise ValueError(f"expected 'JOBID[;CLUSTER]' from sbatch --parsable, got {lines[0]!r}")
    return match.group(1)


def parse_slurm_timestamp(text: str) -> float | None:
    """Epoch seconds for a Slurm ``YYYY-MM-DDTHH:MM:SS`` printed in UTC.

    ``N/A``, ``None``, ``Unknown`` and an empty field mean "no such time".
    """
    value = text.strip()
    if value.upper() in _NO_TIME:
        return None
    if not _TIMESTAMP.fullmatch(value):
        raise ValueError(f"not a Slurm timestamp (YYYY-MM-DDTHH:MM:SS): {text!r}")
    try:
        return float(calendar.timegm(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))
    except ValueError as exc:
        raise ValueError(f"not a valid date: {text!r} ({exc})") from None


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's ``%L`` (``1-02:03:04``, ``2:03:04``, ``3:04``).

    ``UNLIMITED``, ``NOT_SET``, ``INVALID`` and ``N/A`` mean "no finite time
    left to report" and give None.
    """
    value = text.strip()
    if value.upper() in _NO_TIME_LEFT:
        return None
    for pattern in _TIME_LEFT:
        match = pattern.fullmatch(value)
        if match:
            parts = {k: int(v) for k, v in match.groupdict().items()}
            # Only the leading component may exceed its usual range.
            limits = {"s": 60, "m": 60 if "h" in parts else None, "h": 24 if "d" in parts else None}
            if any(limit is not None and parts.get(key, 0) >= limit for key, limit in limits.items()):
                raise ValueError(f"time left out of range: {text!r}")
            return float(parts.get("d", 0) * 86400 + parts.get("h", 0) * 3600
                         + parts["m"] * 60 + parts["s"])
    raise ValueError(f"not a Slurm time left (D-HH:MM:SS, HH:MM:SS, MM:SS or UNLIMITED): {text!r}")


def _timing(state: JobState, submit: float | None, start: float | None, end: float | None,
            time_left: float | None) -> dict[str, float | None]:
    """Times as :class:`JobInfo` reports them.

    For a pending job Slurm fills start and end with *predictions*; reporting
    them would make "start_time is set" mean two things, so a pending job has
    neither. ``time_left`` is only meaningful for a job that holds nodes.
    """
    if state is JobState.PENDING:
        start = end = None
    if not (state.is_active and state is not JobState.PENDING):
        time_left = None
    return {"submit_time": submit, "start_time": start, "end_time": end, "time_left": time_left}


_REPORTED_UNKNOWN: set[str] = set()


def _note_unknown_state(raw: str, job_id: str) -> None:
    """Log a state missing from the table, once per spelling (a poll loop
    would otherwise repeat the same warning every few seconds)."""
    if not is_known_state(raw) and raw not in _REPORTED_UNKNOWN:
        _REPORTED_UNKNOWN.add(raw)
        log.warning("event=unknown_slurm_state job_id=%s raw_state=%r reported_as=%s",
                    job_id, raw, translate_state(raw).value)


def parse_squeue_line(line: str) -> JobInfo:
    """One line of ``squeue --format=SQUEUE_FORMAT``."""
    parts = line.split(FIELD_SEP, len(SQUEUE_FIELDS) - 1)
    if len(parts) != len(SQUEUE_FIELDS):
        raise ValueError(f"expected {len(SQUEUE_FIELDS)} fields, got {len(parts)}: {line!r}")
    raw = dict(zip((name for name, _ in SQUEUE_FIELDS), parts))
    job_id = raw["job_id"].strip()
    if not is_job_id(job_id):
        raise ValueError(f"bad job id {job_id!r} in squeue line {line!r}")
    raw_state = raw["state"].strip()
    state = translate_state(raw_state)
    _note_unknown_state(raw_state, job_id)
    try:
        times = _timing(state, parse_slurm_timestamp(raw["submit_time"]),
                        parse_slurm_timestamp(raw["start_time"]), parse_slurm_timestamp(raw["end_time"]),
                        parse_time_left(raw["time_left"]))
        nodes = expand_hostlist(raw["nodes"])
    except ValueError as exc:
        raise ValueError(f"{exc} (job {job_id}, squeue line {line!r})") from None
    return JobInfo(job_id=job_id, name=raw["name"], state=state, raw_state=raw_state,
                   reason=raw["reason"].strip(), partition=raw["partition"].strip(), nodes=nodes,
                   user=raw["user"].strip(), comment=_no_null(raw["comment"].strip()), **times)


def _no_null(text: str) -> str:
    """squeue and scontrol print an unset comment as ``(null)``."""
    return "" if text == "(null)" else text


def parse_squeue_output(stdout: str) -> dict[str, JobInfo]:
    """Every job in squeue's output, keyed by job id; blank lines are skipped."""
    jobs: dict[str, JobInfo] = {}
    for line in stdout.splitlines():
        if line.strip():
            info = parse_squeue_line(line)
            jobs[info.job_id] = info
    return jobs


_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)=")


def parse_scontrol_fields(line: str) -> dict[str, str]:
    """``Key=value Key2=value two`` -> dict; a value runs to the next `` Key=``.

    ``scontrol show job -o`` prints one job per line this way; values such as
    a reason may contain blanks, so splitting on blanks alone is not enough.
    """
    matches = list(_SCONTROL_KEY.finditer(line))
    fields: dict[str, str] = {}
    for here, nxt in zip(matches, matches[1:] + [None]):
        value = line[here.end(): nxt.start() if nxt else len(line)]
        fields.setdefault(here.group(1), value.strip())
    return fields


def parse_scontrol_job(stdout: str, job_id: str, now: float) -> JobInfo:
    """The job ``job_id`` in ``scontrol show job -o`` output.

    ``scontrol`` gives no time left; for a running job it is computed from the
    end time and ``now``.
    """
    for line in stdout.splitlines():
        fields = parse_scontrol_fields(line)
        if fields.get("JobId") != job_id:
            continue
        if "JobState" not in fields:
            raise ValueError(f"no JobState for job {job_id} in scontrol output {line!r}")
        raw_state = fields["JobState"]
        state = translate_state(raw_state)
        _note_unknown_state(raw_state, job_id)
        end = parse_slurm_timestamp(fields.get("EndTime", ""))
        time_left = None
        if state is JobState.RUNNING and end is not None:
            time_left = max(0.0, end - now)
        times = _timing(state, parse_slurm_timestamp(fields.get("SubmitTime", "")),
                        parse_slurm_timestamp(fields.get("StartTime", "")), end, time_left)
        return JobInfo(job_id=job_id, name=fields.get("JobName", ""), state=state, raw_state=raw_state,
                       reason=fields.get("Reason", ""), partition=fields.get("Partition", ""),
                       nodes=expand_hostlist(fields.get("NodeList", "")),
                       user=fields.get("UserId", "").split("(", 1)[0],
                       comment=_no_null(fields.get("Comment", "")), **times)
    raise ValueError(f"job {job_id} not in scontrol output {stdout[:200]!r}")


SACCT_FIELDS = ("JobID", "State", "Partition", "NodeList", "Submit", "Start", "End", "JobName")
ACCOUNTING_DISABLED = "accounting storage is disabled"


def sacct_rows(stdout: str, fields: tuple[str, ...]) -> Iterator[dict[str, str]]:
    """The non-blank lines of ``sacct -n -P --format=<fields>`` as field -> raw text. The last
    field takes whatever '|' is left (a job name may hold one); a line with fewer fields is a
    ValueError, not a guess."""
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", len(fields) - 1)
        if len(parts) != len(fields):
            raise ValueError(f"expected {len(fields)} '|'-separated fields from sacct, got {line!r}")
        yield dict(zip(fields, parts))


def parse_sacct_output(stdout: str, job_ids: Iterable[str]) -> dict[str, JobInfo]:
    """``sacct -X -n -P --format=SACCT_FIELDS`` lines for the wanted ids.

    The job name comes last so that a '|' in a name cannot shift the other
    fields. A job listed twice (requeued) keeps its last record.
    """
    wanted = set(job_ids)
    jobs: dict[str, JobInfo] = {}
    for row in sacct_rows(stdout, SACCT_FIELDS):
        job_id = row["JobID"].strip()
        if job_id not in wanted:
            continue
        raw_state = row["State"].strip()
        state = translate_state(raw_state)
        _note_unknown_state(raw_state, job_id)
        times = _timing(state, parse_slurm_timestamp(row["Submit"]), parse_slurm_timestamp(row["Start"]),
                        parse_slurm_timestamp(row["End"]), None)
        jobs[job_id] = JobInfo(job_id=job_id, name=row["JobName"], state=state, raw_state=raw_state,
                               partition=row["Partition"].strip(),
                               nodes=expand_hostlist(row["NodeList"]), **times)
    return jobs


_TEST_ONLY = re.compile(r"\bJob ([0-9]+) to start at (\S+)", re.ASCII)


def parse_test_only(stderr: str) -> float:
    """Predicted start (epoch) from ``sbatch --test-only``'s stderr.

    sbatch prints ``sbatch: Job 12 to start at 2026-11-29T23:59:59 using 2
    processors on nodes gpua-1 in partition gpu-a`` on stderr, possibly after
    warnings.
    """
    match = _TEST_ONLY.search(stderr)
    if not match:
        raise ValueError(f"no 'Job N to start at TIME' in sbatch --test-only output: {stderr.strip()!r}")
    start = parse_slurm_timestamp(match.group(2))
    if start is None:
        raise ValueError(f"sbatch --test-only named no start time: {match.group(0)!r}")
    return start


# --------------------------------------------------------------------------
# The argv of the commands that select jobs: pure, so the user filter is
# tested without Slurm.

def squeue_argv(job_name: str, user: str) -> list[str]:
    """The one squeue call per poll: the jobs of that name *and* that user.

    Without ``--user`` a same-named job of another user would be reported as
    ours (and, by name, cancelled or waited for).
    """
    return ["squeue", f"--name={job_name}", f"--user={check_user(user)}", "--states=all", "--noheader",
            f"--format={SQUEUE_FORMAT}"]


def scancel_ids_argv(job_ids: Iterable[str], user: str) -> list[str]:
    """Cancel listed jobs in one call, only those of ``user``: with a filter
    scancel loads the job list and skips a listed job that does not match."""
    return ["scancel", f"--user={check_user(user)}", *job_ids]


def scancel_name_argv(job_name: str, user: str) -> list[str]:
    return ["scancel", f"--name={job_name}", f"--user={check_user(user)}"]


_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@\-]{0,63}\$?")


def check_user(user: object) -> str:
    """A user name (or uid) as squeue and scancel take it; never an option."""
    if not isinstance(user, str) or not _USER.fullmatch(user):
        raise ValueError(f"user={user!r}: not a user name (letters, digits, '_', '.', '@', '-'; "
                         "not starting with '-' or '.')")
    return user


def only_gone_errors(stderr: str, gone: Iterable[str]) -> bool:
    """True when every error line of a multi-id scancel says the job has
    already ended or is unknown (scancel then exits 1 but did the rest)."""
    texts = tuple(gone)
    lines = [line for line in stderr.splitlines() if line.strip()]
    return bool(lines) and all(any(text in line for text in texts) for line in lines)


def ended_unknown(job_id: str, job_name: str) -> JobInfo:
    """What we report for a job nobody remembers (purged, no accounting)."""
    return JobInfo(job_id=job_id, name=job_name, state=JobState.ENDED_UNKNOWN, raw_state="",
                   reason="no record left (purged after MinJobAge, and no accounting answered)")


def normalise_signal(name: object) -> str:
    """``TERM``, ``SIGTERM``, ``term`` or ``15`` -> ``TERM`` (what scancel accepts).

    :func:`~elastic_ray.config.slurm_values.signal_name` under the name the
    scheduler has always used; ValueError says "signal".
    """
    return signal_name(name)


# --------------------------------------------------------------------------
# The environment of the Slurm commands.

# Variables that change what a client command does. SQUEUE_PARTITION=cpu in a
# user's shell would hide every other partition's jobs from our query (and
# make them look purged); SCANCEL_INTERACTIVE would make scancel ask. SLURM_*
# variables inherited from an enclosing job (a payload step that adds a
# worker allocation) are job output, not input: srun in the new job would
# read, e.g., the old job's SLURM_MEM_PER_CPU next to its own --mem and
# refuse to start. SBATCH_* are kept: they are how users and sites set
# defaults (an account, say) for what the config leaves unset.
_CLIENT_PREFIXES = ("SQUEUE_", "SCANCEL_", "SACCT_", "SCONTROL_", "SLURM_")
_KEEP = frozenset({"SLURM_CONF"})


def child_env(base: Mapping[str, str], *, slurm_conf: str | None, query: bool) -> dict[str, str]:
    """The environment for one Slurm command (pure; see the comment above).

    ``query`` commands also get ``TZ=UTC`` and ``SLURM_TIME_FORMAT=standard``
    so that every timestamp is an unambiguous ISO time in UTC. ``sbatch`` keeps
    the user's TZ, because the job inherits the submitting environment.
    """
    env = {k: v for k, v in base.items() if k in _KEEP or not k.startswith(_CLIENT_PREFIXES)}
    if slurm_conf is not None:
        env["SLURM_CONF"] = str(slurm_conf)
    if query:
        env["TZ"] = "UTC"
        env["SLURM_TIME_FORMAT"] = "standard"
    return env


def script_name_prefix(job_name: str, role: str, when: float) -> str:
    """``<job_name>-<role>-<UTC time>-``: the kept batch script's name sorts by
    session, role and time; mkstemp appends a random part, so two submissions
    in the same second never collide."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    return f"{job_name}-{role}-{stamp}-"


# ---------------------------------------------------------------- accounting (sacct), for usage figures

#: What ``session usage --sacct`` asks of sacct, in this order: seconds elapsed, nodes, what was allocated
#: (``cpu=4,mem=8G,node=1,gres/gpu=2``), CPU time used and CPU time allocated (both in seconds).
#: Asked with the steps (no ``-X``): sacct adds the steps' CPU time up into the job's own line only
#: when it reads them, and prints ``TotalCPU`` 00:00:00 for every job under ``-X`` (Slurm 22.05).
USAGE_FIELDS = ("JobID", "ElapsedRaw", "NNodes", "AllocTRES", "TotalCPU", "CPUTimeRAW", "State")


@dataclass(frozen=True)
class JobAccounting:
    """What Slurm's accounting recorded of one job: its own figures, next to the run's event log's."""

    job_id: str
    state: str
    elapsed_seconds: float      # up to now while the job is not over
    nodes: int
    gpus: int                   # GPUs allocated to the whole job (AllocTRES gres/gpu)
    cpu_seconds_used: float | None      # None until the job is over: only ended steps count before
    cpu_seconds_allocated: float | None
    cpus: int = 0               # CPUs allocated to the whole job (AllocTRES cpu)

    @property
    def final(self) -> bool:
        """The record of a job that is over. A job still running, or one whose end slurmdbd has
        not heard of yet (it learns of it from slurmctld seconds later), has figures that still move."""
        return bool(self.state) and translate_state(self.state).is_final

    @property
    def node_hours(self) -> float:
        return self.elapsed_seconds * self.nodes / 3600.0

    @property
    def gpu_hours(self) -> float:
        return self.elapsed_seconds * self.gpus / 3600.0

    @property
    def cpu_efficiency(self) -> float | None:
        """CPU time used over CPU time allocated (sacct's TotalCPU / CPUTimeRAW); None when unknown."""
        if not self.cpu_seconds_allocated or self.cpu_seconds_used is None:
            return None
        return self.cpu_seconds_used / self.cpu_seconds_allocated

    def to_dict(self) -> dict[str, object]:
        return {"job": self.job_id, "state": self.state, "final": self.final,
                "elapsed_seconds": self.elapsed_seconds, "nodes": self.nodes, "cpus": self.cpus,
                "gpus": self.gpus, "node_hours": round(self.node_hours, 4), "gpu_hours": round(self.gpu_hours, 4),
                "cpu_seconds": self.cpu_seconds_used, "cpu_efficiency":
                    None if self.cpu_efficiency is None else round(self.cpu_efficiency, 4)}


def parse_cpu_time(text: str) -> float | None:
    """sacct's TotalCPU (``[D-][HH:]MM:SS[.mmm]``) in seconds; None when empty or unreadable."""
    text = text.strip()
    if not text:
        return None
    days = 0
    if "-" in text:
        head, text = text.split("-", 1)
        if not head.isdigit():
            return None
        days = int(head)
    parts = text.split(":")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        return None
    if not 2 <= len(values) <= 3 or any(v < 0 for v in values):
        return None
    while len(values) < 3:
        values.insert(0, 0.0)
    hours, minutes, seconds = values
    return days * 86400 + hours * 3600 + minutes * 60 + seconds


def tres_count(tres: str, name: str) -> int:
    """The count of one TRES (``gres/gpu``, ``node``) in an AllocTRES string; 0 when absent."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key.strip() == name and value.strip().isdigit():
            return int(value)
    return 0


def parse_usage_output(stdout: str, job_ids: Iterable[str]) -> dict[str, JobAccounting]:
    """``sacct -n -P --format=USAGE_FIELDS`` lines for the wanted ids: each job's own line (its steps',
    ``81231.batch``, are not asked for); a line that cannot be read is left out."""
    wanted = set(job_ids)
    found: dict[str, JobAccounting] = {}
    for line in stdout.splitlines():
        fields = line.split("|")
        if len(fields) != len(USAGE_FIELDS) or fields[0] not in wanted:
            continue
        job, elapsed, nodes, tres, total_cpu, cpu_raw, state = fields
        if not elapsed.strip().isdigit() or not nodes.strip().isdigit():
            continue
        record = JobAccounting(job_id=job, state=state.split()[0] if state.strip() else "", elapsed_seconds=float(elapsed),
                               # NNodes of a job that never started is what it asked for; it held none.
                               nodes=int(nodes) if tres.strip() else 0, gpus=tres_count(tres, "gres/gpu"),
                               cpu_seconds_used=parse_cpu_time(total_cpu),
                               cpu_seconds_allocated=float(cpu_raw) if cpu_raw.strip().isdigit() else None,
                               cpus=tres_count(tres, "cpu"))
        if not record.final:    # TotalCPU counts the steps that ended so far: not the job's figure yet
            record = replace(record, cpu_seconds_used=None)
        found[job] = record
    return found


STEP_FIELDS = ("JobID", "State", "JobName")


def parse_step_states(stdout: str, job_id: str, step_name: str) -> dict[str, JobState]:
    """``sacct -n -P --format=STEP_FIELDS`` lines (steps included): the state of each step
    of ``job_id`` named ``step_name``, by step id. The job's own line, its batch and extern
    steps and other steps are left out; the name comes last (a '|' in it shifts nothing)."""
    found: dict[str, JobState] = {}
    for row in sacct_rows(stdout, STEP_FIELDS):
        step, raw_state, name = (row[f].strip() for f in STEP_FIELDS)
        head, _, index = step.partition(".")
        if head != job_id or not index.isdigit() or name != step_name:
            continue
        found[step] = translate_state(raw_state)   # "CANCELLED by 0" and the like too
    return found
