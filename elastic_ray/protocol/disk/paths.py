"""The session directory's layout: the name of every file in it, who writes it, who reads it.

Every process of a run finds the others' files by name alone, on a shared
filesystem, across hosts and elastic-ray versions; a name is therefore part
of the contract on disk as much as a record's keys are. This module is the
one place that spells them: each path has one function here (taking the
session directory, any ``PurePath``, and returning the same kind of path),
each name with a varying part has its parser next to its builder, and
:data:`ENTRIES` says what each holds and who writes and reads it. Readers
and writers in every room ask here instead of joining strings.

Pure: it names paths and never touches the filesystem.

Why one module: the names, their parsers and the description of each are
one contract; split, a new file could be named in one place and described
in none, which is how the layout lost its owner before.

The layout (rendered from :data:`ENTRIES` by :func:`render_text`; a test
holds this text, and the table in docs/architecture.md, to it)::

    <session>/
      session.json                  the session's settings (SessionInfo): session id, Slurm job name, scheduler,
                                    head shape, layout, launcher, the creator's ELASTIC_AGENT_* settings (every
                                    job's nodes get them), protocol version; written once and last, so a directory
                                    with it is a complete session
                                    written by: coordinator (`Session.create`, through `SessionDir.create`)
                                    read by: every process of the run; Dagster's sensor and the SSH server take a
                                    directory with one for a session
      allocation.json               the mutable record (AllocationRecord): head job, worker allocations (each with
                                    how it ended unasked, its resubmit wish and replacement), predecessors, election
                                    claim, the autoscaler's lease, successor; a copy of the newest generation file,
                                    which it may lag
                                    written by: coordinator, by compare-and-swap (`SessionDir.update_allocation`,
                                    `protocol/disk/generations`); a restore (`protocol/disk/allocation_repair`)
                                    read by: coordinator, CLI (`session status`, `session repair`), the SSH server
      allocation.json.bak           a copy of the last good record, rewritten after every commit (it lags when that
                                    write failed)
                                    written by: the generation commit (`protocol/disk/generations`)
                                    read by: `protocol/disk/allocation_repair` (a restore source; the job ids a
                                    teardown learns without the record)
      allocation.gen/<n>.json       the record of generation n, created once by hard link: the commit point; the
                                    newest 32 are kept
                                    written by: the generation commit (`protocol/disk/generations`)
                                    read by: every reader of allocation.json (it moves on to the newest);
                                    `protocol/disk/recovery` (the names say which generations were committed)
      .allocation.lock              flocked by the writers of allocation.json (a fast path: correctness rests on the
                                    generation files) and by a restore
                                    written by: `protocol/disk/session_dir`
                                    read by: (a lock: its holders)
      allocation.json.corrupt-<time>[.<n>], allocation.gen.<generation>.corrupt-<time>[.<n>]
                                    a damaged record set aside by a restore, never deleted
                                    written by: `protocol/disk/allocation_repair`
                                    read by: people
      ray_head                      the current head's Slurm job id, a bare integer; agents follow it
                                    written by: coordinator (an election; `coordinator/head/headwatch` puts a
                                    damaged one back from the record)
                                    read by: agents (`agent/head/following`, `agent/head/node_gone`), coordinator,
                                    CLI, `protocol/disk/recovery` (evidence)
      secret                        32 random bytes, the control channel key (0600; the directory is 0700)
                                    written by: coordinator (`Session.create`, through `SessionDir.create`)
                                    read by: agents and coordinator (the control channel; the Ray token is derived
                                    from it)
      ray_token                     Ray's auth token, derived from the secret (0600; see `ray_auth`)
                                    written by: the first process that starts Ray or a driver
                                    (`SessionDir.ensure_ray_token`: agents, coordinator)
                                    read by: Ray nodes and drivers, through `RAY_AUTH_TOKEN_PATH`
      events.jsonl, events.1.jsonl  the run's history, one Event a line (versioned on its own, 1): submitted,
                                    pending, started, joined, left, drained, removed, failed, elections, head moves,
                                    standbys; the current file is moved to the `.1` name when it passes its size
                                    bound, so the two hold the newest events
                                    written by: every process of the run, by one locked append a line
                                    (`protocol/disk/event_log`)
                                    read by: CLI (`session events`, `session timeline`, `session usage`), Dagster
                                    (run metadata), the SSH server (`usage`, the same figures for Dagster in the SSH
                                    mode)
      timeline.html                 the run's timeline as one self-contained page, drawn from the event log
                                    (`history/timeline`)
                                    written by: `history/summary`, after each `compute.run` when the timeline extra
                                    is installed: in Dagster (cluster mode) or in the SSH server's `usage` (SSH
                                    mode); the demo
                                    read by: people (Dagster's metadata links it, or names it on the cluster)
      autoscale.json                the autoscaler's policy (AutoscalePolicy, versioned on its own, 1), or none: the
                                    session does not scale by itself
                                    written by: coordinator (`Session.autoscale`; a teardown clears it; both through
                                    `coordinator/scaling/store`)
                                    read by: the process holding the autoscaler's lease
                                    (`coordinator/scaling/runner`), CLI (`session status`)
      autoscale-state.json          what the autoscaler holding the lease keeps (versioned on its own, 1): the jobs
                                    it submitted and for which pool, Slurm's start estimates, its last turn, notes
                                    and decisions
                                    written by: the process holding the autoscaler's lease
                                    (`coordinator/scaling/runner`), alone
                                    read by: the next lease holder, CLI (`session status`)
      jobs/<job>/head.json          a ready head's endpoint (HeadEndpoint): GCS address, heartbeat and control
                                    ports, Ray version
                                    written by: the agent that serves the head (`agent/head/publishing`: a head
                                    allocation's first node, or the hosting first node of a worker allocation)
                                    read by: agents (following, `mark_dead`, rejoin order), coordinator, CLI,
                                    `protocol/disk/head_agent`, `protocol/disk/recovery` (evidence)
      jobs/<job>/nodes/<node>.json  one agent's published state (NodeState): state, reason, Ray node id, control
                                    endpoint, hosted head
                                    written by: that node's agent (`agent/head/publishing`)
                                    read by: coordinator (waits, lost nodes), agents (rejoin order),
                                    `protocol/disk/head_agent`, CLI
      specs/worker-<id>.json        a worker allocation's resolved config (and `"host_head": true` for the run's
                                    first allocation in the default layout), written before it is submitted
                                    written by: coordinator (`coordinator/allocations/submit`; `session render`
                                    names dry-run ones and writes none)
                                    read by: agents (`--spec`)
      scheduler-answer.json         the last scheduler answer any process of the run got, with the time it was
                                    asked; versioned on its own (1), a newer or damaged one is ignored
                                    written by: coordinator (`coordinator/allocations/answers`), by whichever
                                    process asked
                                    read by: coordinator processes (waits, watches, the detached supervisor), CLI
                                    (`session status`)
      scheduler-answer.lock         flocked by the one process that asks when the stored answer is too old
                                    written by: coordinator (`coordinator/allocations/answers`)
                                    read by: (a lock: its holders)
      logs/agent-<job>-<node>.log   an agent's log, one event per line
                                    written by: the agent (`agent/cli`)
                                    read by: people, benches, tests
      logs/head-<job>.out, logs/worker-<job>.out
                                    a job's output: its batch script and every agent's stderr
                                    written by: the scheduler, at the path submission gives it
                                    (`coordinator/allocations/submit`: `--output=<session>/logs/<role>-%j.out`)
                                    read by: coordinator (an error shows its end), `protocol/disk/allocation_repair`
                                    (a teardown learns job ids from the names), people
      logs/ray-<job>-<node>-<role>[-hosted].log
                                    the output of one `ray start`
                                    written by: the agent (`agent/node/local_ray`)
                                    read by: the agent (`agent/node/ray_node`: start-up finished, the node id),
                                    people
      logs/detached-supervisor.log  the detached supervisor's output (SSH mode)
                                    written by: coordinator (`coordinator/detached`)
                                    read by: people
      remote/supervisor.lock        held by the detached supervisor for its whole life: one per session
                                    written by: coordinator (`coordinator/detached_run`)
                                    read by: coordinator (`coordinator/detached`: whether one runs)
      remote/supervisor.pid         `<pid> <host>` of the detached supervisor
                                    written by: coordinator (`coordinator/detached_run`)
                                    read by: coordinator (`coordinator/detached`: signal it on its own host only)
      remote/stop                   the marker a teardown leaves so that the detached supervisor ends
                                    written by: coordinator (`coordinator/detached`, from every teardown)
                                    read by: coordinator (`coordinator/detached_run`)
      remote/last_call              the time of the last SSH call (the abandonment clock)
                                    written by: the SSH server (`remote/server`, through `coordinator/detached`)
                                    read by: coordinator (`coordinator/detached_run`)
      payloads/<digest>-<name>      a payload file uploaded for a step (SSH mode with Dagster)
                                    written by: the SSH server (`put_file`), for `dagster/ssh_mode`
                                    read by: the payload's driver on the head
      pipes/<step>-<id>.jsonl       a payload's Dagster Pipes messages
                                    written by: the payload (`dagster_pipes` in the driver); Dagster or the SSH
                                    server makes the folder
                                    read by: Dagster (`dagster/pipes`), or the SSH server, which relays them
      local-scheduler/              the local scheduler's state (its jobs, its log), unless the session was given
                                    another place (`local_state_dir`)
                                    written by: `scheduler/local`
                                    read by: `scheduler/local`
      <name>-<role>-<time>-<random>.sbatch
                                    a batch script as it was submitted, kept for whoever wants to see what ran
                                    (0600: it may carry the launcher's environment)
                                    written by: the Slurm scheduler (`scheduler/slurm`: in the job's workdir, the
                                    session directory; the name is `scheduler/slurm_parse.script_name_prefix`'s)
                                    read by: people (sbatch reads it once)
      commits.txt, payload.log      `elastic-ray demo` only: the units its payload committed, and the payload's
                                    output
                                    written by: the demo (`demo/main_demo`, its payload `demo/payload`)
                                    read by: the demo (`demo/main_demo`)
      .<name>.<random>.tmp, .fs-check.<random>
                                    a write in progress (`atomic`, the generation commit), the filesystem check of
                                    `SessionDir.create`; removed by its writer
                                    written by: `atomic`, `protocol/disk/generations`, `protocol/disk/session_dir`
                                    read by: nobody
    beside <session>/
      <session>.lock                taken while the session is opened or created, so that first callers racing each
                                    other create it once
                                    written by: the SSH server, Dagster (`dagster/run_session`)
                                    read by: (a lock: its holders)
      <session>.ended               Dagster's orphan verdict: the run ended and its session was dealt with
                                    written by: Dagster (`dagster/sensor`)
                                    read by: Dagster (`dagster/sensor`; `dagster/run_session` removes it on reopen)
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePath
from typing import TypeVar

from .records import check_job_id, is_job_id

P = TypeVar("P", bound=PurePath)

# ---------------------------------------------------------------- names
SESSION_FILE = "session.json"
ALLOCATION_FILE = "allocation.json"
BACKUP_FILE = "allocation.json.bak"
GENERATION_DIR = "allocation.gen"
ALLOCATION_LOCK = ".allocation.lock"
RAY_HEAD_FILE = "ray_head"
SECRET_FILE = "secret"
RAY_TOKEN_FILE = "ray_token"
JOBS_DIR = "jobs"
HEAD_ENDPOINT_FILE = "head.json"
NODES_DIR = "nodes"
SPECS_DIR = "specs"
ANSWER_FILE = "scheduler-answer.json"
ANSWER_LOCK = "scheduler-answer.lock"
LOGS_DIR = "logs"
DETACHED_LOG = "detached-supervisor.log"
REMOTE_DIR = "remote"
SUPERVISOR_LOCK = "supervisor.lock"
SUPERVISOR_PID = "supervisor.pid"
STOP_MARKER = "stop"
LAST_CALL = "last_call"
PAYLOADS_DIR = "payloads"
PIPES_DIR = "pipes"
LOCAL_SCHEDULER_DIR = "local-scheduler"
DEMO_COMMITS = "commits.txt"
DEMO_PAYLOAD_LOG = "payload.log"
EVENTS_FILE = "events.jsonl"
EVENTS_ROTATED = "events.1.jsonl"
TIMELINE_PAGE = "timeline.html"
AUTOSCALE_FILE = "autoscale.json"
AUTOSCALE_STATE = "autoscale-state.json"
#: The folders ``SessionDir.create`` makes (0700); the others appear with their first file.
CREATED_DIRS = (JOBS_DIR, LOGS_DIR)
#: The roles whose job output lands in ``logs/<role>-<job>.out``.
JOB_ROLES = ("head", "worker")
#: Temporary names: the generation commit's file (in allocation.gen/) and the filesystem check of create.
GENERATION_TMP_PREFIX, TMP_SUFFIX = ".allocation.", ".tmp"
FS_CHECK_PREFIX, FS_CHECK_LINK_SUFFIX = ".fs-check.", ".link"

_GENERATION_NAME = re.compile(r"(0|[1-9][0-9]{0,18})\.json")
_SLURM_JOB_PLACEHOLDER = "%j"


# Builders take their varying parts as given (their callers check them where
# they come from: a job id at the boundary, a node name where it is
# published); the parsers below are strict.


# ---------------------------------------------------------------- the record and its copies
def session_file(session: P) -> P:
    return session / SESSION_FILE


def allocation_file(session: P) -> P:
    return session / ALLOCATION_FILE


def backup_file(session: P) -> P:
    return session / BACKUP_FILE


def generation_dir(session: P) -> P:
    return session / GENERATION_DIR


def generation_name(generation: int) -> str:
    return f"{generation}.json"


def generation_of(name: str) -> int | None:
    """The generation a file name in allocation.gen/ commits, None for any other name
    (a temporary file, or one no writer makes: ``01.json``)."""
    match = _GENERATION_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def generation_file(session: P, generation: int) -> P:
    return generation_dir(session) / generation_name(generation)


def allocation_lock_file(session: P) -> P:
    return session / ALLOCATION_LOCK


def generation_aside_stem(generation_stem: str) -> str:
    """What a damaged ``allocation.gen/<stem>.json`` is kept as (before ``.corrupt-<time>``)."""
    return f"{GENERATION_DIR}.{generation_stem}"


def corrupt_copy(session: P, stem: str, stamp: str, n: int = 0) -> P:
    """Where a restore keeps a damaged record: ``<stem>.corrupt-<stamp>``, then ``.<n>`` for the n-th
    of one second (``stem``: ALLOCATION_FILE or a :func:`generation_aside_stem`)."""
    return session / (f"{stem}.corrupt-{stamp}" if n == 0 else f"{stem}.corrupt-{stamp}.{n}")


# ---------------------------------------------------------------- pointer and keys
def ray_head_file(session: P) -> P:
    return session / RAY_HEAD_FILE


def secret_file(session: P) -> P:
    return session / SECRET_FILE


def ray_token_file(session: P) -> P:
    return session / RAY_TOKEN_FILE


# ---------------------------------------------------------------- per job
def jobs_dir(session: P) -> P:
    return session / JOBS_DIR


def job_dir(session: P, job_id: str) -> P:
    """``jobs/<job>``; the name must be a job id (a path part from a file cannot climb out)."""
    return jobs_dir(session) / check_job_id(job_id)


def job_of_dir(name: str) -> str | None:
    """The job a folder of jobs/ belongs to, None for a name that is not a job id."""
    return name if is_job_id(name) else None


def head_endpoint_file(session: P, job_id: str) -> P:
    return job_dir(session, job_id) / HEAD_ENDPOINT_FILE


def nodes_dir(session: P, job_id: str) -> P:
    return job_dir(session, job_id) / NODES_DIR


def check_node_name(node: str) -> str:
    """A node name that makes one file name of nodes/, not a hidden one; else ValueError."""
    if not node or "/" in node or node.startswith("."):
        raise ValueError(f"node={node!r}: not a usable node name")
    return node


def node_state_file(session: P, job_id: str, node: str) -> P:
    """``jobs/<job>/nodes/<node>.json`` (:func:`check_node_name`)."""
    return nodes_dir(session, job_id) / f"{check_node_name(node)}.json"


def node_of(name: str) -> str | None:
    """The node a file of ``jobs/<job>/nodes/`` is about, None for another name."""
    if not name.endswith(".json") or name.startswith("."):
        return None
    return name[: -len(".json")] or None


# ---------------------------------------------------------------- worker specs
def specs_dir(session: P) -> P:
    return session / SPECS_DIR


def worker_spec_name(spec_id: str) -> str:
    return f"worker-{spec_id}.json"


def worker_spec_file(session: P, spec_id: str) -> P:
    """``specs/worker-<id>.json``; the submitter picks the id (random, or ``dryrun<n>`` for a rendering)."""
    return specs_dir(session) / worker_spec_name(spec_id)


def worker_spec_id(name: str) -> str | None:
    """The id in a spec file's name, None for another name."""
    if not (name.startswith("worker-") and name.endswith(".json")):
        return None
    spec_id = name[len("worker-"): -len(".json")]
    return spec_id or None


