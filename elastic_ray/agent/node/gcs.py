"""The agent's view of the GCS, through short-lived probe processes.

The agent never imports Ray (75 MB of RSS it would keep for days). Each call
here runs ``python -m elastic_ray.agent.node.gcs_probe`` (see that module), with a
hard wall-clock timeout: a GCS that is gone can block a Ray client for tens of
seconds, and the probe is then killed by its PID (our own unreaped child, so
the PID cannot have been reused). The answer is parsed strictly: exactly one
JSON object on stdout, of the op we asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Defined in errors (its docstring says why); ``X as X`` keeps it importable from here, for type checkers too.
from ...errors import ProbeError as ProbeError
from . import simulation

#: Time a probe needs before its first RPC (interpreter start + ``import ray``,
#: about 0.6-1 s here); the probe's own RPC budget is the timeout minus this,
#: so it normally reports a dead GCS itself before it has to be killed.
STARTUP_ALLOWANCE = 1.5
_STDERR_TAIL = 2000
_PROBE_MODULE = "elastic_ray.agent.node.gcs_probe"


def probe_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of a probe: the agent's, plus ``extra`` (RAY_AUTH_MODE and
    the launcher's env, so a token-auth cluster accepts the probe)."""
    env = dict(os.environ if base is None else base)
    env.pop("RAY_ADDRESS", None)
    env.update(extra or {})
    return env


def probe_argv(op: str, args: Sequence[str], inner_timeout: float) -> list[str]:
    return [sys.executable, "-m", _PROBE_MODULE, op, *args, f"--timeout={inner_timeout:g}"]


def parse_answer(op: str, stdout: str, stderr: str, returncode: int) -> dict[str, Any]:
    """Validate a probe's output; return the payload or raise :class:`ProbeError`."""
    tail = stderr[-_STDERR_TAIL:]
    lines = stdout.splitlines()
    if len(lines) != 1:
        raise ProbeError(op, "malformed", f"expected one line on stdout, got {len(lines)} (rc={returncode})",
                         returncode=returncode, stderr_tail=tail)
    try:
        payload = json.loads(lines[0])
    except ValueError as exc:
        raise ProbeError(op, "malformed", f"stdout is not JSON: {exc}", returncode=returncode,
                         stderr_tail=tail) from None
    if not isinstance(payload, dict) or not isinstance(payload.get("ok"), bool) or payload.get("op") != op:
        raise ProbeError(op, "malformed", f"unexpected answer {lines[0][:200]!r}", returncode=returncode,
                         stderr_tail=tail)
    if payload["ok"] != (returncode == 0):
        raise ProbeError(op, "malformed", f"ok={payload['ok']} with exit code {returncode}",
                         returncode=returncode, stderr_tail=tail)
    if not payload["ok"]:
        raise ProbeError(op, str(payload.get("error") or "error"), str(payload.get("message") or ""),
                         returncode=returncode, stderr_tail=tail)
    return payload


def run_probe(op: str, args: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None,
              argv_prefix: Sequence[str] | None = None) -> dict[str, Any]:
    """Run one probe op and return its answer (``ok`` is True).

    ``timeout`` bounds the whole call, interpreter start included; when it
    expires the probe is SIGKILLed and ``ProbeError(kind="timeout")`` raised.
    ``argv_prefix`` replaces ``python -m elastic_ray.agent.node.gcs_probe`` (tests);
    without it, ``$ELASTIC_RAY_GCS_PROBE`` does (simulations, see :mod:`.simulation`).
    """
    if timeout <= 0:
        raise ValueError(f"timeout={timeout!r}: must be > 0")
    inner = max(1.0, timeout - STARTUP_ALLOWANCE)
    if argv_prefix is None:
        argv_prefix = simulation.gcs_probe_argv()
    argv = ([*argv_prefix, op, *args, f"--timeout={inner:g}"] if argv_prefix is not None
            else probe_argv(op, args, inner))
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=probe_env(env), close_fds=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()               # our own child, not yet reaped: the PID is still ours
        stdout, stderr = proc.communicate()
        raise ProbeError(op, "timeout", f"no answer within {timeout:g} s (probe killed)",
                         returncode=proc.returncode, stderr_tail=stderr.decode(errors="replace")[-_STDERR_TAIL:])
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return parse_answer(op, stdout.decode(errors="replace"), stderr.decode(errors="replace"), proc.returncode)


# --------------------------------------------------------------------------
# Typed helpers.

@dataclass(frozen=True)
class NodeRecord:
    """One node as the GCS reports it (see ``gcs_probe._node_record``)."""

    node_id: str
    state: str                         # "ALIVE" | "DEAD"
    node_manager_address: str
    node_manager_port: int
    raylet_socket_name: str
    node_name: str
    is_head_node: bool
    start_time_ms: int
    end_time_ms: int
    resources_total: dict[str, float]
    labels: dict[str, str]
    death_reason: int | None           # NodeDeathInfo.Reason: 1 expected, 2 unexpected, 3 drain-preempted, 4 drain-idle
    death_reason_name: str | None
    death_message: str | None
    draining: bool
    drain_deadline_ms: int | None

    @property
    def alive(self) -> bool:
        return self.state == "ALIVE"

    @classmethod
    def from_dict(cls, data: Any) -> "NodeRecord":
        if not isinstance(data, dict):
            raise ValueError(f"node record must be an object, got {type(data).__name__}")
        types: dict[str, tuple[type, ...]] = {
            "node_id": (str,), "state": (str,), "node_manager_address": (str,), "node_manager_port": (int,),
            "raylet_socket_name": (str,), "node_name": (str,), "is_head_node": (bool,),
            "start_time_ms": (int,), "end_time_ms": (int,), "resources_total": (dict,), "labels": (dict,),
            "death_reason": (int, type(None)), "death_reason_name": (str, type(None)),
            "death_message": (str, type(None)), "draining": (bool,), "drain_deadline_ms": (int, type(None)),
        }
        values = {}
        for name, allowed in types.items():
            if name not in data:
                raise ValueError(f"node record lacks {name!r}")
            value = data[name]
            if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
                raise ValueError(f"node record field {name!r} has type {type(value).__name__}")
            values[name] = value
        values["resources_total"] = {str(k): float(v) for k, v in values["resources_total"].items()}
        values["labels"] = {str(k): str(v) for k, v in values["labels"].items()}
        return cls(**values)


