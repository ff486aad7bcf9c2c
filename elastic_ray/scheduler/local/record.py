"""A local job's record, its state machine, and the supervisor's decisions.

Pure: no files, no processes, no clock (``now`` is always an argument).

The record is the job's whole truth, shared on disk by every process that
uses the same local scheduler state directory: the submitter, the job's own
supervisor (``job``), and any process that queries or cancels. Keeping
the decisions here, as functions of a record and a time, is what lets them be
tested exhaustively while the processes that act on them stay thin.

Why one module of a little over 500 lines: the record, the events that
change it and the transition function are one state machine; split, a new
state would have to be added in three files that must agree.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ... import knobs
from ...config.slurm_values import is_job_id, parse_signal_name  # noqa: F401 - parse_signal_name is re-exported
from ..base import JobInfo, JobState
from .cluster import Holding, Placement, ResourceRequest, compress_hostlist

RECORD_VERSION = 1


# --------------------------------------------------------------------------
# The record.

@dataclass(frozen=True)
class ProcRef:
    """A process we may signal later: its pid AND its start time.

    A pid alone is not an identity: after a crash the pid can be reused by
    an unrelated process, which we must never signal. ``node`` names the
    emulated node for node processes ("" for a supervisor).
    """

    pid: int
    create_time: float
    node: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "create_time": self.create_time, "node": self.node}

    @classmethod
    def from_dict(cls, data: Any) -> "ProcRef":
        if not isinstance(data, Mapping):
            raise ValueError("a process reference must be an object")
        pid, ctime, node = data.get("pid"), data.get("create_time"), data.get("node", "")
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise ValueError(f"pid {pid!r} is not a process id")
        if isinstance(ctime, bool) or not isinstance(ctime, (int, float)) or not math.isfinite(ctime):
            raise ValueError(f"create_time {ctime!r} is not a time")
        if not isinstance(node, str):
            raise ValueError("node must be a string")
        return cls(pid, float(ctime), node)


@dataclass(frozen=True)
class JobRecord:
    """One job as written to ``<state_dir>/jobs/<id>.json``.

    ``end_time`` is the planned end while RUNNING (start + time limit; None
    when unlimited), and the moment the job began to end once it is
    COMPLETING or final. ``ending_as`` is the final state a COMPLETING job
    will get once its node processes are gone.
    """

    job_id: str
    name: str
    role: str
    submit_time: float
    request: ResourceRequest
    node_argv: tuple[str, ...]
    workdir: str
    output: str  # absolute, "%j" already replaced
    env: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    pre_start_commands: tuple[str, ...] = ()
    time_limit: int | None = None  # seconds; None: unlimited
    warning_signal: str | None = None  # "USR1" (no SIG prefix)
    warning_seconds: int | None = None
    state: JobState = JobState.PENDING
    reason: str = "None"
    ending_as: JobState | None = None
    partition: str = ""
    holdings: tuple[Holding, ...] = ()
    start_time: float | None = None
    end_time: float | None = None
    supervisor: ProcRef | None = None
    node_procs: tuple[ProcRef, ...] = ()
    exit_codes: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    cancel_requested: bool = False
    warning_sent_at: float | None = None
    teardown_since: float | None = None
    # Who submitted it and the submission's marker (Slurm's --comment).
    # Optional keys: records written before them read as "" (any user).
    user: str = ""
    comment: str = ""

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(h.node for h in self.holdings)

    @property
    def holds_resources(self) -> bool:
        """RUNNING and COMPLETING jobs hold their nodes (Slurm frees them at the end)."""
        return self.state in (JobState.RUNNING, JobState.COMPLETING)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "job_id": self.job_id,
            "name": self.name,
            "role": self.role,
            "submit_time": self.submit_time,
            "request": self.request.to_dict(),
            "node_argv": list(self.node_argv),
            "workdir": self.workdir,
            "output": self.output,
            "env": dict(self.env),
            "pre_start_commands": list(self.pre_start_commands),
            "time_limit": self.time_limit,
            "warning_signal": self.warning_signal,
            "warning_seconds": self.warning_seconds,
            "state": self.state.value,
            "reason": self.reason,
            "ending_as": None if self.ending_as is None else self.ending_as.value,
            "partition": self.partition,
            "holdings": [h.to_dict() for h in self.holdings],
            "start_time": self.start_time,
            "end_time": self.end_time,
            "supervisor": None if self.supervisor is None else self.supervisor.to_dict(),
            "node_procs": [p.to_dict() for p in self.node_procs],
            "exit_codes": dict(self.exit_codes),
            "cancel_requested": self.cancel_requested,
            "warning_sent_at": self.warning_sent_at,
            "teardown_since": self.teardown_since,
            "user": self.user,
            "comment": self.comment,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "JobRecord":
        """Validate everything; raises ValueError naming the first bad key.

        A record is written by our own code, so a bad one means a damaged
        file: the caller reports the job as ENDED_UNKNOWN, never crashes.
        """
        if not isinstance(data, Mapping):
            raise ValueError("a job record must be an object")
        if data.get("version") != RECORD_VERSION:
            raise ValueError(f"version {data.get('version')!r} is not {RECORD_VERSION}")
        job_id = _req(data, "job_id", str)
        if not is_job_id(job_id):
            raise ValueError(f"job_id {job_id!r} is not a job id (1 to 20 digits 0-9)")
        env = _req(data, "env", dict)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError("'env' must map strings to strings")
        exit_codes = _req(data, "exit_codes", dict)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in exit_codes.values()):
            raise ValueError("'exit_codes' must map node names to integers")
        ending_as = _opt(data, "ending_as", str)
        supervisor = data.get("supervisor")
        return cls(
            job_id=job_id,
            name=_req(data, "name", str),
            role=_req(data, "role", str),
            submit_time=float(_req(data, "submit_time", (int, float))),
            request=ResourceRequest.from_dict(_req(data, "request", dict)),
            node_argv=tuple(_str_list(data, "node_argv")),
            workdir=_req(data, "workdir", str),
            output=_req(data, "output", str),
            env=MappingProxyType(dict(env)),
            pre_start_commands=tuple(_str_list(data, "pre_start_commands")),
            time_limit=_opt(data, "time_limit", int),
            warning_signal=_opt(data, "warning_signal", str),
            warning_seconds=_opt(data, "warning_seconds", int),
            state=_state(_req(data, "state", str), "state"),
            reason=_req(data, "reason", str),
            ending_as=None if ending_as is None else _state(ending_as, "ending_as"),
            partition=_req(data, "partition", str),
            holdings=tuple(Holding.from_dict(h) for h in _req(data, "holdings", list)),
            start_time=_opt_float(data, "start_time"),
            end_time=_opt_float(data, "end_time"),
            supervisor=None if supervisor is None else ProcRef.from_dict(supervisor),
            node_procs=tuple(ProcRef.from_dict(p) for p in _req(data, "node_procs", list)),
            exit_codes=MappingProxyType(dict(exit_codes)),
            cancel_requested=_req(data, "cancel_requested", bool),
            warning_sent_at=_opt_float(data, "warning_sent_at"),
            teardown_since=_opt_float(data, "teardown_since"),
            user=_opt(data, "user", str) or "",
            comment=_opt(data, "comment", str) or "",
        )


def _req(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...]) -> Any:
    if key not in data:
        raise ValueError(f"missing key {key!r}")
    value = data[key]
    allowed = kinds if isinstance(kinds, tuple) else (kinds,)
    if isinstance(value, bool) and bool not in allowed:
        raise ValueError(f"{key!r} must not be a boolean")
    if not isinstance(value, kinds):
        raise ValueError(f"{key!r} has type {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{key!r} must be finite")
    return value


def _opt(data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...]) -> Any:
    return None if data.get(key) is None else _req(data, key, kinds)


def _opt_float(data: Mapping[str, Any], key: str) -> float | None:
    value = _opt(data, key, (int, float))
    return None if value is None else float(value)


def _str_list(data: Mapping[str, Any], key: str) -> list[str]:
    value = _req(data, key, list)
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"{key!r} must be a list of strings")
    return value


def _state(text: str, key: str) -> JobState:
    try:
        return JobState(text)
    except ValueError:
        raise ValueError(f"{key!r}: {text!r} is not a job state") from None


# --------------------------------------------------------------------------
# The state machine.

class Event(str, enum.Enum):
    """What can happen to a local job."""

    START = "start"  # the scheduler placed it
    CANCEL = "cancel"  # someone asked to cancel it
    TIME_LIMIT = "time_limit"  # its walltime is over
    LAUNCH_FAILED = "launch_failed"  # a node process could not be started
    EXITED_OK = "exited_ok"  # every node process is gone, all with status 0
    EXITED_ERROR = "exited_error"  # every node process is gone, at least one did not exit 0
    SUPERVISOR_LOST = "supervisor_lost"  # its supervisor process died (crash, SIGKILL)


class InvalidTransition(ValueError):
    """An event that cannot happen in that state: a bug in the caller."""


# Slurm's reason codes, for what squeue shows in the REASON column.
REASONS = {
    JobState.COMPLETED: "None",
    JobState.FAILED: "NonZeroExitCode",
    JobState.CANCELLED: "None",
    JobState.TIMEOUT: "TimeLimit",
    JobState.NODE_FAIL: "NodeDown",
}


def next_state(state: JobState, ending_as: JobState | None, event: Event) -> tuple[JobState, JobState | None]:
    """``(state, ending_as)`` after ``event``.

    Final states absorb every event: a late cancel, a second timeout or a
    reconciler that thinks the supervisor died changes nothing once the job
    has ended. A COMPLETING job keeps the first reason it got for ending
    (cancel then timeout is still CANCELLED), and if its supervisor dies
    while it is already ending, it ends as intended: the node processes had
    been told to stop anyway.

    A supervisor that dies under a RUNNING job is reported as NODE_FAIL: for
    the code above, its nodes vanished, which is what a node failure is on
    Slurm (with ``--no-requeue``). A PENDING job whose supervisor died never
    got nodes, so it is FAILED (Slurm's launch failure), not NODE_FAIL.
    """
    if state.is_final:
        return state, ending_as
    if state is JobState.PENDING:
        table = {
            Event.START: JobState.RUNNING,
            Event.CANCEL: JobState.CANCELLED,
            Event.LAUNCH_FAILED: JobState.FAILED,
            Event.SUPERVISOR_LOST: JobState.FAILED,
        }
        if event not in table:
            raise InvalidTransition(f"{event.value} cannot happen to a PENDING job")
        return table[event], None
    if state is JobState.RUNNING:
        ending = {Event.CANCEL: JobState.CANCELLED, Event.TIME_LIMIT: JobState.TIMEOUT,
                  Event.LAUNCH_FAILED: JobState.FAILED}
        if event in ending:
            return JobState.COMPLETING, ending[event]
        final = {Event.EXITED_OK: JobState.COMPLETED, Event.EXITED_ERROR: JobState.FAILED,
                 Event.SUPERVISOR_LOST: JobState.NODE_FAIL}
        if event in final:
            return final[event], None
        raise InvalidTransition(f"{event.value} cannot happen to a RUNNING job")
    if state is JobState.COMPLETING:
        if ending_as is None or not ending_as.is_final:
            raise InvalidTransition(f"a COMPLETING job needs a final ending_as, not {ending_as}")
        if event in (Event.CANCEL, Event.TIME_LIMIT, Event.LAUNCH_FAILED):
            return state, ending_as
        if event in (Event.EXITED_OK, Event.EXITED_ERROR, Event.SUPERVISOR_LOST):
            return ending_as, None
        raise InvalidTransition(f"{event.value} cannot happen to a COMPLETING job")
    raise InvalidTransition(f"the local scheduler never puts a job in {state.value}")


def apply_event(record: JobRecord, event: Event, now: float, detail: str = "") -> JobRecord:
    """The record after ``event`` at ``now`` (START needs :func:`started`).

    ``detail`` is appended to the reason ("NodeDown: supervisor died").
    """
    if event is Event.START:
        raise InvalidTransition("use started() to start a job: it needs a placement")
    state, ending_as = next_state(record.state, record.ending_as, event)
    if (state, ending_as) == (record.state, record.ending_as):
        return record
    changes: dict[str, Any] = {"state": state, "ending_as": ending_as}
    if state is JobState.COMPLETING:
        changes["teardown_since"] = now
        changes["end_time"] = now
        changes["reason"] = _with_detail(REASONS.get(ending_as, "None"), detail)
    if state.is_final:
        if record.state is not JobState.COMPLETING:
            changes["end_time"] = now
        changes["reason"] = _with_detail(REASONS.get(state, "None"), detail)
    return replace(record, **changes)


def _with_detail(reason: str, detail: str) -> str:
    return f"{reason}: {detail}" if detail else reason


def started(record: JobRecord, placement: Placement, now: float) -> JobRecord:
    """The record of a pending job that got ``placement`` at ``now``."""
    state, _ = next_state(record.state, record.ending_as, Event.START)
    end = None if record.time_limit is None else now + record.time_limit
    return replace(record, state=state, reason="None", partition=placement.partition,
                   holdings=placement.holdings, start_time=now, end_time=end)


def exit_event(exit_codes: Mapping[str, int]) -> Event:
    """COMPLETED needs every node process to have exited 0."""
    return Event.EXITED_OK if exit_codes and all(code == 0 for code in exit_codes.values()) else Event.EXITED_ERROR


# --------------------------------------------------------------------------
# Time.

def warning_time(start: float, time_limit: int | None, warning_seconds: int | None) -> float | None:
    """When the pre-walltime signal is due, or None when there is none.

    Slurm sends it early, never late; a lead time longer than the whole
    limit means "at once".
    """
    if time_limit is None or warning_seconds is None:
        return None
    return start + max(0, time_limit - warning_seconds)


def time_left(record: JobRecord, now: float) -> float | None:
    """Seconds until the end time while the job holds nodes: 0 once it is
    ending; None when pending, ended or unlimited (as the Slurm backend
    reports it, so callers need not know which backend answered)."""
    if record.start_time is None or record.end_time is None or not record.holds_resources:
        return None
    if record.state is not JobState.RUNNING:
        return 0.0
    return max(0.0, record.end_time - now)


def job_info(record: JobRecord, now: float) -> JobInfo:
    """What ``query`` reports for a record."""
    return JobInfo(
        job_id=record.job_id,
        name=record.name,
        state=record.state,
        raw_state=record.state.value,
        reason=record.reason,
        partition=record.partition,
        nodes=record.nodes,
        submit_time=record.submit_time,
        start_time=record.start_time,
        end_time=record.end_time,
        time_left=time_left(record, now),
        user=record.user,
        comment=record.comment,
    )


# --------------------------------------------------------------------------
# The supervisor's decision, one step at a time.

@dataclass(frozen=True)
class RunView:
    """What the supervisor of a started job knows at one moment."""

    now: float
    state: JobState  # RUNNING or COMPLETING
    end_time: float | None  # planned end while RUNNING
    warning_at: float | None
    warning_sent: bool
    cancel_requested: bool
    teardown_since: float | None
    kill_wait: float
    killed: bool  # SIGKILL already sent
    nodes_alive: int


@dataclass(frozen=True)
class Wait:
    """Nothing to do before ``until`` (None: until something happens)."""

    until: float | None


@dataclass(frozen=True)
class SendWarning:
    """Send the pre-walltime signal to every node process."""


@dataclass(frozen=True)
class BeginEnding:
    """TERM every process of the job; ``event`` says why (CANCEL or TIME_LIMIT)."""

    event: Event


@dataclass(frozen=True)
class Kill:
    """KillWait is over: SIGKILL whatever is left."""


@dataclass(frozen=True)
class Finish:
    """Every node process is gone: record the final state."""


Action = Wait | SendWarning | BeginEnding | Kill | Finish


def decide(view: RunView) -> Action:
    """The supervisor's next step, slurmstepd-style.

    Order matters and mirrors Slurm: a job whose processes have all exited
    is done whatever else is due; a cancel wins over the time limit; the
    time limit wins over a warning that is due at the same moment (the job is
    ending anyway). While ending, KILL follows TERM after KillWait.
    """
    if view.nodes_alive == 0:
        return Finish()
    if view.state is JobState.RUNNING:
        if view.cancel_requested:
            return BeginEnding(Event.CANCEL)
        if view.end_time is not None and view.now >= view.end_time:
            return BeginEnding(Event.TIME_LIMIT)
        warning_due = view.warning_at is not None and not view.warning_sent
        if warning_due and view.now >= view.warning_at:  # type: ignore[operator]
            return SendWarning()
        deadlines = [t for t in (view.end_time, view.warning_at if warning_due else None) if t is not None]
        return Wait(min(deadlines) if deadlines else None)
    if view.state is JobState.COMPLETING:
        if view.killed:
            return Wait(None)
        kill_at = (view.teardown_since if view.teardown_since is not None else view.now) + view.kill_wait
        return Kill() if view.now >= kill_at else Wait(kill_at)
    raise InvalidTransition(f"no supervisor decision for a {view.state.value} job")


# --------------------------------------------------------------------------
# Signals and the node environment.

# parse_signal_name (imported above) is the one signal parser of
# config/slurm_values.py: the supervisor reads warning_signal with it.


# Variables a job must never inherit from its submitter: they describe the
# submitter's own job (a payload step that submits a worker allocation runs
# inside one) and would lie about the new job.
_INHERITED_PREFIXES = ("SLURM_", "SLURMD_")
_INHERITED_NAMES = frozenset({"CUDA_VISIBLE_DEVICES", knobs.NODE_IP.name})


def node_environment(record: JobRecord, index: int, base: Mapping[str, str],
                     address: str) -> dict[str, str]:
    """The environment of the node process on ``record.holdings[index]``.

    Like sbatch's default ``--export=ALL``: the submitter's environment, then
    the spec's ``env``, then the Slurm variables (which win: they are facts
    about this job). ``CUDA_VISIBLE_DEVICES`` carries the held GPUs' real
    indices on the node, as Slurm gives them without device cgroups.
    """
    holding = record.holdings[index]
    env = {k: v for k, v in base.items()
           if not k.startswith(_INHERITED_PREFIXES) and k not in _INHERITED_NAMES}
    env.update(record.env)
    env.update({
        "SLURM_JOB_ID": record.job_id,
        "SLURM_JOBID": record.job_id,
        "SLURM_JOB_NAME": record.name,
        "SLURM_JOB_NODELIST": compress_hostlist(record.nodes),
        "SLURM_NODELIST": compress_hostlist(record.nodes),
        "SLURM_JOB_NUM_NODES": str(len(record.holdings)),
        "SLURM_NNODES": str(len(record.holdings)),
        "SLURM_NODEID": str(index),
        "SLURM_PROCID": str(index),
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": str(len(record.holdings)),
        "SLURMD_NODENAME": holding.node,
        "SLURM_CPUS_ON_NODE": str(holding.cpus),
        "SLURM_CPUS_PER_TASK": str(holding.cpus),
        # The memory held on this node, in MB, as Slurm's --mem gives it (for
        # --mem-per-cpu Slurm sets SLURM_MEM_PER_CPU instead; the agent reads either).
        "SLURM_MEM_PER_NODE": str(holding.mem_mb),
        "SLURM_JOB_PARTITION": record.partition,
        "SLURM_SUBMIT_DIR": record.workdir,
        knobs.NODE_IP.name: address,
    })
    if holding.gpus:
        indices = ",".join(str(g) for g in holding.gpus)
        env.update({"CUDA_VISIBLE_DEVICES": indices, "SLURM_GPUS_ON_NODE": str(len(holding.gpus)),
                    "SLURM_JOB_GPUS": indices})
    return env


def node_argv(record: JobRecord) -> list[str]:
    """The argv of each node process.

    Without pre-start commands, the node command itself. With them, one
    ``bash -c`` that runs them and then execs the node command, so the node
    command inherits what they exported and keeps the process's pid. Errors
    stop it as they stop the rendered Slurm batch script (``set -e`` and
    ``pipefail`` are on there too): the node exits non-zero, the job FAILS.
    """
    if not record.pre_start_commands:
        return list(record.node_argv)
    script = "set -eo pipefail\n" + "\n".join(record.pre_start_commands) + '\nexec "$@"\n'
    return ["bash", "-c", script, "elastic-ray-node", *record.node_argv]