# ---------------------------------------------------------------- the shared scheduler answer
def answer_file(session: P) -> P:
    return session / ANSWER_FILE


def answer_lock_file(session: P) -> P:
    return session / ANSWER_LOCK


# ---------------------------------------------------------------- logs
def log_dir(session: P) -> P:
    return session / LOGS_DIR


def agent_log_name(job_id: str, node: str) -> str:
    return f"agent-{job_id}-{node}.log"


def agent_log(session: P, job_id: str, node: str) -> P:
    return log_dir(session) / agent_log_name(job_id, node)


def parse_agent_log_name(name: str) -> tuple[str, str] | None:
    """``(job, node)`` of an agent's log name, None for another name."""
    if not (name.startswith("agent-") and name.endswith(".log")):
        return None
    job, _, node = name[len("agent-"): -len(".log")].partition("-")
    return (job, node) if is_job_id(job) and node else None


def job_output_template(session: P, role: str) -> P:
    """What submission gives the scheduler as the job's output (``%j``: the job id, filled in by it)."""
    return log_dir(session) / f"{role}-{_SLURM_JOB_PLACEHOLDER}.out"


def job_output_name(role: str, job_id: str) -> str:
    return f"{role}-{job_id}.out"


def job_output(session: P, role: str, job_id: str) -> P:
    """The output of job ``job_id`` as the scheduler wrote it (:func:`job_output_template` filled in)."""
    return log_dir(session) / job_output_name(role, job_id)