@dataclass(frozen=True)
class DrainResult:
    accepted: bool
    message: str


def _node(op: str, data: Any) -> NodeRecord:
    try:
        return NodeRecord.from_dict(data)
    except ValueError as exc:
        raise ProbeError(op, "malformed", str(exc)) from None


def gcs_ready(address: str, timeout: float = 10.0, *, env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The GCS's cluster id and session name if it answers in time, else None."""
    try:
        answer = run_probe("ready", [f"--address={address}"], timeout, env=env)
    except ProbeError as exc:
        if exc.kind in ("timeout", "unreachable"):
            return None
        raise
    return {"cluster_id": answer.get("cluster_id"), "session_name": answer.get("session_name")}


def list_nodes(address: str, timeout: float = 10.0, *, env: Mapping[str, str] | None = None) -> list[NodeRecord]:
    answer = run_probe("nodes", [f"--address={address}"], timeout, env=env)
    nodes = answer.get("nodes")
    if not isinstance(nodes, list):
        raise ProbeError("nodes", "malformed", "'nodes' is not a list")
    return [_node("nodes", n) for n in nodes]


def own_node(address: str, temp_dir: str, timeout: float = 10.0, *, session_dir: str | None = None,
             env: Mapping[str, str] | None = None) -> NodeRecord | None:
    """The ALIVE node whose raylet socket lives under ``temp_dir`` (or ``session_dir``)."""
    args = [f"--address={address}", f"--temp-dir={temp_dir}"]
    if session_dir:
        args.append(f"--session-dir={session_dir}")
    answer = run_probe("own-node", args, timeout, env=env)
    node = answer.get("node")
    return None if node is None else _node("own-node", node)


def own_node_id(address: str, temp_dir: str, timeout: float = 10.0, *, session_dir: str | None = None,
                env: Mapping[str, str] | None = None) -> str | None:
    node = own_node(address, temp_dir, timeout, session_dir=session_dir, env=env)
    return None if node is None else node.node_id


def drain_node(address: str, node_id: str, *, reason: str, message: str, deadline_ms: int = 0,
               timeout: float = 10.0, env: Mapping[str, str] | None = None) -> DrainResult:
    """Ask the GCS to drain ``node_id`` (``reason``: ``preemption`` or ``idle``).

    ``deadline_ms`` is an absolute Unix time in ms (0: none); Ray only
    reports it, the caller enforces it. An ``idle`` drain of a busy node is
    rejected (``accepted`` False); ``preemption`` is not rejectable.
    """
    answer = run_probe("drain", [f"--address={address}", f"--node-id={node_id}", f"--reason={reason}",
                                 f"--message={message}", f"--deadline-ms={int(deadline_ms)}"], timeout, env=env)
    if not isinstance(answer.get("accepted"), bool):
        raise ProbeError("drain", "malformed", "'accepted' is not a bool")
    return DrainResult(accepted=answer["accepted"], message=str(answer.get("message") or ""))


def node_alive(address: str, node_id: str, timeout: float = 10.0, *, env: Mapping[str, str] | None = None) -> bool:
    answer = run_probe("alive", [f"--address={address}", f"--node-id={node_id}"], timeout, env=env)
    if not isinstance(answer.get("alive"), bool):
        raise ProbeError("alive", "malformed", "'alive' is not a bool")
    return answer["alive"]


@dataclass(frozen=True)
class MarkDeadResult:
    """What ``mark-dead`` did: ``marked`` were ALIVE and are DEAD now;
    ``already_dead`` were not ALIVE (or unknown to this GCS); ``still_alive``
    survived the request (should not happen; reported, not hidden)."""

    marked: tuple[str, ...]
    already_dead: tuple[str, ...]
    still_alive: tuple[str, ...]


def mark_nodes_dead(address: str, node_ids: Sequence[str], *, message: str, timeout: float = 10.0,
                    env: Mapping[str, str] | None = None) -> MarkDeadResult:
    """Tell the GCS at once that ``node_ids`` are gone (see ``gcs_probe`` ``mark-dead``)."""
    if not node_ids:
        return MarkDeadResult((), (), ())
    answer = run_probe("mark-dead", [f"--address={address}", f"--node-ids={','.join(node_ids)}",
                                     f"--message={message}"], timeout, env=env)
    lists = {}
    for key in ("marked", "already_dead", "still_alive"):
        value = answer.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ProbeError("mark-dead", "malformed", f"{key!r} is not a list of node ids")
        lists[key] = tuple(value)
    return MarkDeadResult(**lists)