def parse_job_output_name(name: str) -> tuple[str, str] | None:
    """``(role, job)`` of a job output's name, None for another name (a teardown reads job ids from them)."""
    role, _, rest = name.partition("-")
    job = rest.removesuffix(".out")
    if role in JOB_ROLES and rest.endswith(".out") and is_job_id(job):
        return role, job
    return None


def ray_log_name(job_id: str, node: str, role: str, hosted: bool = False) -> str:
    """The output of one ``ray start``: a node's own Ray node, or (``hosted``) the head it
    hosts and (role ``worker``) the worker kept joined to that head while it is a standby."""
    suffix = "-hosted" if hosted else ""
    return f"ray-{job_id}-{node}-{role}{suffix}.log"


def ray_log(session: P, job_id: str, node: str, role: str, hosted: bool = False) -> P:
    return log_dir(session) / ray_log_name(job_id, node, role, hosted)


def parse_ray_log_name(name: str) -> tuple[str, str, str, bool] | None:
    """``(job, node, role, hosted)`` of a ``ray start`` output's name, None for another name."""
    if not (name.startswith("ray-") and name.endswith(".log")):
        return None
    stem = name[len("ray-"): -len(".log")]
    hosted = stem.endswith("-hosted")
    stem = stem.removesuffix("-hosted") if hosted else stem
    rest, _, role = stem.rpartition("-")
    job, _, node = rest.partition("-")
    if role not in JOB_ROLES or not is_job_id(job) or not node:
        return None
    return job, node, role, hosted


def detached_log(session: P) -> P:
    return log_dir(session) / DETACHED_LOG


# ---------------------------------------------------------------- SSH mode
def remote_dir(session: P) -> P:
    return session / REMOTE_DIR


def supervisor_lock_file(session: P) -> P:
    return remote_dir(session) / SUPERVISOR_LOCK


def supervisor_pid_file(session: P) -> P:
    return remote_dir(session) / SUPERVISOR_PID


def stop_marker(session: P) -> P:
    return remote_dir(session) / STOP_MARKER


def last_call_file(session: P) -> P:
    return remote_dir(session) / LAST_CALL


def payloads_dir(session: P) -> P:
    return session / PAYLOADS_DIR


def payload_file(session: P, digest: str, name: str) -> P:
    """An uploaded payload: ``payloads/<digest>-<name>`` (its content's digest, its own file name)."""
    return payloads_dir(session) / f"{digest}-{name}"


# ---------------------------------------------------------------- Dagster
def pipes_dir(session: P) -> P:
    return session / PIPES_DIR


def pipes_file(session: P, step: str, call_id: str) -> P:
    """A payload's Pipes message file: ``pipes/<step>-<id>.jsonl`` (a new id for every call)."""
    return pipes_dir(session) / f"{step}-{call_id}.jsonl"


# ---------------------------------------------------------------- the local scheduler
def local_scheduler_dir(session: P) -> P:
    return session / LOCAL_SCHEDULER_DIR


# ---------------------------------------------------------------- the demo
def demo_commits_file(session: P) -> P:
    """What ``elastic-ray demo``'s payload committed, one unit a line."""
    return session / DEMO_COMMITS


def demo_payload_log(session: P) -> P:
    """``elastic-ray demo``'s payload output."""
    return session / DEMO_PAYLOAD_LOG


# ---------------------------------------------------------------- beside the directory
def creation_lock_file(session: P) -> P:
    """``<session>.lock``, beside the directory: held while the session is opened or created."""
    return session.parent / f"{session.name}.lock"


def ended_marker(session: P) -> P:
    """``<session>.ended``, beside the directory: Dagster's orphan verdict."""
    return session.parent / f"{session.name}.ended"


# ---------------------------------------------------------------- the event log
def events_file(session: P) -> P:
    return session / EVENTS_FILE


def events_rotated_file(session: P) -> P:
    return session / EVENTS_ROTATED


def timeline_page(session: P) -> P:
    return session / TIMELINE_PAGE


# ---------------------------------------------------------------- the autoscaler
def autoscale_file(session: P) -> P:
    return session / AUTOSCALE_FILE


def autoscale_state_file(session: P) -> P:
    return session / AUTOSCALE_STATE


# ---------------------------------------------------------------- the description
@dataclass(frozen=True)
class Entry:
    """One kind of file of a session directory.

    ``paths``: its name patterns, relative to the directory (``<x>`` a part
    that varies, ``[...]`` an optional part; a trailing ``/`` a folder);
    ``beside``: the file sits next to the directory, not in it.
    """

    paths: tuple[str, ...]
    holds: str
    written_by: str
    read_by: str
    beside: bool = False

    @property
    def path(self) -> str:
        return ", ".join(self.paths)

    def matches(self, relative: str) -> bool:
        """Whether a path relative to the session directory (or, beside it, a name) is one of this entry's."""
        return any(_pattern(p).fullmatch(relative) for p in self.paths)


def _pattern(pattern: str) -> re.Pattern[str]:
    out = []
    folder = pattern.endswith("/")
    for token in re.split(r"(<[a-z]+>|\[|\])", pattern.rstrip("/")):
        if token.startswith("<") and token.endswith(">"):
            out.append(r"[^/]+")
        elif token == "[":
            out.append("(?:")
        elif token == "]":
            out.append(")?")
        elif token:
            out.append(re.escape(token))
    if folder:
        out.append(r"(?:/[^/]+)*")    # a folder: it and everything in it
    return re.compile("".join(out))


_LOCK = "(a lock: its holders)"
_CREATE = "coordinator (`Session.create`, through `SessionDir.create`)"
_COMMIT = "the generation commit (`protocol/disk/generations`)"
_ANSWERS = "coordinator (`coordinator/allocations/answers`)"
_DETACHED = "coordinator (`coordinator/detached`)"
_DETACHED_RUN = "coordinator (`coordinator/detached_run`)"
_PUBLISHING = "`agent/head/publishing`"

#: Every kind of file of a session directory, in the order of the tables.
ENTRIES: tuple[Entry, ...] = (
    Entry((SESSION_FILE,),
          "the session's settings (SessionInfo): session id, Slurm job name, scheduler, head shape, layout, "
          "launcher, the creator's ELASTIC_AGENT_* settings (every job's nodes get them), protocol version; "
          "written once and last, so a directory with it is a complete session",
          _CREATE,
          "every process of the run; Dagster's sensor and the SSH server take a directory with one for a session"),
    Entry((ALLOCATION_FILE,),
          "the mutable record (AllocationRecord): head job, worker allocations (each with how it ended unasked, "
          "its resubmit wish and replacement), predecessors, election claim, the autoscaler's lease, successor; a "
          "copy of the newest generation file, which it may lag",
          "coordinator, by compare-and-swap (`SessionDir.update_allocation`, `protocol/disk/generations`); a "
          "restore (`protocol/disk/allocation_repair`)",
          "coordinator, CLI (`session status`, `session repair`), the SSH server"),
    Entry((BACKUP_FILE,),
          "a copy of the last good record, rewritten after every commit (it lags when that write failed)",
          _COMMIT,
          "`protocol/disk/allocation_repair` (a restore source; the job ids a teardown learns without the record)"),
    Entry((f"{GENERATION_DIR}/<n>.json",),
          "the record of generation n, created once by hard link: the commit point; the newest 32 are kept",
          _COMMIT,
          "every reader of allocation.json (it moves on to the newest); `protocol/disk/recovery` (the names say "
          "which generations were committed)"),
    Entry((ALLOCATION_LOCK,),
          "flocked by the writers of allocation.json (a fast path: correctness rests on the generation files) "
          "and by a restore",
          "`protocol/disk/session_dir`", _LOCK),
    Entry((f"{ALLOCATION_FILE}.corrupt-<time>[.<n>]", f"{GENERATION_DIR}.<generation>.corrupt-<time>[.<n>]"),
          "a damaged record set aside by a restore, never deleted",
          "`protocol/disk/allocation_repair`", "people"),
    Entry((RAY_HEAD_FILE,),
          "the current head's Slurm job id, a bare integer; agents follow it",
          "coordinator (an election; `coordinator/head/headwatch` puts a damaged one back from the record)",
          "agents (`agent/head/following`, `agent/head/node_gone`), coordinator, CLI, `protocol/disk/recovery` "
          "(evidence)"),
    Entry((SECRET_FILE,),
          "32 random bytes, the control channel key (0600; the directory is 0700)",
          _CREATE,
          "agents and coordinator (the control channel; the Ray token is derived from it)"),
    Entry((RAY_TOKEN_FILE,),
          "Ray's auth token, derived from the secret (0600; see `ray_auth`)",
          "the first process that starts Ray or a driver (`SessionDir.ensure_ray_token`: agents, coordinator)",
          "Ray nodes and drivers, through `RAY_AUTH_TOKEN_PATH`"),
    Entry((EVENTS_FILE, EVENTS_ROTATED),
          "the run's history, one Event a line (versioned on its own, 1): submitted, pending, started, joined, "
          "left, drained, removed, failed, elections, head moves, standbys; the current file is moved to the "
          "`.1` name when it passes its size bound, so the two hold the newest events",
          "every process of the run, by one locked append a line (`protocol/disk/event_log`)",
          "CLI (`session events`, `session timeline`, `session usage`), Dagster (run metadata), the SSH "
          "server (`usage`, the same figures for Dagster in the SSH mode)"),
    Entry((TIMELINE_PAGE,),
          "the run's timeline as one self-contained page, drawn from the event log (`history/timeline`)",
          "`history/summary`, after each `compute.run` when the timeline extra is installed: in Dagster (cluster "
          "mode) or in the SSH server's `usage` (SSH mode); the demo",
          "people (Dagster's metadata links it, or names it on the cluster)"),
    Entry((AUTOSCALE_FILE,),
          "the autoscaler's policy (AutoscalePolicy, versioned on its own, 1), or none: the session does not "
          "scale by itself",
          "coordinator (`Session.autoscale`; a teardown clears it; both through `coordinator/scaling/store`)",
          "the process holding the autoscaler's lease (`coordinator/scaling/runner`), CLI (`session status`)"),
    Entry((AUTOSCALE_STATE,),
          "what the autoscaler holding the lease keeps (versioned on its own, 1): the jobs it submitted and for "
          "which pool, Slurm's start estimates, its last turn, notes and decisions",
          "the process holding the autoscaler's lease (`coordinator/scaling/runner`), alone",
          "the next lease holder, CLI (`session status`)"),
    Entry((f"{JOBS_DIR}/<job>/{HEAD_ENDPOINT_FILE}",),
          "a ready head's endpoint (HeadEndpoint): GCS address, heartbeat and control ports, Ray version",
          f"the agent that serves the head ({_PUBLISHING}: a head allocation's first node, or the hosting first "
          "node of a worker allocation)",
          "agents (following, `mark_dead`, rejoin order), coordinator, CLI, `protocol/disk/head_agent`, "
          "`protocol/disk/recovery` (evidence)"),
    Entry((f"{JOBS_DIR}/<job>/{NODES_DIR}/<node>.json",),
          "one agent's published state (NodeState): state, reason, Ray node id, control endpoint, hosted head",
          f"that node's agent ({_PUBLISHING})",
          "coordinator (waits, lost nodes), agents (rejoin order), `protocol/disk/head_agent`, CLI"),
    Entry((f"{SPECS_DIR}/worker-<id>.json",),
          "a worker allocation's resolved config (and `\"host_head\": true` for the run's first allocation in the "
          "default layout), written before it is submitted",
          "coordinator (`coordinator/allocations/submit`; `session render` names dry-run ones and writes none)",
          "agents (`--spec`)"),
    Entry((ANSWER_FILE,),
          "the last scheduler answer any process of the run got, with the time it was asked; versioned on its "
          "own (1), a newer or damaged one is ignored",
          f"{_ANSWERS}, by whichever process asked",
          "coordinator processes (waits, watches, the detached supervisor), CLI (`session status`)"),
    Entry((ANSWER_LOCK,),
          "flocked by the one process that asks when the stored answer is too old",
          _ANSWERS, _LOCK),
    Entry((f"{LOGS_DIR}/agent-<job>-<node>.log",),
          "an agent's log, one event per line",
          "the agent (`agent/cli`)", "people, benches, tests"),
    Entry(tuple(f"{LOGS_DIR}/{role}-<job>.out" for role in JOB_ROLES),
          "a job's output: its batch script and every agent's stderr",
          "the scheduler, at the path submission gives it (`coordinator/allocations/submit`: "
          "`--output=<session>/logs/<role>-%j.out`)",
          "coordinator (an error shows its end), `protocol/disk/allocation_repair` (a teardown learns job ids "
          "from the names), people"),
    Entry((f"{LOGS_DIR}/ray-<job>-<node>-<role>[-hosted].log",),
          "the output of one `ray start`",
          "the agent (`agent/node/local_ray`)",
          "the agent (`agent/node/ray_node`: start-up finished, the node id), people"),
    Entry((f"{LOGS_DIR}/{DETACHED_LOG}",),
          "the detached supervisor's output (SSH mode)", _DETACHED, "people"),
    Entry((f"{REMOTE_DIR}/{SUPERVISOR_LOCK}",),
          "held by the detached supervisor for its whole life: one per session",
          _DETACHED_RUN, "coordinator (`coordinator/detached`: whether one runs)"),
    Entry((f"{REMOTE_DIR}/{SUPERVISOR_PID}",),
          "`<pid> <host>` of the detached supervisor",
          _DETACHED_RUN, "coordinator (`coordinator/detached`: signal it on its own host only)"),
    Entry((f"{REMOTE_DIR}/{STOP_MARKER}",),
          "the marker a teardown leaves so that the detached supervisor ends",
          "coordinator (`coordinator/detached`, from every teardown)", _DETACHED_RUN),
    Entry((f"{REMOTE_DIR}/{LAST_CALL}",),
          "the time of the last SSH call (the abandonment clock)",
          "the SSH server (`remote/server`, through `coordinator/detached`)", _DETACHED_RUN),
    Entry((f"{PAYLOADS_DIR}/<digest>-<name>",),
          "a payload file uploaded for a step (SSH mode with Dagster)",
          "the SSH server (`put_file`), for `dagster/ssh_mode`", "the payload's driver on the head"),
    Entry((f"{PIPES_DIR}/<step>-<id>.jsonl",),
          "a payload's Dagster Pipes messages",
          "the payload (`dagster_pipes` in the driver); Dagster or the SSH server makes the folder",
          "Dagster (`dagster/pipes`), or the SSH server, which relays them"),
    Entry((f"{LOCAL_SCHEDULER_DIR}/",),
          "the local scheduler's state (its jobs, its log), unless the session was given another place "
          "(`local_state_dir`)",
          "`scheduler/local`", "`scheduler/local`"),
    Entry(("<name>-<role>-<time>-<random>.sbatch",),
          "a batch script as it was submitted, kept for whoever wants to see what ran (0600: it may carry the "
          "launcher's environment)",
          "the Slurm scheduler (`scheduler/slurm`: in the job's workdir, the session directory; the name is "
          "`scheduler/slurm_parse.script_name_prefix`'s)",
          "people (sbatch reads it once)"),
    Entry((DEMO_COMMITS, DEMO_PAYLOAD_LOG),
          "`elastic-ray demo` only: the units its payload committed, and the payload's output",
          "the demo (`demo/main_demo`, its payload `demo/payload`)", "the demo (`demo/main_demo`)"),
    Entry((".<name>.<random>.tmp", f"{FS_CHECK_PREFIX}<random>"),
          "a write in progress (`atomic`, the generation commit), the filesystem check of `SessionDir.create`; "
          "removed by its writer",
          "`atomic`, `protocol/disk/generations`, `protocol/disk/session_dir`", "nobody"),
    Entry(("<session>.lock",),
          "taken while the session is opened or created, so that first callers racing each other create it once",
          "the SSH server, Dagster (`dagster/run_session`)", _LOCK, beside=True),
    Entry(("<session>.ended",),
          "Dagster's orphan verdict: the run ended and its session was dealt with",
          "Dagster (`dagster/sensor`)", "Dagster (`dagster/sensor`; `dagster/run_session` removes it on reopen)",
          beside=True),
)


def describe(relative: str | PurePath, *, beside: bool = False) -> Entry | None:
    """The entry that describes a file, by its path relative to the session directory
    (``beside``: by its name next to the directory, ``<session>`` standing for the directory's name)."""
    text = str(relative)
    for entry in ENTRIES:
        if entry.beside == beside and entry.matches(text):
            return entry
    return None


# ---------------------------------------------------------------- the two renderings
_PATH_WIDTH = 32
_TEXT_WIDTH = 112


def render_text(entries: Iterable[Entry] = ENTRIES) -> str:
    """The layout as a plain-text tree (this module's docstring shows it)."""
    entries = tuple(entries)
    lines: list[str] = []
    pad = " " * _PATH_WIDTH
    for beside in (False, True):
        chosen = [e for e in entries if e.beside == beside]
        if not chosen:
            continue
        lines.append("beside <session>/" if beside else "<session>/")
        for e in chosen:
            head = "  " + e.path
            body = [*textwrap.wrap(e.holds, _TEXT_WIDTH - _PATH_WIDTH),
                    *textwrap.wrap(f"written by: {e.written_by}", _TEXT_WIDTH - _PATH_WIDTH),
                    *textwrap.wrap(f"read by: {e.read_by}", _TEXT_WIDTH - _PATH_WIDTH)]
            if len(head) <= _PATH_WIDTH - 2:
                lines.append(head.ljust(_PATH_WIDTH) + body[0])
                body = body[1:]
            else:
                lines.append(head)
            lines += [pad + line for line in body]
    return "\n".join(lines)


def render_markdown(entries: Iterable[Entry] = ENTRIES) -> str:
    """The layout as a Markdown table (docs/architecture.md, "The session directory", shows it)."""
    rows = ["| path | holds | written by | read by |", "|---|---|---|---|"]
    for e in entries:
        path = ", ".join(f"`{p}`" for p in e.paths) + (" (beside the directory)" if e.beside else "")
        rows.append(f"| {path} | {e.holds} | {e.written_by} | {e.read_by} |")
    return "\n".join(rows)


__all__ = [
    "SESSION_FILE", "ALLOCATION_FILE", "BACKUP_FILE", "GENERATION_DIR", "ALLOCATION_LOCK", "RAY_HEAD_FILE",
    "SECRET_FILE", "RAY_TOKEN_FILE", "JOBS_DIR", "HEAD_ENDPOINT_FILE", "NODES_DIR", "SPECS_DIR", "ANSWER_FILE",
    "ANSWER_LOCK", "LOGS_DIR", "DETACHED_LOG", "REMOTE_DIR", "SUPERVISOR_LOCK", "SUPERVISOR_PID", "STOP_MARKER",
    "LAST_CALL", "PAYLOADS_DIR", "PIPES_DIR", "LOCAL_SCHEDULER_DIR", "DEMO_COMMITS", "DEMO_PAYLOAD_LOG",
    "EVENTS_FILE", "EVENTS_ROTATED", "TIMELINE_PAGE", "AUTOSCALE_FILE", "AUTOSCALE_STATE", "CREATED_DIRS", "JOB_ROLES", "GENERATION_TMP_PREFIX", "TMP_SUFFIX", "FS_CHECK_PREFIX", "FS_CHECK_LINK_SUFFIX",
    "session_file", "allocation_file", "backup_file", "generation_dir", "generation_name", "generation_of",
    "generation_file", "allocation_lock_file", "generation_aside_stem", "corrupt_copy", "ray_head_file",
    "secret_file", "ray_token_file", "jobs_dir", "job_dir", "job_of_dir", "head_endpoint_file", "nodes_dir",
    "check_node_name", "node_state_file", "node_of", "specs_dir", "worker_spec_name", "worker_spec_file",
    "worker_spec_id", "answer_file", "answer_lock_file", "log_dir", "agent_log_name", "agent_log",
    "parse_agent_log_name", "job_output_template", "job_output_name", "job_output", "parse_job_output_name",
    "ray_log_name", "ray_log", "parse_ray_log_name", "detached_log", "remote_dir", "supervisor_lock_file",
    "supervisor_pid_file", "stop_marker", "last_call_file", "payloads_dir", "payload_file", "pipes_dir",
    "pipes_file", "local_scheduler_dir", "demo_commits_file", "demo_payload_log", "creation_lock_file",
    "ended_marker", "events_file", "events_rotated_file", "timeline_page", "autoscale_file", "autoscale_state_file", "Entry", "ENTRIES", "describe", "render_text", "render_markdown"
]
